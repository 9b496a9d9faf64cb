"""Unit tests of recurring fire times (schedd.core.recurrence), all on virtual time.

The DST tables use these transitions (UTC instants):

* Europe/Berlin      2026-03-29 01:00Z  02:00 CET  → 03:00 CEST  (gap 02:00–03:00)
                     2026-10-25 01:00Z  03:00 CEST → 02:00 CET   (02:00–03:00 twice)
* America/New_York   2026-03-08 07:00Z  02:00 EST  → 03:00 EDT   (gap 02:00–03:00)
                     2026-11-01 06:00Z  02:00 EDT  → 01:00 EST   (01:00–02:00 twice)
* Australia/Lord_Howe 2026-04-04 15:00Z 02:00 +11  → 01:30 +10:30 (01:30–02:00 twice)
                     2026-10-03 15:30Z  02:00 +10:30 → 02:30 +11 (gap 02:00–02:30)

Each expected occurrence is written ``"<UTC time> [shift|repeat|skip]"``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schedd.core.model import DstGap, DstRepeat, Misfire, RecurringOptions, Schedule, ScheduleKind
from schedd.core.recurrence import (
    MisfirePlan,
    Occurrence,
    Recurrence,
    explain,
    jitter_for,
    next_occurrence,
    occurrences,
    plan_misfire,
    recurrence_from,
)

SEC = 1_000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR

SHIFT, SKIP = (DstGap.SHIFT,), (DstGap.SKIP,)
FIRST, BOTH = (DstRepeat.FIRST,), (DstRepeat.BOTH,)
ANY_GAP, ANY_REPEAT = tuple(DstGap), tuple(DstRepeat)

BERLIN, NEW_YORK, LORD_HOWE = "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"


def utc(text: str) -> int:
    """``"2026-03-29T01:00Z"`` → Unix ms."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def show(occ: Occurrence) -> str:
    dt = datetime.fromtimestamp(occ.scheduled_ms / 1000, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S" if dt.second else "%Y-%m-%dT%H:%M") + "Z"
    if occ.skipped == "dst_gap":
        text += " skip"
    elif occ.note == "dst_shifted":
        text += " shift"
    elif occ.note == "dst_repeat":
        text += " repeat"
    else:
        assert occ.note is None and occ.skipped is None, occ
    return text


def iterate(rec: Recurrence, after_ms: int, n: int, job_id: str = "job") -> list[Occurrence]:
    out: list[Occurrence] = []
    for _ in range(n):
        occ = next_occurrence(rec, after_ms, job_id)
        if occ is None:
            break
        out.append(occ)
        after_ms = occ.scheduled_ms
    return out


# (id, zone, cron, gap policies, repeat policies, after, expected)
DST_CASES: list[tuple[str, str, str, tuple[DstGap, ...], tuple[DstRepeat, ...], str, list[str]]] = [
    # ---- Europe/Berlin, spring forward: 02:00–03:00 does not exist on 2026-03-29
    (
        "berlin-gap-daily-shift",
        BERLIN,
        "30 2 * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z shift", "2026-03-30T00:30Z"],
    ),
    (
        "berlin-gap-daily-skip",
        BERLIN,
        "30 2 * * *",
        SKIP,
        ANY_REPEAT,
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z skip", "2026-03-30T00:30Z"],
    ),
    (
        "berlin-gap-daily-seconds-shift",
        BERLIN,
        "30 2 * * * 15",
        SHIFT,
        ANY_REPEAT,
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z shift", "2026-03-30T00:30:15Z"],
    ),
    (
        "berlin-gap-hourly-shift",
        BERLIN,
        "30 * * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-03-28T23:00Z",
        [
            "2026-03-28T23:30Z",
            "2026-03-29T00:30Z",
            "2026-03-29T01:00Z shift",
            "2026-03-29T01:30Z",
            "2026-03-29T02:30Z",
        ],
    ),
    (
        "berlin-gap-hourly-skip",
        BERLIN,
        "30 * * * *",
        SKIP,
        ANY_REPEAT,
        "2026-03-28T23:00Z",
        [
            "2026-03-28T23:30Z",
            "2026-03-29T00:30Z",
            "2026-03-29T01:00Z skip",
            "2026-03-29T01:30Z",
            "2026-03-29T02:30Z",
        ],
    ),
    (
        "berlin-gap-on-the-hour-merges-into-03:00",
        BERLIN,
        "0 * * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-03-28T23:30Z",
        ["2026-03-29T00:00Z", "2026-03-29T01:00Z", "2026-03-29T02:00Z"],
    ),
    (
        "berlin-gap-half-hourly-merges-into-03:00",
        BERLIN,
        "*/30 * * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-03-28T23:45Z",
        ["2026-03-29T00:00Z", "2026-03-29T00:30Z", "2026-03-29T01:00Z", "2026-03-29T01:30Z"],
    ),
    (
        "berlin-gap-daily-03:00-unaffected",
        BERLIN,
        "0 3 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z", "2026-03-30T01:00Z"],
    ),
    (
        "berlin-gap-daily-01:59-unaffected",
        BERLIN,
        "59 1 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-03-28T12:00Z",
        ["2026-03-29T00:59Z", "2026-03-29T23:59Z"],
    ),
    (
        "berlin-gap-asked-at-the-transition-skip",
        BERLIN,
        "30 2 * * *",
        SKIP,
        ANY_REPEAT,
        "2026-03-29T01:00Z",
        ["2026-03-30T00:30Z"],
    ),
    (
        "berlin-gap-asked-at-the-transition-merged",
        BERLIN,
        "*/30 * * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-03-29T01:00Z",
        ["2026-03-29T01:30Z"],
    ),
    # ---- Europe/Berlin, fall back: 02:00–03:00 happens twice on 2026-10-25
    (
        "berlin-repeat-daily-first",
        BERLIN,
        "30 2 * * *",
        ANY_GAP,
        FIRST,
        "2026-10-24T12:00Z",
        ["2026-10-25T00:30Z", "2026-10-26T01:30Z"],
    ),
    (
        "berlin-repeat-daily-both",
        BERLIN,
        "30 2 * * *",
        ANY_GAP,
        BOTH,
        "2026-10-24T12:00Z",
        ["2026-10-25T00:30Z", "2026-10-25T01:30Z repeat", "2026-10-26T01:30Z"],
    ),
    (
        "berlin-repeat-daily-02:00-both",
        BERLIN,
        "0 2 * * *",
        ANY_GAP,
        BOTH,
        "2026-10-24T12:00Z",
        ["2026-10-25T00:00Z", "2026-10-25T01:00Z repeat", "2026-10-26T01:00Z"],
    ),
    (
        "berlin-repeat-hourly-first",
        BERLIN,
        "30 * * * *",
        ANY_GAP,
        FIRST,
        "2026-10-24T23:00Z",
        ["2026-10-24T23:30Z", "2026-10-25T00:30Z", "2026-10-25T02:30Z", "2026-10-25T03:30Z"],
    ),
    (
        "berlin-repeat-hourly-both",
        BERLIN,
        "30 * * * *",
        ANY_GAP,
        BOTH,
        "2026-10-24T23:00Z",
        ["2026-10-24T23:30Z", "2026-10-25T00:30Z", "2026-10-25T01:30Z repeat", "2026-10-25T02:30Z"],
    ),
    (
        "berlin-repeat-20min-first",
        BERLIN,
        "*/20 * * * *",
        ANY_GAP,
        FIRST,
        "2026-10-24T23:50Z",
        [
            "2026-10-25T00:00Z",
            "2026-10-25T00:20Z",
            "2026-10-25T00:40Z",
            "2026-10-25T02:00Z",
            "2026-10-25T02:20Z",
        ],
    ),
    (
        "berlin-repeat-20min-both",
        BERLIN,
        "*/20 * * * *",
        ANY_GAP,
        BOTH,
        "2026-10-24T23:50Z",
        [
            "2026-10-25T00:00Z",
            "2026-10-25T00:20Z",
            "2026-10-25T00:40Z",
            "2026-10-25T01:00Z repeat",
            "2026-10-25T01:20Z repeat",
            "2026-10-25T01:40Z repeat",
            "2026-10-25T02:00Z",
            "2026-10-25T02:20Z",
        ],
    ),
    (
        "berlin-repeat-asked-in-first-pass-earlier-time",
        BERLIN,
        "45 1 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-10-25T00:30Z",
        ["2026-10-26T00:45Z"],
    ),
    (
        "berlin-repeat-asked-in-second-pass-earlier-time",
        BERLIN,
        "45 1 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-10-25T01:30Z",
        ["2026-10-26T00:45Z"],
    ),
    (
        "berlin-repeat-asked-in-first-pass-later-time-both",
        BERLIN,
        "50 2 * * *",
        ANY_GAP,
        BOTH,
        "2026-10-25T00:10Z",
        ["2026-10-25T00:50Z", "2026-10-25T01:50Z repeat", "2026-10-26T01:50Z"],
    ),
    (
        "berlin-repeat-asked-after-first-run-both",
        BERLIN,
        "10 2 * * *",
        ANY_GAP,
        BOTH,
        "2026-10-25T00:30Z",
        ["2026-10-25T01:10Z repeat", "2026-10-26T01:10Z"],
    ),
    (
        "berlin-repeat-daily-03:00-unaffected",
        BERLIN,
        "0 3 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-10-24T12:00Z",
        ["2026-10-25T02:00Z", "2026-10-26T02:00Z"],
    ),
    # ---- America/New_York, spring forward: 02:00–03:00 does not exist on 2026-03-08
    (
        "ny-gap-daily-shift",
        NEW_YORK,
        "30 2 * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-03-07T12:00Z",
        ["2026-03-08T07:00Z shift", "2026-03-09T06:30Z"],
    ),
    (
        "ny-gap-daily-skip",
        NEW_YORK,
        "30 2 * * *",
        SKIP,
        ANY_REPEAT,
        "2026-03-07T12:00Z",
        ["2026-03-08T07:00Z skip", "2026-03-09T06:30Z"],
    ),
    (
        "ny-gap-hourly-shift",
        NEW_YORK,
        "30 * * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-03-08T05:00Z",
        ["2026-03-08T05:30Z", "2026-03-08T06:30Z", "2026-03-08T07:00Z shift", "2026-03-08T07:30Z"],
    ),
    (
        "ny-gap-hourly-skip",
        NEW_YORK,
        "30 * * * *",
        SKIP,
        ANY_REPEAT,
        "2026-03-08T05:00Z",
        ["2026-03-08T05:30Z", "2026-03-08T06:30Z", "2026-03-08T07:00Z skip", "2026-03-08T07:30Z"],
    ),
    (
        "ny-gap-quarter-hourly-merges",
        NEW_YORK,
        "*/15 * * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-03-08T06:40Z",
        ["2026-03-08T06:45Z", "2026-03-08T07:00Z", "2026-03-08T07:15Z"],
    ),
    # ---- America/New_York, fall back: 01:00–02:00 happens twice on 2026-11-01
    (
        "ny-repeat-daily-first",
        NEW_YORK,
        "30 1 * * *",
        ANY_GAP,
        FIRST,
        "2026-10-31T12:00Z",
        ["2026-11-01T05:30Z", "2026-11-02T06:30Z"],
    ),
    (
        "ny-repeat-daily-both",
        NEW_YORK,
        "30 1 * * *",
        ANY_GAP,
        BOTH,
        "2026-10-31T12:00Z",
        ["2026-11-01T05:30Z", "2026-11-01T06:30Z repeat", "2026-11-02T06:30Z"],
    ),
    (
        "ny-repeat-daily-01:00-both",
        NEW_YORK,
        "0 1 * * *",
        ANY_GAP,
        BOTH,
        "2026-10-31T12:00Z",
        ["2026-11-01T05:00Z", "2026-11-01T06:00Z repeat", "2026-11-02T06:00Z"],
    ),
    (
        "ny-repeat-hourly-first",
        NEW_YORK,
        "30 * * * *",
        ANY_GAP,
        FIRST,
        "2026-11-01T04:00Z",
        ["2026-11-01T04:30Z", "2026-11-01T05:30Z", "2026-11-01T07:30Z", "2026-11-01T08:30Z"],
    ),
    (
        "ny-repeat-hourly-both",
        NEW_YORK,
        "30 * * * *",
        ANY_GAP,
        BOTH,
        "2026-11-01T04:00Z",
        ["2026-11-01T04:30Z", "2026-11-01T05:30Z", "2026-11-01T06:30Z repeat", "2026-11-01T07:30Z"],
    ),
    (
        "ny-repeat-asked-in-first-pass-first",
        NEW_YORK,
        "*/20 * * * *",
        ANY_GAP,
        FIRST,
        "2026-11-01T05:50Z",
        ["2026-11-01T07:00Z", "2026-11-01T07:20Z"],
    ),
    (
        "ny-repeat-asked-in-first-pass-both",
        NEW_YORK,
        "*/20 * * * *",
        ANY_GAP,
        BOTH,
        "2026-11-01T05:50Z",
        [
            "2026-11-01T06:00Z repeat",
            "2026-11-01T06:20Z repeat",
            "2026-11-01T06:40Z repeat",
            "2026-11-01T07:00Z",
        ],
    ),
    (
        "ny-repeat-asked-in-first-pass-earlier-time",
        NEW_YORK,
        "50 0 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-11-01T05:30Z",
        ["2026-11-02T05:50Z"],
    ),
    (
        "ny-repeat-asked-in-second-pass-first",
        NEW_YORK,
        "*/20 * * * *",
        ANY_GAP,
        FIRST,
        "2026-11-01T06:10Z",
        ["2026-11-01T07:00Z"],
    ),
    (
        "ny-repeat-asked-in-second-pass-both",
        NEW_YORK,
        "*/20 * * * *",
        ANY_GAP,
        BOTH,
        "2026-11-01T06:10Z",
        ["2026-11-01T06:20Z repeat", "2026-11-01T06:40Z repeat", "2026-11-01T07:00Z"],
    ),
    # ---- Australia/Lord_Howe, fall back by 30 minutes: 01:30–02:00 twice on 2026-04-05
    (
        "lordhowe-repeat-daily-first",
        LORD_HOWE,
        "45 1 * * *",
        ANY_GAP,
        FIRST,
        "2026-04-04T00:00Z",
        ["2026-04-04T14:45Z", "2026-04-05T15:15Z"],
    ),
    (
        "lordhowe-repeat-daily-both",
        LORD_HOWE,
        "45 1 * * *",
        ANY_GAP,
        BOTH,
        "2026-04-04T00:00Z",
        ["2026-04-04T14:45Z", "2026-04-04T15:15Z repeat", "2026-04-05T15:15Z"],
    ),
    (
        "lordhowe-repeat-at-overlap-start-first",
        LORD_HOWE,
        "30 1 * * *",
        ANY_GAP,
        FIRST,
        "2026-04-04T00:00Z",
        ["2026-04-04T14:30Z", "2026-04-05T15:00Z"],
    ),
    (
        "lordhowe-repeat-at-overlap-start-both",
        LORD_HOWE,
        "30 1 * * *",
        ANY_GAP,
        BOTH,
        "2026-04-04T00:00Z",
        ["2026-04-04T14:30Z", "2026-04-04T15:00Z repeat", "2026-04-05T15:00Z"],
    ),
    (
        "lordhowe-repeat-at-overlap-end-unaffected",
        LORD_HOWE,
        "0 2 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-04-04T00:00Z",
        ["2026-04-04T15:30Z", "2026-04-05T15:30Z"],
    ),
    (
        "lordhowe-repeat-quarter-hourly-first",
        LORD_HOWE,
        "*/15 * * * *",
        ANY_GAP,
        FIRST,
        "2026-04-04T14:10Z",
        [
            "2026-04-04T14:15Z",
            "2026-04-04T14:30Z",
            "2026-04-04T14:45Z",
            "2026-04-04T15:30Z",
            "2026-04-04T15:45Z",
        ],
    ),
    (
        "lordhowe-repeat-quarter-hourly-both",
        LORD_HOWE,
        "*/15 * * * *",
        ANY_GAP,
        BOTH,
        "2026-04-04T14:10Z",
        [
            "2026-04-04T14:15Z",
            "2026-04-04T14:30Z",
            "2026-04-04T14:45Z",
            "2026-04-04T15:00Z repeat",
            "2026-04-04T15:15Z repeat",
            "2026-04-04T15:30Z",
        ],
    ),
    (
        "lordhowe-repeat-hourly-unaffected",
        LORD_HOWE,
        "0 * * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-04-04T13:30Z",
        ["2026-04-04T14:00Z", "2026-04-04T15:30Z", "2026-04-04T16:30Z"],
    ),
    (
        "lordhowe-repeat-asked-in-first-pass-earlier-time",
        LORD_HOWE,
        "20 1 * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-04-04T14:50Z",
        ["2026-04-05T14:50Z"],
    ),
    (
        "lordhowe-repeat-asked-in-second-pass-both",
        LORD_HOWE,
        "40 1 * * *",
        ANY_GAP,
        BOTH,
        "2026-04-04T15:05Z",
        ["2026-04-04T15:10Z repeat", "2026-04-05T15:10Z"],
    ),
    # ---- Australia/Lord_Howe, spring forward by 30 minutes: 02:00–02:30 missing on 2026-10-04
    (
        "lordhowe-gap-daily-shift",
        LORD_HOWE,
        "15 2 * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-10-03T00:00Z",
        ["2026-10-03T15:30Z shift", "2026-10-04T15:15Z"],
    ),
    (
        "lordhowe-gap-daily-skip",
        LORD_HOWE,
        "15 2 * * *",
        SKIP,
        ANY_REPEAT,
        "2026-10-03T00:00Z",
        ["2026-10-03T15:30Z skip", "2026-10-04T15:15Z"],
    ),
    (
        "lordhowe-gap-hourly-shift",
        LORD_HOWE,
        "0 * * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-10-03T14:00Z",
        ["2026-10-03T14:30Z", "2026-10-03T15:30Z shift", "2026-10-03T16:00Z"],
    ),
    (
        "lordhowe-gap-hourly-skip",
        LORD_HOWE,
        "0 * * * *",
        SKIP,
        ANY_REPEAT,
        "2026-10-03T14:00Z",
        ["2026-10-03T14:30Z", "2026-10-03T15:30Z skip", "2026-10-03T16:00Z"],
    ),
    (
        "lordhowe-gap-half-hourly-shift",
        LORD_HOWE,
        "10,40 * * * *",
        SHIFT,
        ANY_REPEAT,
        "2026-10-03T14:30Z",
        ["2026-10-03T14:40Z", "2026-10-03T15:10Z", "2026-10-03T15:30Z shift", "2026-10-03T15:40Z"],
    ),
    (
        "lordhowe-gap-half-hourly-skip",
        LORD_HOWE,
        "10,40 * * * *",
        SKIP,
        ANY_REPEAT,
        "2026-10-03T14:30Z",
        ["2026-10-03T14:40Z", "2026-10-03T15:10Z", "2026-10-03T15:30Z skip", "2026-10-03T15:40Z"],
    ),
    (
        "lordhowe-gap-quarter-hourly-merges-into-02:30",
        LORD_HOWE,
        "*/15 * * * *",
        ANY_GAP,
        ANY_REPEAT,
        "2026-10-03T14:50Z",
        ["2026-10-03T15:00Z", "2026-10-03T15:15Z", "2026-10-03T15:30Z", "2026-10-03T15:45Z"],
    ),
]


