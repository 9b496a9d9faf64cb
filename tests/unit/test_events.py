"""The changes each entry makes (``schedd.core.events``): what is noted as ``apply`` changes
the state, the same on the state in dicts and in SQLite; the ring a node keeps of them, with
its horizon; and the coalescing and filtering of what a client is sent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from schedd.core import commands
from schedd.core.events import (
    Change,
    ChangeLog,
    EventFilter,
    EventRing,
    coalesce,
    parse_kinds,
)
from schedd.core.model import Job, JobSpec, RetryPolicy, Run
from schedd.core.state import MemoryState, State
from schedd.raft.feed import EventFeed
from schedd.storage.sqlstate import SqlState
from tests.unit.test_state import T0, Harness, lease_one

RUN = f"J1@{T0}"


class Noted(Harness):
    """A harness whose state notes its changes: ``entries`` holds what each entry changed."""

    def __init__(self, state: State | None = None) -> None:
        super().__init__()
        if state is not None:
            self.state = state
        self.entries: list[tuple[int, list[Change]]] = []
        self.state.changes = ChangeLog(
            lambda index, noted: self.entries.append((index, noted.changes()))
        )

    def last(self) -> list[tuple[str, str, tuple[Any, ...]]]:
        index, changes = self.entries[-1]
        assert index == self.index and all(c.entry == index for c in changes)
        return [(c.kind, c.key, c.fields) for c in changes]


def run_fields(state: str, attempt: int = 0, fence: int | None = None, **kw: Any) -> tuple:
    worker = kw.get("worker", "w1" if attempt else None)
    return (state, attempt, fence, worker, kw.get("due", T0), kw.get("updated", T0), None, False)


def test_a_submit_notes_the_job_and_its_run_once_each_as_the_entry_left_them() -> None:
    h = Noted()
    h.submit()
    assert h.last() == [
        ("job", "J1", ("active", T0, T0, "default", "t", None, False)),
        ("run", RUN, run_fields("scheduled")),
    ]
    [_, run] = h.entries[-1][1]
    assert (run.job_id, run.namespace) == ("J1", "default")


def test_fire_lease_and_result_each_note_the_run_with_its_attempt_and_fence() -> None:
    h = Noted()
    lf = h.claim()
    assert h.last() == [("cluster", "", ("n1", 1, ""))]
    h.submit()
    fence = lease_one(h, lf, RUN)
    [(_, fired), (_, leased)] = h.entries[-2:]
    assert [(c.kind, c.fields[0]) for c in fired] == [("run", "queued")]
    assert [(c.kind, c.fields[:4]) for c in leased] == [("run", ("running", 1, fence, "w1"))]
    h.one(commands.CompleteRun(h.rid(), T0 + 5, lf, RUN, fence, {"ok": 1}))
    kinds = {(kind, key): fields for kind, key, fields in h.last()}
    assert kinds[("run", RUN)][:3] == ("succeeded", 1, fence)
    assert kinds[("job", "J1")][0] == "done"  # a one-off job is done with its run


def test_a_progress_report_and_an_entry_that_changes_nothing_are_no_change() -> None:
    h = Noted()
    lf = h.claim()
    h.submit()
    fence = lease_one(h, lf, RUN)
    count = len(h.entries)
    h.one(commands.Progress(h.rid(), T0 + 1, lf, ((RUN, fence, {"done": 3}),)))
    h.one(commands.Barrier(h.rid(), T0 + 2))
    assert len(h.entries) == count


def test_a_run_that_fails_for_good_enters_the_dlq_and_a_replay_takes_it_out() -> None:
    h = Noted()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    fence = lease_one(h, lf, RUN)
    h.one(commands.FailRun(h.rid(), T0 + 1, lf, RUN, fence, "boom", False))
    noted = {(kind, key): fields for kind, key, fields in h.last()}
    assert noted[("dlq", RUN)] == (True,) and noted[("run", RUN)][0] == "failed"
    h.one(commands.Replay(h.rid(), T0 + 2, RUN))
    noted = {(kind, key): fields for kind, key, fields in h.last()}
    assert noted[("dlq", RUN)] == (False,) and noted[("run", RUN)][0] == "queued"


def test_two_changes_of_one_run_in_one_entry_are_one_with_the_latest_state() -> None:
    h = Noted()
    lf = h.claim()
    h.submit()
    h.apply(
        commands.Fire(h.rid(), T0, lf, (RUN,)),
        commands.LeaseRuns(h.rid(), T0, lf, ((RUN, "w1"),)),
    )
    assert [(k, key, f[0]) for k, key, f in h.last()] == [("run", RUN, "running")]


def _story(h: Noted) -> None:
    lf = h.claim()
    h.submit("J1", JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    h.submit("J2", JobSpec(task="u", namespace="b"))
    fence = lease_one(h, lf, RUN)
    h.one(commands.FailRun(h.rid(), T0 + 1, lf, RUN, fence, "boom", False))
    h.one(commands.UpdateJob(h.rid(), T0 + 2, "J2", paused=True))
    h.one(commands.CancelJob(h.rid(), T0 + 3, "J2"))
    h.one(commands.DropDead(h.rid(), T0 + 4, RUN))
    h.one(commands.Purge(h.rid(), T0 + 10_000, lf, T0 + 9_000, 1000, 100))


def test_every_state_notes_the_same_changes_for_the_same_entries() -> None:
    in_dicts, in_sqlite = Noted(MemoryState()), Noted(SqlState(":memory:"))
    for h in (in_dicts, in_sqlite):
        _story(h)
    assert in_dicts.entries == in_sqlite.entries
    forgotten = [c.key for _, changes in in_dicts.entries for c in changes if c.fields[-1] is True]
    assert "J2" in forgotten  # the purge forgets the cancelled job, and says so


def test_the_core_changes_a_stored_job_only_through_put_job() -> None:
    core = Path(__file__).resolve().parents[2] / "schedd" / "core"
    offenders = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(core.glob("*.py"))
        if path.name != "state.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.jobs\[[^\]]+\]\s*=[^=]", line)
    ]
    assert not offenders, offenders


# -- the ring -------------------------------------------------------------------------------------


def change(entry: int, key: str = "r", kind: str = "run", state: str = "queued") -> Change:
    return Change(entry, kind, key, "j", "default", (state,))


def test_the_ring_holds_the_latest_changes_and_says_when_a_position_is_too_old() -> None:
    ring = EventRing(size=4, horizon=10)
    assert ring.pull(9, 100) is None  # before the ring began: unknown
    assert ring.pull(10, 100) == ([], 10, None)
    for entry in (11, 12, 13):
        ring.append(entry, [change(entry, "a"), change(entry, "b")])
    # 6 changes > 4: entry 11 went, so a client at 10 missed it; one at 11 did not
    assert ring.horizon == 11 and len(ring) == 4
    assert ring.pull(10, 100) is None
    pulled = ring.pull(11, 100)
    assert pulled is not None and pulled.upto == 13
    assert [(c.entry, c.key) for c in pulled.changes] == [
        (12, "a"),
        (12, "b"),
        (13, "a"),
        (13, "b"),
    ]
    assert ring.pull(13, 100) == ([], 13, None)
    assert ring.pull(13, 100, upto=20) == ([], 13, 20)  # bounded: every entry to 20 pulled


def test_a_pull_stops_after_whole_entries_once_it_has_enough() -> None:
    ring = EventRing(size=100)
    for entry in (1, 2, 3):
        ring.append(entry, [change(entry, "a"), change(entry, "b")])
    first = ring.pull(0, 3, upto=9)
    assert first is not None and first.upto == 2 and len(first.changes) == 4
    assert first.reached is None  # entry 3 is left: the pull did not reach 9
    rest = ring.pull(first.upto, 3, upto=9)
    assert rest is not None and rest.upto == 3 and len(rest.changes) == 2
    assert rest.reached == 9


def test_an_entry_larger_than_the_ring_is_kept_whole_and_replays_are_ignored() -> None:
    ring = EventRing(size=2)
    ring.append(5, [change(5, k) for k in "abc"])
    assert len(ring) == 3 and ring.horizon == 0
    ring.append(6, [change(6)])
    assert len(ring) == 1 and ring.horizon == 5
    ring.append(6, [change(6, "again")])  # applied again after a restart: never twice
    ring.append(4, [change(4)])
    assert [c.key for c in ring] == ["r"]


def test_a_restart_forgets_everything_up_to_the_new_horizon() -> None:
    ring = EventRing(size=10)
    ring.append(1, [change(1)])
    ring.restart(50)
    assert len(ring) == 0 and ring.pull(1, 10) is None and ring.pull(50, 10) == ([], 50, None)
    with pytest.raises(ValueError):
        EventRing(size=0)


# -- what a client is sent ----------------------------------------------------------------------


def test_coalescing_keeps_each_record_once_with_its_latest_change_grouped_by_kind() -> None:
    changes = [
        change(1, "r1", state="scheduled"),
        Change(1, "job", "j", "j", "default", ("active",)),
        change(2, "r2", state="queued"),
        change(3, "r1", state="running"),
        Change(3, "cluster", "", "", "", ("n2", 2, "")),
        Change(4, "dlq", "r2", "j", "default", (True,)),
    ]
    batch = coalesce(changes, EventFilter())
    assert [(kind, [(c.key, c.entry) for c in cs]) for kind, cs in batch] == [
        ("cluster", [("", 3)]),
        ("job", [("j", 1)]),
        ("run", [("r2", 2), ("r1", 3)]),  # r1 last: its latest change is the latest
        ("dlq", [("r2", 4)]),
    ]


def test_filters_by_kind_job_and_namespace_keep_cluster_changes_unless_left_out() -> None:
    changes = [
        Change(1, "run", "a@1", "a", "x", ("queued",)),
        Change(2, "run", "b@1", "b", "y", ("queued",)),
        Change(3, "dlq", "a@1", "a", "x", (True,)),
        Change(4, "cluster", "", "", "", ("n1", 1, "")),
    ]

    def keys(wanted: EventFilter) -> list[tuple[str, str]]:
        return [(c.kind, c.key) for _, cs in coalesce(changes, wanted) for c in cs]

    assert keys(EventFilter(job_id="a")) == [("cluster", ""), ("run", "a@1"), ("dlq", "a@1")]
    assert keys(EventFilter(namespace="y")) == [("cluster", ""), ("run", "b@1")]
    assert keys(EventFilter(kinds=frozenset({"run", "dlq"}), namespace="x")) == [
        ("run", "a@1"),
        ("dlq", "a@1"),
    ]


@pytest.mark.parametrize("raw", ["", "runs", "run,", "run, dlq", "RUN"])
def test_only_a_plain_comma_separated_list_of_kinds_is_taken(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_kinds(raw)
    assert parse_kinds("run,dlq,run") == frozenset({"run", "dlq"})


def test_a_gated_feed_hands_out_an_entry_once_the_reads_see_it() -> None:
    feed = EventFeed(size=100, horizon=10, gated=True)
    feed.append(11, [change(11, "a")])
    feed.append(12, [change(12, "b")])
    assert feed.pull(10, 100) == ([], 10, 10)  # applied, not yet committed: nothing
    feed.visible_upto(11)
    pulled = feed.pull(10, 100)
    assert pulled is not None and pulled.upto == 11 and [c.key for c in pulled.changes] == ["a"]
    feed.visible_upto(5)  # never backwards
    feed.visible_upto(12)
    assert feed.pull(11, 100) is not None and feed.pull(11, 100).upto == 12  # type: ignore[union-attr]
    feed.restart(50)  # a snapshot: what the reads see starts there
    feed.append(51, [change(51)])
    assert feed.pull(50, 100) == ([], 50, 50)
    ungated = EventFeed(size=100)
    ungated.append(1, [change(1)])
    assert ungated.pull(0, 100) is not None and ungated.pull(0, 100).upto == 1  # type: ignore[union-attr]


def test_an_entry_nobody_pulls_is_kept_as_noted_and_made_into_changes_once() -> None:
    """A node nobody follows keeps each entry's records' fields (not the records: a payload or a
    result would stay in memory with them); the changes are made the first time a stream pulls
    them, the same for every later stream."""
    kept: list[Any] = []
    h = Harness()
    h.state.changes = ChangeLog(lambda index, noted: kept.append(noted))
    h.submit("J1")
    [noted] = kept
    assert noted._changes == [] and len(noted) == 2  # nothing made yet: a job and its run
    held = [v for entry in noted._noted for v in (*entry[:4], *entry[4])]
    assert not any(isinstance(v, Job | Run | JobSpec) for v in held)
    ring = EventRing(size=100)
    ring.append(noted.index, noted)
    first = ring.pull(0, 10)
    assert first is not None and [c.kind for c in first.changes] == ["job", "run"]
    again = ring.pull(0, 10)
    assert again is not None and again.changes == first.changes
    assert again.changes[0] is first.changes[0] and len(ring) == 2
