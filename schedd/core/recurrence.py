"""Fire times of recurring jobs: ``every`` intervals and ``cron`` expressions in a time zone.

Pure: no clock, no randomness, no I/O beyond loading IANA zones (``zoneinfo``).  Every time is
an integer of Unix milliseconds (UTC) passed in by the caller; "now" is always an argument.

The user-facing semantics (these are the defaults users see in ``GET /jobs/{id}/explain``):

**Occurrences.**  An occurrence is identified by its ``scheduled_ms``, the nominal fire time in
UTC; the run id is ``<job_id>@<scheduled_ms>``.  The sequence of a schedule is strictly
increasing: the same ``scheduled_ms`` is never produced twice, whatever the zone and policy.
``due_ms`` is ``scheduled_ms`` plus the job's stable jitter (:func:`jitter_for`), what the
timing wheel waits for.  Jitter never changes the identity of an occurrence; a jitter larger
than the spacing of a cron can make ``due_ms`` later than the next ``scheduled_ms``.

**every.**  Pure UTC arithmetic: the fire times are ``anchor + k * every`` for ``k >= 0``,
where the anchor is ``start_at`` when given, else the submit time.  Daylight saving time never
stretches or shrinks an interval (``every: 1h`` is 3600 s apart across a DST change; the local
wall-clock reading shifts instead).  The anchor itself is an occurrence, so the first fire of a
job asked for "after the submit time" is one interval after it, while one with a ``start_at``
in the future fires at ``start_at``.

**cron.**  The expression (5 fields ``minute hour day-of-month month day-of-week``; 6 with
*seconds as the last field*, croniter's convention; or ``@yearly``/``@monthly``/``@weekly``/
``@daily``/``@midnight``/``@hourly``; when day-of-month and day-of-week are both restricted,
a day matches if either field does: the union of the two fields' days, ``#`` and ``L`` days of
week included, computed as the union of the two single-field schedules.  A field is restricted
when it is anything but ``*``, so ``*/2`` counts as restricted (classic cron would take a field
that starts with ``*`` as unrestricted and require both)) is evaluated on the *local wall clock* of ``timezone``: the
candidate local times are enumerated on naive datetimes, then each is placed in UTC with the
zone's rules:

* a local time that exists once is placed at that instant;
* a local time that does **not exist** (in the gap when the clocks jump forward, e.g. 02:30 on
  2026-03-29 in Europe/Berlin, found by round-tripping it through UTC) follows ``dst.gap``:

  - ``shift`` (default): it fires at the first valid instant after the gap, the transition
    instant (03:00 CEST in the example), with ``note="dst_shifted"``;
  - ``skip``: it does not run; the occurrence is still returned, at that same transition
    instant, with ``skipped="dst_gap"`` (and ``due_ms == scheduled_ms``) so that the caller
    can record a skipped run.

  All the nonexistent times of one gap land on the same instant, so they make *one*
  occurrence (listed once in ``explain``); when the cron also matches the wall-clock time right
  after the gap (03:00 for ``0 * * * *`` or ``*/15 * * * *``), that ordinary occurrence stands
  for them and nothing is shifted or skipped separately;
* a local time that **happens twice** (when the clocks fall back, e.g. 02:30 on 2026-10-25 in
  Europe/Berlin: once in CEST, once in CET) follows ``dst.repeat``:

  - ``first`` (default): it fires once, at its first occurrence (the earlier UTC instant);
  - ``both``: it fires at both, the second one with ``note="dst_repeat"``.

  So an hourly ``30 * * * *`` runs at 02:30 once with ``first`` (one hour of UTC without a run)
  and twice with ``both``; a ``*/15`` cron with ``both`` runs 02:00, 02:15, 02:30, 02:45 of the
  first pass, then the same four again in the second pass, in UTC order.

**Bounds.**  ``start_at`` and ``end_at`` bound the nominal times (``scheduled_ms``), both
inclusive; after ``end_at`` (or when a cron has no further match within croniter's 50-year
search) the schedule is over and :func:`next_occurrence` returns ``None``.

**Misfires** (:func:`plan_misfire`): occurrences that came due while no leader was scheduling
or while the job was paused.  ``skip`` runs none of them; ``run_once`` runs only the most recent
one; ``run_all`` runs them all in order.  ``catchup_window`` (when set) bounds both ``run_once``
and ``run_all``: an occurrence scheduled more than the window before now is never run late.
Every missed occurrence is either run or recorded as skipped, with the reason
``occurrence.skipped`` when it already has one (``dst_gap``) and ``"misfire"`` otherwise.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from schedd.core.model import (
    DstGap,
    DstRepeat,
    Misfire,
    RecurringOptions,
    Schedule,
    ScheduleKind,
)

__all__ = [
    "NOTE_DST_REPEAT",
    "NOTE_DST_SHIFTED",
    "SKIPPED_DST_GAP",
    "SKIPPED_MISFIRE",
    "MisfirePlan",
    "Occurrence",
    "Recurrence",
    "explain",
    "jitter_for",
    "next_occurrence",
    "occurrences",
    "plan_misfire",
    "recurrence_from",
]

NOTE_DST_SHIFTED: Final = "dst_shifted"
NOTE_DST_REPEAT: Final = "dst_repeat"
SKIPPED_DST_GAP: Final = "dst_gap"
SKIPPED_MISFIRE: Final = "misfire"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE: Final = _EPOCH.replace(tzinfo=None)
_MS: Final = timedelta(milliseconds=1)
_SECOND: Final = timedelta(seconds=1)
_JITTER_PERSON: Final = b"schedd-jitter"
_EXPLAIN_MAX_TIMES: Final = 6  # nonexistent times named in one explain note


# --------------------------------------------------------------------------------------------
# Public types


@dataclass(frozen=True, slots=True)
class Recurrence:
    """A recurring schedule, ready for computing fire times.  See the module docstring."""

    every_ms: int | None = None  # exactly one of every_ms / cron
    cron: str | None = None  # 5 fields, 6 with seconds last, or @daily etc.
    timezone: str = "UTC"  # IANA zone; cron runs on its local wall clock
    jitter_ms: int = 0
    dst_gap: DstGap = DstGap.SHIFT
    dst_repeat: DstRepeat = DstRepeat.FIRST
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    anchor_ms: int = 0  # every: fire times are anchor + k * every_ms, k >= 0

    def __post_init__(self) -> None:
        if (self.every_ms is None) == (self.cron is None):
            raise ValueError("Recurrence: expected exactly one of every_ms and cron")
        if self.every_ms is not None and self.every_ms <= 0:
            raise ValueError(f"Recurrence: every_ms must be positive, got {self.every_ms}")
        if self.jitter_ms < 0:
            raise ValueError(f"Recurrence: jitter_ms must not be negative, got {self.jitter_ms}")


@dataclass(frozen=True, slots=True)
class Occurrence:
    scheduled_ms: int  # the nominal fire time in UTC; run id = job_id@scheduled_ms
    due_ms: int  # scheduled_ms + stable jitter (what the timing wheel waits for)
    note: str | None = None  # "dst_shifted" (moved out of a gap), "dst_repeat" (second pass)
    skipped: str | None = None  # "dst_gap": not to run; recorded as a skipped run


@dataclass(frozen=True, slots=True)
class MisfirePlan:
    run: tuple[Occurrence, ...]  # to run now, oldest first
    skip: tuple[Occurrence, ...]  # to record as skipped (reason: occ.skipped or "misfire")


# --------------------------------------------------------------------------------------------
# Zone arithmetic


@dataclass(frozen=True, slots=True)
class _Event:
    """An occurrence before jitter, with what ``explain`` needs to describe it."""

    ms: int
    local: datetime | None = None  # the nominal naive local time (cron; None at a gap's end)
    note: str | None = None
    skipped: str | None = None
    # For an event at the end of a DST gap: the wall-clock readings where the gap starts/ends.
    span: tuple[datetime, datetime] | None = None
    gap: bool = False  # the event is at the end of a gap (shifted, skipped or merged)
    ambiguous: bool = False  # its local time happens twice


def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _aware(ms: int, zone: ZoneInfo) -> datetime:
    """The instant ``ms`` as an aware local datetime (``fold=1`` in the second pass)."""
    return (_EPOCH + ms * _MS).astimezone(zone)


def _naive_ms(local: datetime) -> int:
    """A naive wall-clock reading as milliseconds since the naive epoch."""
    return (local - _EPOCH_NAIVE) // _MS


def _naive(ms: int) -> datetime:
    return _EPOCH_NAIVE + ms * _MS


def _offset_ms(zone: ZoneInfo, local: datetime, fold: int) -> int:
    offset = zone.utcoffset(local.replace(fold=fold))
    assert offset is not None  # a ZoneInfo has an offset for every datetime
    return offset // _MS


def _offset_at(zone: ZoneInfo, ms: int) -> timedelta | None:
    return _aware(ms, zone).utcoffset()


def _transition(zone: ZoneInfo, lo_ms: int, hi_ms: int) -> int:
    """The transition instant in ``(lo_ms, hi_ms]``: the first second with the offset of
    ``hi_ms`` (TZif transitions are on whole seconds; the range holds one transition)."""
    target = _offset_at(zone, hi_ms)
    lo = lo_ms // 1000
    hi = -(-hi_ms // 1000)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_at(zone, mid * 1000) == target:
            hi = mid
        else:
            lo = mid
    return hi * 1000


@dataclass(frozen=True, slots=True)
class _Placed:
    """Where a naive local time falls in UTC."""

    first_ms: int  # its instant; for a nonexistent time the end of the gap; fold=0 if doubled
    second_ms: int | None = None  # the fold=1 instant of a doubled time
    gap: bool = False
    span: tuple[datetime, datetime] | None = None  # a gap's start and end wall-clock readings


def _place(zone: ZoneInfo, local: datetime) -> _Placed:
    local_ms = _naive_ms(local)
    off0 = _offset_ms(zone, local, 0)
    off1 = _offset_ms(zone, local, 1)
    if off0 == off1:
        return _Placed(local_ms - off0)
    u0, u1 = local_ms - off0, local_ms - off1
    if _naive_ms(_aware(u0, zone).replace(tzinfo=None)) != local_ms:
        # Does not exist (round trip through UTC lands elsewhere): a spring-forward gap.  For a
        # gap, fold=0 carries the offset before the jump and fold=1 the one after it.
        transition = _transition(zone, u1, u0)
        span = (_naive(transition + off0), _naive(transition + off1))
        return _Placed(transition, gap=True, span=span)
    # Happens twice: fold=0 (the offset before falling back) is the first pass.
    return _Placed(u0, second_ms=u1)


# --------------------------------------------------------------------------------------------
# Cron


@lru_cache(maxsize=1024)
def _template(expr: str) -> croniter:
    """A parsed cron expression; copied per query (parsing costs more than matching)."""
    return croniter(expr, _EPOCH_NAIVE)


@lru_cache(maxsize=1024)
def cron_parts(expr: str) -> tuple[str, ...]:
    """The expressions whose union ``expr`` means: ``expr`` itself, or, when both day fields
    are restricted, the one with only its day-of-month and the one with only its day-of-week.
    (croniter alone drops the day-of-month days, or finds nothing, when the day of week uses
    ``#`` or ``L``.)"""
    fields = expr.split(" ")
    if len(fields) in (5, 6) and fields[2] != "*" and fields[4] != "*":
        by_month_day = [*fields[:4], "*", *fields[5:]]
        by_week_day = [*fields[:2], "*", *fields[3:]]
        return (" ".join(by_month_day), " ".join(by_week_day))
    return (expr,)


def _cron_after(expr: str, local: datetime) -> datetime:
    """The first naive local time after ``local`` (whole seconds: ``local`` is floored).  Raises
    ``CroniterBadDateError`` when no part of ``expr`` matches again (croniter looks 50 years
    ahead)."""
    start = local.replace(microsecond=0, fold=0)
    found: list[datetime] = []
    for part in cron_parts(expr):
        try:
            found.append(copy.copy(_template(part)).get_next(datetime, start_time=start))
        except CroniterBadDateError:
            continue
    if not found:
        raise CroniterBadDateError(f"no match of {expr!r} after {start.isoformat()}")
    return min(found)


def _matches(expr: str, local: datetime) -> bool:
    return _cron_after(expr, local - _SECOND) == local


def _first_event(rec: Recurrence, zone: ZoneInfo, expr: str, local: datetime) -> _Event:
    """The event of a candidate local time in its first (or only) pass."""
    placed = _place(zone, local)
    if not placed.gap:
        return _Event(placed.first_ms, local, ambiguous=placed.second_ms is not None)
    assert placed.span is not None
    after_gap = placed.span[1]
    # A gap's event needs no local time: explain names the gap's times from its span.
    if _matches(expr, after_gap):  # the ordinary occurrence right after the gap stands for it
        return _Event(placed.first_ms, span=placed.span, gap=True)
    if rec.dst_gap is DstGap.SHIFT:
        return _Event(placed.first_ms, note=NOTE_DST_SHIFTED, span=placed.span, gap=True)
    return _Event(placed.first_ms, skipped=SKIPPED_DST_GAP, span=placed.span, gap=True)


def _next_first_pass(rec: Recurrence, zone: ZoneInfo, expr: str, after_ms: int) -> _Event:
    """The first event after ``after_ms`` among first passes (and gap ends).

    Placing local times with fold=0 (gaps at their end) never decreases as the local time
    grows, so this is the event of the first candidate after the wall-clock reading of
    ``after_ms`` — except inside the second pass of a doubled hour, whose first-pass events are
    already in the past: there the search starts at the end of the doubled hour.
    """
    here = _aware(after_ms, zone)
    start = here.replace(tzinfo=None)  # naive: _offset_ms and _cron_after set the fold they use
    if here.fold == 1:
        local_ms = _naive_ms(start)
        off_first = _offset_ms(zone, start, 0)
        transition = _transition(zone, local_ms - off_first, after_ms)
        start = _naive(transition + off_first) - _SECOND  # the end of the doubled hour
    while True:  # one step in practice; each step moves forward
        candidate = _cron_after(expr, start)
        event = _first_event(rec, zone, expr, candidate)
        if event.ms > after_ms:
            return event
        start = event.span[1] if event.gap and event.span is not None else candidate


def _next_second_pass(zone: ZoneInfo, expr: str, after_ms: int) -> _Event | None:
    """With ``dst.repeat=both``: the first second-pass event after ``after_ms`` that could come
    before every first-pass one, i.e. one of the doubled hour ``after_ms`` is in (if any)."""
    here = _aware(after_ms, zone)
    local = here.replace(tzinfo=None)  # naive: _offset_ms sets the fold it uses
    off0 = _offset_ms(zone, local, 0)
    off1 = _offset_ms(zone, local, 1)
    if off0 <= off1:  # not in a doubled hour (an instant is never in a gap)
        return None
    local_ms = _naive_ms(local)
    transition = _transition(zone, local_ms - off0, local_ms - off1)
    begin, end = _naive(transition + off1), _naive(transition + off0)
    # A local time L of the doubled hour has its second pass at L - off1 > after_ms exactly
    # when L is after the second-pass reading of after_ms.
    low = _naive(after_ms + off1)
    start = begin - _SECOND if low < begin else low
    candidate = _cron_after(expr, start)
    if candidate >= end:
        return None
    return _Event(_naive_ms(candidate) - off1, candidate, NOTE_DST_REPEAT, ambiguous=True)


def _next_cron(rec: Recurrence, expr: str, after_ms: int) -> _Event | None:
    zone = _zone(rec.timezone)
    try:
        first = _next_first_pass(rec, zone, expr, after_ms)
        if rec.dst_repeat is DstRepeat.BOTH:
            second = _next_second_pass(zone, expr, after_ms)
            if second is not None and second.ms < first.ms:
                return second
    except (CroniterBadDateError, OverflowError, ValueError):
        return None  # no further match (croniter searches 50 years), or past year 9999
    return first


# --------------------------------------------------------------------------------------------
# Occurrences


def _next_every(every_ms: int, anchor_ms: int, after_ms: int) -> _Event:
    k = 0 if after_ms < anchor_ms else (after_ms - anchor_ms) // every_ms + 1
    return _Event(anchor_ms + k * every_ms)


def _next_event(rec: Recurrence, after_ms: int) -> _Event | None:
    if rec.start_at_ms is not None:
        after_ms = max(after_ms, rec.start_at_ms - 1)
    if rec.every_ms is not None:
        event: _Event | None = _next_every(rec.every_ms, rec.anchor_ms, after_ms)
    else:
        assert rec.cron is not None
        event = _next_cron(rec, rec.cron, after_ms)
    if event is None or (rec.end_at_ms is not None and event.ms > rec.end_at_ms):
        return None
    return event


def jitter_for(job_id: str, scheduled_ms: int, jitter_ms: int) -> int:
    """A stable spread in ``[0, jitter_ms)`` for one occurrence of one job.

    A hash (BLAKE2b) of the job id and the scheduled time: the same on every node, in every
    process and after every restart, and different from one occurrence to the next.
    """
    if jitter_ms <= 1:
        return 0
    digest = hashlib.blake2b(
        f"{job_id}@{scheduled_ms}".encode(), digest_size=8, person=_JITTER_PERSON
    ).digest()
    return int.from_bytes(digest, "big") % jitter_ms


def _occurrence(event: _Event, job_id: str, jitter_ms: int) -> Occurrence:
    due = event.ms if event.skipped else event.ms + jitter_for(job_id, event.ms, jitter_ms)
    return Occurrence(event.ms, due, event.note, event.skipped)


def next_occurrence(rec: Recurrence, after_ms: int, job_id: str) -> Occurrence | None:
    """The first occurrence with ``scheduled_ms > after_ms`` within the bounds, or ``None``
    when the schedule is over.  DST-skipped occurrences are returned (``skipped="dst_gap"``)
    for the caller to record; it then asks again after them."""
    event = _next_event(rec, after_ms)
    return None if event is None else _occurrence(event, job_id, rec.jitter_ms)


def occurrences(
    rec: Recurrence, after_ms: int, until_ms: int, job_id: str, limit: int
) -> list[Occurrence]:
    """The occurrences with ``after_ms < scheduled_ms <= until_ms``, at most ``limit``."""
    out: list[Occurrence] = []
    cursor = after_ms
    while len(out) < limit:
        occ = next_occurrence(rec, cursor, job_id)
        if occ is None or occ.scheduled_ms > until_ms:
            break
        out.append(occ)
        cursor = occ.scheduled_ms
    return out


def plan_misfire(
    policy: Misfire,
    missed: Sequence[Occurrence],
    now_ms: int,
    catchup_window_ms: int | None,
) -> MisfirePlan:
    """What to do with occurrences whose time passed while nobody scheduled them.

    ``skip``: run none.  ``run_once``: run the most recent one.  ``run_all``: run them all.
    With a ``catchup_window``, only those scheduled at or after ``now - window`` may run.
    Occurrences already marked skipped (``dst_gap``) never run.  Everything not run is in
    ``skip``, in order; ``run`` ∪ ``skip`` is exactly ``missed``.
    """
    ordered = sorted(missed, key=lambda o: o.scheduled_ms)
    runnable = [o for o in ordered if o.skipped is None]
    if policy is Misfire.SKIP:
        chosen: list[Occurrence] = []
    elif policy is Misfire.RUN_ONCE:
        chosen = runnable[-1:]
    else:
        chosen = runnable
    if catchup_window_ms is not None:
        oldest = now_ms - catchup_window_ms
        chosen = [o for o in chosen if o.scheduled_ms >= oldest]
    run_ids = {id(o) for o in chosen}
    return MisfirePlan(run=tuple(chosen), skip=tuple(o for o in ordered if id(o) not in run_ids))


# --------------------------------------------------------------------------------------------
# Explain


def _clock(local: datetime) -> str:
    return local.strftime("%H:%M:%S" if local.second else "%H:%M")


def _iso_local(ms: int, zone: ZoneInfo) -> str:
    return _aware(ms, zone).isoformat(timespec="milliseconds" if ms % 1000 else "seconds")


def _gap_times(expr: str, span: tuple[datetime, datetime]) -> list[datetime]:
    """The cron's local times inside a gap (the first few)."""
    out: list[datetime] = []
    local = _cron_after(expr, span[0] - _SECOND)
    while local < span[1] and len(out) < _EXPLAIN_MAX_TIMES + 1:
        out.append(local)
        local = _cron_after(expr, local)
    return out


def _listing(times: list[datetime]) -> str:
    names = [_clock(t) for t in times[:_EXPLAIN_MAX_TIMES]]
    if len(times) > _EXPLAIN_MAX_TIMES:
        return ", ".join(names) + " and more"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _gap_note(rec: Recurrence, expr: str, event: _Event) -> str:
    assert event.span is not None
    times = _gap_times(expr, event.span)
    verb = "does" if len(times) == 1 else "do"
    day = event.span[0].date().isoformat()
    where = f"{_listing(times)} {verb} not exist on {day} in {rec.timezone}"
    after = _clock(event.span[1])
    if event.skipped:
        return f"skipped: {where}"
    if event.note == NOTE_DST_SHIFTED:
        return f"{where}: shifted to {after}"
    if rec.dst_gap is DstGap.SHIFT:
        return f"{where}: merged into {after}"
    return f"{where}: skipped ({after} runs)"


def _repeat_note(rec: Recurrence, zone: ZoneInfo, event: _Event) -> str:
    assert event.local is not None
    offset = _aware(event.ms, zone).isoformat()[-6:]
    day = event.local.date().isoformat()
    where = f"{_clock(event.local)} happens twice on {day} in {rec.timezone}"
    if event.note == NOTE_DST_REPEAT:
        return f"{where}: second run ({offset})"
    if rec.dst_repeat is DstRepeat.BOTH:
        return f"{where}: first of two runs ({offset})"
    return f"{where}: runs once, at the first ({offset})"


def explain(rec: Recurrence, now_ms: int, count: int, job_id: str) -> list[dict[str, object]]:
    """The next ``count`` occurrences after ``now_ms``, for people.

    Each is ``{"scheduled_ms", "due_ms", "local", "note"}``: ``local`` is the scheduled time as
    ISO 8601 in the schedule's zone with its offset; ``note`` is ``None`` unless DST changes
    the occurrence (shifted out of a gap, skipped, merged, or a doubled local time).
    """
    zone = _zone(rec.timezone)
    out: list[dict[str, object]] = []
    cursor = now_ms
    while len(out) < count:
        event = _next_event(rec, cursor)
        if event is None:
            break
        occ = _occurrence(event, job_id, rec.jitter_ms)
        note: str | None = None
        if rec.cron is not None and event.gap:
            note = _gap_note(rec, rec.cron, event)
        elif event.ambiguous:
            note = _repeat_note(rec, zone, event)
        out.append(
            {
                "scheduled_ms": occ.scheduled_ms,
                "due_ms": occ.due_ms,
                "local": _iso_local(occ.scheduled_ms, zone),
                "note": note,
            }
        )
        cursor = event.ms
    return out


# --------------------------------------------------------------------------------------------
# From the job


def recurrence_from(schedule: Schedule, options: RecurringOptions, anchor_ms: int) -> Recurrence:
    """The :class:`Recurrence` of an ``every``/``cron`` schedule.

    ``anchor_ms`` is the submit time; an ``every`` schedule with a ``start_at`` is anchored
    there instead.  Raises ``ValueError`` for a schedule that does not recur.
    """
    if schedule.kind is ScheduleKind.EVERY and schedule.every_ms is not None:
        every_ms: int | None = schedule.every_ms
        cron: str | None = None
    elif schedule.kind is ScheduleKind.CRON and schedule.cron is not None:
        every_ms, cron = None, schedule.cron
    else:
        raise ValueError(f"recurrence_from: a {schedule.kind.value} schedule does not recur")
    return Recurrence(
        every_ms=every_ms,
        cron=cron,
        timezone=schedule.timezone,
        jitter_ms=options.jitter_ms,
        dst_gap=options.dst_gap,
        dst_repeat=options.dst_repeat,
        start_at_ms=options.start_at_ms,
        end_at_ms=options.end_at_ms,
        anchor_ms=anchor_ms if options.start_at_ms is None else options.start_at_ms,
    )