def _expand_cases() -> list[Any]:
    out = []
    for name, zone, cron, gaps, repeats, after, expected in DST_CASES:
        for gap in gaps:
            for repeat in repeats:
                out.append(
                    pytest.param(
                        zone,
                        cron,
                        gap,
                        repeat,
                        after,
                        expected,
                        id=f"{name}[{gap.value},{repeat.value}]",
                    )
                )
    return out


@pytest.mark.parametrize(("zone", "cron", "gap", "repeat", "after", "expected"), _expand_cases())
def test_cron_across_dst(
    zone: str, cron: str, gap: DstGap, repeat: DstRepeat, after: str, expected: list[str]
) -> None:
    rec = Recurrence(cron=cron, timezone=zone, dst_gap=gap, dst_repeat=repeat)
    got = iterate(rec, utc(after), len(expected))
    assert [show(o) for o in got] == expected
    # occurrences() is the same sequence, bounded by until (inclusive) and limit
    until = got[-1].scheduled_ms
    assert occurrences(rec, utc(after), until, "job", 1000) == got
    assert occurrences(rec, utc(after), until - 1, "job", 1000) == got[:-1]
    assert occurrences(rec, utc(after), until, "job", 2) == got[:2]
    # no jitter: due == scheduled
    assert all(o.due_ms == o.scheduled_ms for o in got)


