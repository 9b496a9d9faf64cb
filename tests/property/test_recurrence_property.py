"""Property tests of recurring fire times (schedd.core.recurrence), on virtual time.

1. Iterating ``next_occurrence`` gives strictly increasing, unique scheduled times whose local
   wall-clock times match the cron (or are documented DST shifts/skips/repeats), and
   ``occurrences()`` gives the same list.
2. Around every DST transition of the zones in 2026–2027, the occurrences equal a brute-force
   oracle that walks every UTC minute (independent of the implementation's approach).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.core.model import DstGap, DstRepeat
from schedd.core.recurrence import Occurrence, Recurrence, next_occurrence, occurrences

MIN = 60_000
HOUR = 60 * MIN
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/St_Johns",
]
CRONS = [
    "*/7 * * * *",
    "30 * * * *",
    "0 * * * *",
    "0 2 * * *",
    "30 2 * * *",
    "45 1 * * *",
    "15,45 1-3 * * *",
    "*/20 1,2 * * *",
    "0 */3 * * *",
    "0 0 * * 0",
    "0 12 * * 1-5",
    "0 0 1 * *",
    "10 1 * * *",
    "50 0 * * *",
    "@daily",
    "@hourly",
]
SECOND_CRONS = ["*/10 2 * * * 0,30", "30 1 * * * 15", "0 */6 * * * 59"]
START = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
END = int(datetime(2028, 1, 1, tzinfo=UTC).timestamp() * 1000)


def aware(ms: int, zone: ZoneInfo) -> datetime:
    return (EPOCH + timedelta(milliseconds=ms)).astimezone(zone)


def offset_ms(ms: int, zone: ZoneInfo) -> int:
    off = aware(ms, zone).utcoffset()
    assert off is not None
    return off // timedelta(milliseconds=1)


def _transitions(name: str) -> list[int]:
    """The UTC instants (ms, on whole minutes) where the zone's offset changes in 2026–2027."""
    zone = ZoneInfo(name)
    out: list[int] = []
    prev = offset_ms(START, zone)
    for hour in range(START + HOUR, END, HOUR):
        cur = offset_ms(hour, zone)
        if cur != prev:
            minute = hour - HOUR
            while offset_ms(minute, zone) == prev:
                minute += MIN
            out.append(minute)
        prev = cur
    return out


TRANSITIONS = {name: _transitions(name) for name in ZONES}


def test_the_zone_list_has_the_transitions_we_expect() -> None:
    assert TRANSITIONS["UTC"] == [] and TRANSITIONS["Asia/Kolkata"] == []
    for name in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/St_Johns"):
        assert len(TRANSITIONS[name]) == 4, name


def policies() -> st.SearchStrategy[tuple[DstGap, DstRepeat]]:
    return st.tuples(st.sampled_from(list(DstGap)), st.sampled_from(list(DstRepeat)))


@st.composite
def starts(draw: st.DrawFn, zone: str) -> int:
    """A start time in 2026–2027, often a few hours before a transition of the zone."""
    near = TRANSITIONS[zone]
    close: bool = draw(st.booleans())
    if near and close:
        return draw(st.sampled_from(near)) + draw(st.integers(-6 * HOUR, 2 * HOUR))
    return draw(st.integers(START, END))


@st.composite
def cases(draw: st.DrawFn) -> tuple[Recurrence, int]:
    zone = draw(st.sampled_from(ZONES))
    cron = draw(st.sampled_from(CRONS + SECOND_CRONS))
    gap, repeat = draw(policies())
    jitter = draw(st.sampled_from([0, 1, 1000, 5 * MIN]))
    rec = Recurrence(cron=cron, timezone=zone, dst_gap=gap, dst_repeat=repeat, jitter_ms=jitter)
    return rec, draw(starts(zone))


def check_occurrence(rec: Recurrence, occ: Occurrence, zone: ZoneInfo) -> None:
    assert rec.cron is not None
    here = aware(occ.scheduled_ms, zone)
    local = here.replace(tzinfo=None, fold=0)
    if occ.skipped is not None or occ.note == "dst_shifted":
        # at the end of a gap: the offset grows right here, and the cron matches a nonexistent
        # local time inside the gap (but not the reading right after it, which would win)
        assert occ.skipped in (None, "dst_gap")
        assert (occ.skipped is not None) == (rec.dst_gap is DstGap.SKIP)
        before = offset_ms(occ.scheduled_ms - 1, zone)
        after = offset_ms(occ.scheduled_ms, zone)
        assert after > before
        gap_start = local - timedelta(milliseconds=after - before)
        first = croniter(rec.cron, gap_start - timedelta(seconds=1)).get_next(datetime)
        assert gap_start <= first < local
        assert not _matches(*_matcher(rec.cron), local)
        assert occ.due_ms == occ.scheduled_ms if occ.skipped else occ.due_ms >= occ.scheduled_ms
        return
    assert _matches(*_matcher(rec.cron), local), (local, rec)
    if occ.note == "dst_repeat":
        assert rec.dst_repeat is DstRepeat.BOTH and here.fold == 1
    else:
        assert occ.note is None and here.fold == 0
    assert occ.scheduled_ms <= occ.due_ms < occ.scheduled_ms + max(rec.jitter_ms, 1)