def test_shifted_and_repeated_local_times() -> None:
    shifted = Recurrence(cron="30 2 * * *", timezone=BERLIN)
    [row] = explain(shifted, utc("2026-03-28T12:00Z"), 1, "job")
    assert row["local"] == "2026-03-29T03:00:00+02:00"
    both = Recurrence(cron="30 2 * * *", timezone=BERLIN, dst_repeat=DstRepeat.BOTH)
    rows = explain(both, utc("2026-10-24T12:00Z"), 2, "job")
    assert [r["local"] for r in rows] == ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"]


# --------------------------------------------------------------------------------------------
# Explain notes

NOTE_CASES: list[tuple[str, Recurrence, str, list[str | None]]] = [
    (
        "gap-shift",
        Recurrence(cron="30 2 * * *", timezone=BERLIN),
        "2026-03-28T12:00Z",
        ["02:30 does not exist on 2026-03-29 in Europe/Berlin: shifted to 03:00", None],
    ),
    (
        "gap-skip",
        Recurrence(cron="30 2 * * *", timezone=BERLIN, dst_gap=DstGap.SKIP),
        "2026-03-28T12:00Z",
        ["skipped: 02:30 does not exist on 2026-03-29 in Europe/Berlin", None],
    ),
    (
        "gap-merged-shift",
        Recurrence(cron="*/30 * * * *", timezone=BERLIN),
        "2026-03-29T00:45Z",
        ["02:00 and 02:30 do not exist on 2026-03-29 in Europe/Berlin: merged into 03:00", None],
    ),
    (
        "gap-merged-skip",
        Recurrence(cron="*/20 * * * *", timezone=BERLIN, dst_gap=DstGap.SKIP),
        "2026-03-29T00:45Z",
        [
            "02:00, 02:20 and 02:40 do not exist on 2026-03-29 in Europe/Berlin: skipped (03:00 runs)",
            None,
        ],
    ),
    (
        "gap-six-times-named-all",
        Recurrence(cron="*/10 * * * *", timezone=BERLIN),
        "2026-03-29T00:55Z",
        [
            "02:00, 02:10, 02:20, 02:30, 02:40 and 02:50 do not exist on 2026-03-29 in Europe/Berlin: "
            "merged into 03:00",
            None,
        ],
    ),
    (
        "gap-seconds-named",
        Recurrence(cron="30 2 * * * 15", timezone=BERLIN),
        "2026-03-28T12:00Z",
        ["02:30:15 does not exist on 2026-03-29 in Europe/Berlin: shifted to 03:00", None],
    ),
    # Samoa skipped 2011-12-30 whole: the gap runs from the 30th, 00:00 to the 31st, 00:00.
    (
        "gap-a-whole-day-names-the-missing-day",
        Recurrence(cron="0 12 * * *", timezone="Pacific/Apia"),
        "2011-12-29T23:00Z",
        ["12:00 does not exist on 2011-12-30 in Pacific/Apia: shifted to 00:00", None],
    ),
    (
        "gap-many",
        Recurrence(cron="* * * * *", timezone=BERLIN),
        "2026-03-29T00:59Z",
        [
            "02:00, 02:01, 02:02, 02:03, 02:04, 02:05 and more do not exist on 2026-03-29 in "
            "Europe/Berlin: merged into 03:00",
            None,
        ],
    ),
    (
        "gap-lord-howe",
        Recurrence(cron="15 2 * * *", timezone=LORD_HOWE),
        "2026-10-03T00:00Z",
        ["02:15 does not exist on 2026-10-04 in Australia/Lord_Howe: shifted to 02:30", None],
    ),
    (
        "repeat-first",
        Recurrence(cron="30 2 * * *", timezone=BERLIN),
        "2026-10-24T12:00Z",
        [
            "02:30 happens twice on 2026-10-25 in Europe/Berlin: runs once, at the first (+02:00)",
            None,
        ],
    ),
    (
        "repeat-both",
        Recurrence(cron="30 1 * * *", timezone=NEW_YORK, dst_repeat=DstRepeat.BOTH),
        "2026-10-31T12:00Z",
        [
            "01:30 happens twice on 2026-11-01 in America/New_York: first of two runs (-04:00)",
            "01:30 happens twice on 2026-11-01 in America/New_York: second run (-05:00)",
            None,
        ],
    ),
    (
        "repeat-both-lord-howe",
        Recurrence(cron="45 1 * * *", timezone=LORD_HOWE, dst_repeat=DstRepeat.BOTH),
        "2026-04-04T00:00Z",
        [
            "01:45 happens twice on 2026-04-05 in Australia/Lord_Howe: first of two runs (+11:00)",
            "01:45 happens twice on 2026-04-05 in Australia/Lord_Howe: second run (+10:30)",
            None,
        ],
    ),
    (
        "every-never-noted",
        Recurrence(every_ms=HOUR, timezone=BERLIN, anchor_ms=utc("2026-03-29T00:00Z")),
        "2026-03-28T23:59Z",
        [None, None, None],
    ),
]


@pytest.mark.parametrize(
    ("rec", "now", "notes"), [pytest.param(r, n, e, id=i) for i, r, n, e in NOTE_CASES]
)
def test_explain_notes(rec: Recurrence, now: str, notes: list[str | None]) -> None:
    rows = explain(rec, utc(now), len(notes), "job")
    assert [r["note"] for r in rows] == notes
    assert all(set(r) == {"scheduled_ms", "due_ms", "local", "note"} for r in rows)


def test_explain_matches_next_occurrence_and_formats_local_times() -> None:
    rec = Recurrence(cron="0 9 * * 1-5", timezone=NEW_YORK, jitter_ms=5 * MIN)
    now = utc("2026-03-06T12:00Z")  # a Friday
    rows = explain(rec, now, 3, "job-1")
    occs = iterate(rec, now, 3, "job-1")
    assert [r["scheduled_ms"] for r in rows] == [o.scheduled_ms for o in occs]
    assert [r["due_ms"] for r in rows] == [o.due_ms for o in occs]
    assert [r["local"] for r in rows] == [
        "2026-03-06T09:00:00-05:00",
        "2026-03-09T09:00:00-04:00",  # Monday, after the change to EDT
        "2026-03-10T09:00:00-04:00",
    ]
    every = Recurrence(every_ms=90 * MIN + 250, anchor_ms=utc("2026-01-01T00:00Z") + 500)
    assert [r["local"] for r in explain(every, 0, 2, "j")] == [
        "2026-01-01T00:00:00.500+00:00",
        "2026-01-01T01:30:00.750+00:00",
    ]