@settings(max_examples=100, deadline=None)
@given(cases())
def test_iterating_is_strictly_increasing_and_matches_the_cron(
    case: tuple[Recurrence, int],
) -> None:
    rec, start = case
    zone = ZoneInfo(rec.timezone)
    got: list[Occurrence] = []
    cursor = start
    for _ in range(200):
        occ = next_occurrence(rec, cursor, "job-p")
        assert occ is not None
        assert occ.scheduled_ms > cursor
        check_occurrence(rec, occ, zone)
        got.append(occ)
        cursor = occ.scheduled_ms
    times = [o.scheduled_ms for o in got]
    assert times == sorted(set(times))
    assert occurrences(rec, start, times[-1], "job-p", 10_000) == got


# --------------------------------------------------------------------------------------------
# Oracle: every UTC minute of a window around a transition


@cache
def _matcher(cron: str) -> tuple[list[set[int] | None], bool]:
    """The cron's fields as sets (``None`` for ``*``) and whether days match by OR."""
    fields, _ = croniter.expand(cron)
    sets: list[set[int] | None] = [None if f == ["*"] else {int(v) for v in f} for f in fields]
    if len(sets) == 5:
        sets.append({0})  # seconds
    return sets, sets[2] is not None and sets[4] is not None


def _matches(sets: list[set[int] | None], day_or: bool, t: datetime) -> bool:
    """A plain reimplementation of cron matching, much faster than ``croniter.match``."""
    minute, hour, dom, month, dow, second = sets

    def ok(s: set[int] | None, v: int) -> bool:
        return s is None or v in s

    if not (
        ok(second, t.second) and ok(minute, t.minute) and ok(hour, t.hour) and ok(month, t.month)
    ):
        return False
    weekday = (t.weekday() + 1) % 7  # cron: 0 = Sunday
    if day_or:
        return ok(dom, t.day) or ok(dow, weekday)
    return ok(dom, t.day) and ok(dow, weekday)


def test_the_fast_matcher_agrees_with_croniter() -> None:
    start = datetime(2026, 2, 25)  # noqa: DTZ001 - a naive wall-clock reading
    for cron in CRONS + SECOND_CRONS + ["0 0 13 * 5"]:
        sets, day_or = _matcher(cron)
        it = croniter(cron, start)
        prev = start
        for _ in range(80):
            match = it.get_next(datetime)
            assert _matches(sets, day_or, match), (cron, match)
            # nothing in between matches: probe just after the previous match and just before
            for probe in (
                prev + timedelta(seconds=1),
                prev + timedelta(minutes=1),
                match - timedelta(seconds=1),
                match - timedelta(minutes=1),
            ):
                if prev < probe < match:
                    assert not _matches(sets, day_or, probe), (cron, probe)
            prev = match


def oracle(rec: Recurrence, lo: int, hi: int) -> list[tuple[int, str | None, str | None]]:
    """(scheduled_ms, note, skipped) for lo < scheduled_ms <= hi (lo, hi on whole minutes)."""
    assert rec.cron is not None
    zone = ZoneInfo(rec.timezone)
    sets, day_or = _matcher(rec.cron)
    events: dict[int, tuple[str | None, str | None]] = {}
    prev_offset = offset_ms(lo, zone)
    for u in range(lo + MIN, hi + 1, MIN):
        here = aware(u, zone)
        offset = offset_ms(u, zone)
        if _matches(sets, day_or, here.replace(tzinfo=None)):
            if here.fold == 0:
                events[u] = (None, None)
            elif rec.dst_repeat is DstRepeat.BOTH:
                events[u] = ("dst_repeat", None)
        if offset > prev_offset and u not in events:  # a gap ends at u
            end = here.replace(tzinfo=None)
            t = end - timedelta(milliseconds=offset - prev_offset)
            while t < end and not _matches(sets, day_or, t):
                t += timedelta(minutes=1)
            if t < end:
                shift = rec.dst_gap is DstGap.SHIFT
                events[u] = ("dst_shifted", None) if shift else (None, "dst_gap")
        prev_offset = offset
    return sorted((ms, note, skipped) for ms, (note, skipped) in events.items())


@st.composite
def windows(draw: st.DrawFn) -> tuple[Recurrence, int, int]:
    zone = draw(st.sampled_from([z for z in ZONES if TRANSITIONS[z]]))
    center = draw(st.sampled_from(TRANSITIONS[zone]))
    # lo often inside the doubled hour (or just before the gap), where the search starts
    lo = center + draw(st.one_of(st.integers(-6 * 60, 0), st.integers(-90, 90))) * MIN
    hi = max(lo, center) + draw(st.integers(1, 6 * 60)) * MIN
    gap, repeat = draw(policies())
    cron = draw(st.sampled_from([c for c in CRONS if not c.startswith("@")]))
    return Recurrence(cron=cron, timezone=zone, dst_gap=gap, dst_repeat=repeat), lo, hi


@settings(max_examples=100, deadline=None)
@given(windows())
def test_occurrences_equal_a_minute_by_minute_oracle(case: tuple[Recurrence, int, int]) -> None:
    rec, lo, hi = case
    got = [(o.scheduled_ms, o.note, o.skipped) for o in occurrences(rec, lo, hi, "j", 10_000)]
    assert got == oracle(rec, lo, hi)