def test_explain_stops_when_the_schedule_ends() -> None:
    rec = Recurrence(cron="0 * * * *", end_at_ms=utc("2026-01-01T02:00Z"))
    assert len(explain(rec, utc("2026-01-01T00:00Z"), 10, "j")) == 2
    assert explain(rec, utc("2026-01-01T00:00Z"), 0, "j") == []


# --------------------------------------------------------------------------------------------
# every


def test_every_is_utc_arithmetic_across_dst() -> None:
    anchor = utc("2026-03-28T23:30Z")
    rec = Recurrence(every_ms=HOUR, timezone=BERLIN, anchor_ms=anchor)
    got = iterate(rec, anchor - 1, 4)
    assert [o.scheduled_ms - anchor for o in got] == [0, HOUR, 2 * HOUR, 3 * HOUR]
    assert all(o.note is None and o.skipped is None for o in got)
    assert [r["local"] for r in explain(rec, anchor - 1, 4, "j")] == [
        "2026-03-29T00:30:00+01:00",
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:30:00+02:00",  # the wall clock jumps, the interval does not
        "2026-03-29T04:30:00+02:00",
    ]
    daily = Recurrence(every_ms=DAY, timezone=BERLIN, anchor_ms=utc("2026-10-24T10:00Z"))
    assert [r["local"] for r in explain(daily, 0, 2, "j")] == [
        "2026-10-24T12:00:00+02:00",
        "2026-10-25T11:00:00+01:00",
    ]


@pytest.mark.parametrize(
    ("anchor", "every", "after", "expected"),
    [
        (1_000, 500, 0, 1_000),  # after before the anchor: the anchor itself (k = 0)
        (1_000, 500, 999, 1_000),
        (1_000, 500, 1_000, 1_500),  # strictly after
        (1_000, 500, 1_001, 1_500),
        (1_000, 500, 1_499, 1_500),
        (1_000, 500, 1_500, 2_000),
        (1_000, 500, 10**12 + 7, 1_000 + 500 * ((10**12 + 7 - 1_000) // 500 + 1)),
        (1_000, 500, -(10**9), 1_000),
    ],
)
def test_every_first_occurrence(anchor: int, every: int, after: int, expected: int) -> None:
    occ = next_occurrence(Recurrence(every_ms=every, anchor_ms=anchor), after, "j")
    assert occ == Occurrence(expected, expected)


# --------------------------------------------------------------------------------------------
# start_at / end_at


@pytest.mark.parametrize(
    ("rec", "after", "expected"),
    [
        # cron, start_at between fires: the first fire at or after it
        (
            Recurrence(
                cron="0 * * * *",
                start_at_ms=utc("2026-01-01T10:30Z"),
                end_at_ms=utc("2026-01-01T12:00Z"),
            ),
            "2026-01-01T00:00Z",
            ["2026-01-01T11:00Z", "2026-01-01T12:00Z"],
        ),
        # start_at one millisecond after a fire: that fire is before the bounds
        (
            Recurrence(
                cron="0 * * * *",
                start_at_ms=utc("2026-01-01T10:00Z") + 1,
                end_at_ms=utc("2026-01-01T11:59Z"),
            ),
            "2026-01-01T00:00Z",
            ["2026-01-01T11:00Z"],
        ),
        (
            Recurrence(
                every_ms=HOUR,
                anchor_ms=utc("2026-01-01T00:00Z"),
                start_at_ms=utc("2026-01-01T10:00Z") + 1,
                end_at_ms=utc("2026-01-01T12:00Z"),
            ),
            "2026-01-01T00:00Z",
            ["2026-01-01T11:00Z", "2026-01-01T12:00Z"],
        ),
        # start_at exactly on a fire: included
        (
            Recurrence(
                cron="0 * * * *",
                start_at_ms=utc("2026-01-01T10:00Z"),
                end_at_ms=utc("2026-01-01T11:59Z"),
            ),
            "2026-01-01T00:00Z",
            ["2026-01-01T10:00Z", "2026-01-01T11:00Z"],
        ),
        # after past start_at: start_at no longer matters
        (
            Recurrence(
                cron="0 * * * *",
                start_at_ms=utc("2026-01-01T10:00Z"),
                end_at_ms=utc("2026-01-01T13:00Z"),
            ),
            "2026-01-01T12:00Z",
            ["2026-01-01T13:00Z"],
        ),
        # end_at is inclusive
        (
            Recurrence(cron="0 * * * *", end_at_ms=utc("2026-01-01T02:00Z")),
            "2026-01-01T00:00Z",
            ["2026-01-01T01:00Z", "2026-01-01T02:00Z"],
        ),
        (
            Recurrence(cron="0 * * * *", end_at_ms=utc("2026-01-01T02:00Z") - 1),
            "2026-01-01T00:00Z",
            ["2026-01-01T01:00Z"],
        ),
        # a shifted occurrence is bounded by its (shifted) scheduled time
        (
            Recurrence(cron="30 2 * * *", timezone=BERLIN, end_at_ms=utc("2026-03-29T00:59Z")),
            "2026-03-28T12:00Z",
            [],
        ),
        (
            Recurrence(
                cron="30 2 * * *",
                timezone=BERLIN,
                start_at_ms=utc("2026-03-29T00:45Z"),
                end_at_ms=utc("2026-03-29T01:00Z"),
            ),
            "2026-03-28T12:00Z",
            ["2026-03-29T01:00Z shift"],
        ),
        # every with start_at later than the anchor: the grid stays on the anchor
        (
            Recurrence(
                every_ms=HOUR,
                anchor_ms=utc("2026-01-01T00:00Z"),
                start_at_ms=utc("2026-01-01T10:30Z"),
                end_at_ms=utc("2026-01-01T12:00Z"),
            ),
            "2026-01-01T00:00Z",
            ["2026-01-01T11:00Z", "2026-01-01T12:00Z"],
        ),
    ],
)
def test_bounds(rec: Recurrence, after: str, expected: list[str]) -> None:
    assert [show(o) for o in iterate(rec, utc(after), 10)] == expected


def test_schedule_over() -> None:
    assert next_occurrence(Recurrence(cron="0 0 * * *", end_at_ms=5 * DAY), 5 * DAY, "j") is None
    assert next_occurrence(Recurrence(every_ms=HOUR, end_at_ms=HOUR), HOUR, "j") is None
    # no date matches (validate refuses these; still no crash, no endless loop)
    assert next_occurrence(Recurrence(cron="0 0 30 2 *"), 0, "j") is None
    # past year 9999
    assert next_occurrence(Recurrence(cron="0 0 * * *"), 253_402_300_799_000, "j") is None
    late = 253_402_300_799_000 - DAY
    assert (
        next_occurrence(Recurrence(cron="0 0 * * *", timezone="Pacific/Kiritimati"), late, "j")
        is None
    )


def test_rare_crons_and_aliases() -> None:
    leap = Recurrence(cron="0 0 29 2 *")
    assert [show(o) for o in iterate(leap, utc("2026-03-01T00:00Z"), 1)] == ["2028-02-29T00:00Z"]
    daily = Recurrence(cron="@daily", timezone=NEW_YORK)
    assert [show(o) for o in iterate(daily, utc("2026-03-07T12:00Z"), 2)] == [
        "2026-03-08T05:00Z",
        "2026-03-09T04:00Z",
    ]
    # day-of-month and day-of-week both restricted: either matches
    either = Recurrence(cron="0 0 13 * 5")
    assert [show(o) for o in iterate(either, utc("2026-02-01T00:00Z"), 3)] == [
        "2026-02-06T00:00Z",
        "2026-02-13T00:00Z",
        "2026-02-20T00:00Z",
    ]


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        # the 1st of each month, or its first Monday (2027-01-01 is a Friday)
        (
            "0 9 1 * 1#1",
            [
                "2027-01-01T09:00Z",
                "2027-01-04T09:00Z",
                "2027-02-01T09:00Z",
                "2027-03-01T09:00Z",
                "2027-04-01T09:00Z",
                "2027-04-05T09:00Z",
            ],
        ),
        # the 15th, or the second Friday
        (
            "0 0 15 * 5#2",
            [
                "2027-01-08T00:00Z",
                "2027-01-15T00:00Z",
                "2027-02-12T00:00Z",
                "2027-02-15T00:00Z",
                "2027-03-12T00:00Z",
                "2027-03-15T00:00Z",
            ],
        ),
        # the 13th, or the last Friday
        (
            "0 0 13 * L5",
            [
                "2027-01-13T00:00Z",
                "2027-01-29T00:00Z",
                "2027-02-13T00:00Z",
                "2027-02-26T00:00Z",
                "2027-03-13T00:00Z",
                "2027-03-26T00:00Z",
            ],
        ),
        # */2 is restricted too: odd days, or Mondays
        (
            "0 0 */2 * 1",
            [
                "2027-01-01T00:00Z",
                "2027-01-03T00:00Z",
                "2027-01-04T00:00Z",
                "2027-01-05T00:00Z",
                "2027-01-07T00:00Z",
                "2027-01-09T00:00Z",
            ],
        ),
    ],
)
def test_both_day_fields_restricted_match_either_also_with_hash_and_last(
    cron: str, expected: list[str]
) -> None:
    rec = Recurrence(cron=cron)
    assert [show(o) for o in iterate(rec, utc("2027-01-01T00:00Z") - 1, 6)] == expected


# --------------------------------------------------------------------------------------------
# Jitter


PINNED_JITTER = 89_530  # blake2b(person=b"schedd-jitter", "job-1@1800000000000") % 300000


def test_jitter_is_stable_and_in_range() -> None:
    # pinned: the same on every node and in every version (a change would move every job)
    assert jitter_for("job-1", 1_800_000_000_000, 300_000) == jitter_for(
        "job-1", 1_800_000_000_000, 300_000
    )
    assert jitter_for("job-1", 1_800_000_000_000, 300_000) == PINNED_JITTER
    values = [jitter_for("job-1", t * MIN, 60_000) for t in range(2000)]
    assert all(0 <= v < 60_000 for v in values)
    assert len(set(values)) > 1900  # spread, not constant
    assert jitter_for("job-1", 1, 60_000) != jitter_for("job-2", 1, 60_000)
    assert jitter_for("job-1", 12345, 0) == 0
    assert jitter_for("job-1", 12345, 1) == 0
    assert {jitter_for("j", t, 2) for t in range(50)} == {0, 1}  # even 2 ms is a spread


def test_occurrences_carry_the_jitter_but_skipped_ones_do_not() -> None:
    rec = Recurrence(cron="30 * * * *", timezone=BERLIN, dst_gap=DstGap.SKIP, jitter_ms=10 * MIN)
    got = iterate(rec, utc("2026-03-28T23:00Z"), 5)
    for occ in got:
        if occ.skipped:
            assert occ.due_ms == occ.scheduled_ms
        else:
            assert occ.due_ms == occ.scheduled_ms + jitter_for("job", occ.scheduled_ms, 10 * MIN)
    assert sum(1 for o in got if o.skipped) == 1
    assert iterate(rec, utc("2026-03-28T23:00Z"), 5) == got  # stable across calls


# --------------------------------------------------------------------------------------------
# Misfire


def _occs(*minutes: int, skipped_at: tuple[int, ...] = ()) -> list[Occurrence]:
    return [
        Occurrence(m * MIN, m * MIN, skipped="dst_gap" if m in skipped_at else None)
        for m in minutes
    ]


MISSED = _occs(10, 20, 30, 40, 50)
NOW = 60 * MIN

# (id, policy, window in minutes, missed, expected run minutes, expected skip minutes)
MISFIRE_CASES: list[tuple[str, Misfire, int | None, list[Occurrence], list[int], list[int]]] = [
    ("skip", Misfire.SKIP, None, MISSED, [], [10, 20, 30, 40, 50]),
    ("skip-window", Misfire.SKIP, 25, MISSED, [], [10, 20, 30, 40, 50]),
    ("run_once", Misfire.RUN_ONCE, None, MISSED, [50], [10, 20, 30, 40]),
    ("run_once-window-covers", Misfire.RUN_ONCE, 10, MISSED, [50], [10, 20, 30, 40]),
    ("run_once-window-too-old", Misfire.RUN_ONCE, 9, MISSED, [], [10, 20, 30, 40, 50]),
    ("run_all", Misfire.RUN_ALL, None, MISSED, [10, 20, 30, 40, 50], []),
    ("run_all-window", Misfire.RUN_ALL, 30, MISSED, [30, 40, 50], [10, 20]),
    ("run_all-window-edge-inclusive", Misfire.RUN_ALL, 40, MISSED, [20, 30, 40, 50], [10]),
    ("run_all-window-zero", Misfire.RUN_ALL, 0, MISSED, [], [10, 20, 30, 40, 50]),
    ("run_all-window-huge", Misfire.RUN_ALL, 10**6, MISSED, [10, 20, 30, 40, 50], []),
    ("empty-run_all", Misfire.RUN_ALL, None, [], [], []),
    ("empty-run_once", Misfire.RUN_ONCE, None, [], [], []),
    (
        "run_once-last-is-dst-skipped",
        Misfire.RUN_ONCE,
        None,
        _occs(10, 20, 30, skipped_at=(30,)),
        [20],
        [10, 30],
    ),
    (
        "run_all-dst-skipped-never-runs",
        Misfire.RUN_ALL,
        None,
        _occs(10, 20, 30, skipped_at=(20,)),
        [10, 30],
        [20],
    ),
    ("unordered-input", Misfire.RUN_ONCE, None, _occs(30, 10, 20), [30], [10, 20]),
]


@pytest.mark.parametrize(
    ("policy", "window", "missed", "run", "skip"),
    [pytest.param(p, w, m, r, s, id=i) for i, p, w, m, r, s in MISFIRE_CASES],
)
def test_plan_misfire(
    policy: Misfire, window: int | None, missed: list[Occurrence], run: list[int], skip: list[int]
) -> None:
    plan = plan_misfire(policy, missed, NOW, None if window is None else window * MIN)
    assert isinstance(plan, MisfirePlan)
    assert [o.scheduled_ms // MIN for o in plan.run] == run
    assert [o.scheduled_ms // MIN for o in plan.skip] == skip
    # every missed occurrence is accounted for exactly once
    assert sorted(plan.run + plan.skip, key=lambda o: o.scheduled_ms) == sorted(
        missed, key=lambda o: o.scheduled_ms
    )


# --------------------------------------------------------------------------------------------
# Construction


def test_recurrence_from_cron() -> None:
    schedule = Schedule(kind=ScheduleKind.CRON, cron="0 2 * * *", timezone=BERLIN)
    options = RecurringOptions(
        jitter_ms=5 * MIN,
        dst_gap=DstGap.SKIP,
        dst_repeat=DstRepeat.BOTH,
        start_at_ms=1_000,
        end_at_ms=2_000,
    )
    assert recurrence_from(schedule, options, 123) == Recurrence(
        cron="0 2 * * *",
        timezone=BERLIN,
        jitter_ms=5 * MIN,
        dst_gap=DstGap.SKIP,
        dst_repeat=DstRepeat.BOTH,
        start_at_ms=1_000,
        end_at_ms=2_000,
        anchor_ms=1_000,
    )


def test_recurrence_from_every_anchors_on_start_at_or_the_submit_time() -> None:
    schedule = Schedule(kind=ScheduleKind.EVERY, every_ms=HOUR)
    rec = recurrence_from(schedule, RecurringOptions(), 5_000)
    assert (rec.every_ms, rec.cron, rec.anchor_ms) == (HOUR, None, 5_000)
    # asked after the submit time, the first fire is one interval later
    assert next_occurrence(rec, 5_000, "j") == Occurrence(5_000 + HOUR, 5_000 + HOUR)
    rec = recurrence_from(schedule, RecurringOptions(start_at_ms=DAY), 5_000)
    assert rec.anchor_ms == DAY
    assert next_occurrence(rec, 5_000, "j") == Occurrence(DAY, DAY)  # fires at start_at


@pytest.mark.parametrize("kind", [ScheduleKind.NOW, ScheduleKind.AT, ScheduleKind.IN])
def test_recurrence_from_refuses_one_off_schedules(kind: ScheduleKind) -> None:
    with pytest.raises(ValueError, match="does not recur"):
        recurrence_from(Schedule(kind=kind, at_ms=1), RecurringOptions(), 0)


@pytest.mark.parametrize(
    "schedule",
    [Schedule(kind=ScheduleKind.EVERY), Schedule(kind=ScheduleKind.CRON)],
    ids=["every-without-interval", "cron-without-expression"],
)
def test_recurrence_from_says_a_schedule_without_its_interval_or_cron_does_not_recur(
    schedule: Schedule,
) -> None:
    with pytest.raises(ValueError) as caught:
        recurrence_from(schedule, RecurringOptions(), 0)
    assert str(caught.value) == (
        f"recurrence_from: a {schedule.kind.value} schedule does not recur"
    )


ONE_OF = "Recurrence: expected exactly one of every_ms and cron"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, ONE_OF),
        ({"every_ms": 1, "cron": "* * * * *"}, ONE_OF),
        ({"every_ms": 0}, "Recurrence: every_ms must be positive, got 0"),
        ({"every_ms": -5}, "Recurrence: every_ms must be positive, got -5"),
        ({"every_ms": 1000, "jitter_ms": -1}, "Recurrence: jitter_ms must not be negative, got -1"),
    ],
)
def test_recurrence_refuses_nonsense_saying_why(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Recurrence(**kwargs)
    assert str(caught.value) == message


def test_an_interval_of_one_millisecond_is_allowed() -> None:
    rec = Recurrence(every_ms=1, anchor_ms=10)
    assert [o.scheduled_ms for o in iterate(rec, 10, 3)] == [11, 12, 13]
