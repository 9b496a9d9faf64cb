"""The leader's decisions as scenarios: :class:`schedd.leader.core.LeaderCore` driven by hand.

No loop, no Raft, no socket: the test owns the clock and the log.  Each command the core asks to
commit waits in ``Sim.pending`` until the test commits it (applied by the real ``apply`` to an
in-memory state, its events handed to the core before its result, as the Raft thread does) or
loses it; each frame the core sends is recorded with its connection.  The scenarios are the
correctness arguments the leader relies on, one by one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from schedd.config import load_config
from schedd.core import commands
from schedd.core.apply import apply_entry
from schedd.core.model import AttemptOutcome, JobSpec, Priority, RunState, Schedule, ScheduleKind
from schedd.core.state import STALE_LEADER, MemoryState, Ok, Rejected, Result, RunReady
from schedd.leader import core as leader_core
from schedd.leader.core import (
    REBUILD_GRACE_S,
    Action,
    Close,
    Commit,
    Lag,
    LeaderCore,
    LeaseLost,
    Level,
    Log,
    Now,
    Observation,
    ResultCount,
    Send,
    StepDown,
    Wake,
)
from schedd.leader.progress import PROGRESS_PERIOD_S
from schedd.leader.workers import WorkerConn
from schedd.protocol import messages
from schedd.runtime import leader_settings

T0 = 1_800_000_000_000
S = 1000  # ms
#: the leader's settings at the config's defaults, but firing on time (no dispatch ahead)
DEFAULTS = replace(leader_settings(load_config(None, env={})), ahead_ms=0)
M = TypeVar("M", bound=messages.Message)


class Sim:
    """One leader core over an in-memory replicated state, with the clock and the log in the
    test's hands."""

    def __init__(self, state: MemoryState | None = None, **options: Any) -> None:
        self.state = state or MemoryState()
        self.index = self.state.applied_index
        self.wall, self.mono = T0, 1_000.0
        self.pending: list[Commit] = []
        self.sent: list[tuple[WorkerConn, messages.Message]] = []
        self.stepped_down: list[str] = []
        self.wakes = 0
        self.logged: list[Log] = []
        self.observed: list[Observation] = []
        self.rids = itertools.count()
        self.core: LeaderCore | None = None
        [claim] = self.log(commands.Claim(f"claim{self.index}", self.wall, "n1", 1, "http://n1"))
        assert isinstance(claim, Ok)
        self.core = LeaderCore(
            lambda: nullcontext(self.state),
            int(claim.value),
            self.now,
            replace(DEFAULTS, **options),
            rand=lambda: 0.5,
            rid=lambda: f"L{next(self.rids)}",
        )
        self.do(self.core.rebuild(self.now))

    @property
    def now(self) -> Now:
        return Now(self.wall, self.mono)

    @property
    def leader(self) -> LeaderCore:
        assert self.core is not None
        return self.core

    def advance(self, seconds: float) -> None:
        self.wall += round(seconds * S)
        self.mono += seconds

    def log(self, *cmds: commands.Command) -> list[Result]:
        """Append one entry and apply it; the core sees its events first."""
        self.index += 1
        results, events = apply_entry(self.state, commands.encode_entry(list(cmds)), self.index)
        if self.core is not None:
            self.do(self.core.on_events(self.index, events))
        return results

    def do(self, actions: Iterable[Action]) -> None:
        for act in actions:
            if isinstance(act, Commit):
                self.pending.append(act)
            elif isinstance(act, Send):
                self.sent.append((act.conn, act.msg))
            elif isinstance(act, Close):
                act.conn.close(discard=act.discard)
            elif isinstance(act, StepDown):
                self.stepped_down.append(act.reason)
            elif isinstance(act, Wake):
                self.wakes += 1
            elif isinstance(act, Log):
                self.logged.append(act)
            else:
                self.observed.append(act)

    def asked(self, kind: type[Any]) -> list[Any]:
        """The commands of ``kind`` waiting to be committed."""
        return [p.cmd for p in self.pending if isinstance(p.cmd, kind)]

    def commit(self) -> list[Result]:
        """Commit everything the core asked for, in order, an entry each."""
        todo, self.pending = self.pending, []
        results = []
        for act in todo:
            [res] = self.log(act.cmd)
            results.append(res)
            self.do(self.leader.committed(act.then, res, self.now))
        return results

    def lose(self) -> None:
        """Nothing the core asked for is committed (no quorum, a timeout)."""
        todo, self.pending = self.pending, []
        for act in todo:
            self.do(self.leader.committed(act.then, None, self.now))

    def tick(self) -> None:
        self.do(self.leader.tick(self.now))

    def settle(self) -> None:
        """Tick and commit until the core asks for nothing more (bounded)."""
        for _ in range(20):
            self.tick()
            if not self.pending:
                return
            self.commit()
        raise AssertionError(f"still asking after 20 rounds: {self.pending}")

    def submit(self, job_id: str = "J1", in_s: float = 0.0, task: str = "t", **spec: Any) -> str:
        at = self.wall + round(in_s * S)
        schedule = Schedule(kind=ScheduleKind.AT, at_ms=at) if in_s else Schedule()
        job = JobSpec(task=task, schedule=schedule, **spec)
        [res] = self.log(commands.Submit(f"s{job_id}", self.wall, ((job_id, job),)))
        assert isinstance(res, Ok), res
        return f"{job_id}@{at}"

    def connect(
        self,
        worker_id: str = "w1",
        capacity: int = 1,
        resume: tuple[messages.LeaseRef, ...] = (),
        tasks: frozenset[str] | None = None,
    ) -> WorkerConn:
        conn = WorkerConn(worker_id, ("default",), capacity, self.wall, tasks)
        self.do(self.leader.connect(conn, resume, self.now))
        return conn

    def frames(self, conn: WorkerConn, kind: type[M]) -> list[M]:
        return [msg for to, msg in self.sent if to is conn and isinstance(msg, kind)]

    def run(self, run_id: str) -> Any:
        return self.state.runs[run_id]

    def only_lease(self, conn: WorkerConn) -> messages.Lease:
        [lease] = self.frames(conn, messages.Lease)
        return lease

    def not_pending(self) -> bool:
        return not self.pending


def leased(sim: Sim, conn: WorkerConn, **spec: Any) -> tuple[str, messages.Lease]:
    """A run submitted now, fired, leased to ``conn`` and sent to it."""
    run_id = sim.submit(**spec)
    sim.settle()
    return run_id, sim.only_lease(conn)


# -- firing -----------------------------------------------------------------------------------
def test_a_run_fires_when_it_is_due_and_not_a_tick_before() -> None:
    sim = Sim()
    run_id = sim.submit(in_s=2)
    sim.advance(1.99)
    sim.tick()
    assert sim.asked(commands.Fire) == []
    sim.advance(0.01)
    sim.tick()
    assert [f.run_ids for f in sim.asked(commands.Fire)] == [(run_id,)]
    sim.commit()
    assert sim.run(run_id).state is RunState.QUEUED
    # observed, for the shell's metrics: fired on time, in its queue and priority
    assert sim.observed == [Lag("fire", 0.0, "default", "normal", sim.now.mono, T0 + 2 * S)]


def test_the_loop_sleeps_until_the_next_due_run_and_no_longer_than_its_idle_period() -> None:
    sim = Sim()
    assert sim.leader.sleep_for(sim.now) == leader_core.IDLE_S
    sim.submit(in_s=0.1)
    assert sim.leader.sleep_for(sim.now) == pytest.approx(0.1)
    sim.submit("J2", in_s=60)
    assert sim.leader.sleep_for(sim.now) == pytest.approx(0.1)


def test_a_fire_that_was_not_committed_goes_back_into_the_wheel() -> None:
    sim = Sim()
    run_id = sim.submit()
    sim.tick()
    assert [f.run_ids for f in sim.asked(commands.Fire)] == [(run_id,)]
    sim.lose()
    assert run_id in sim.leader.wheel
    sim.tick()
    assert [f.run_ids for f in sim.asked(commands.Fire)] == [(run_id,)]  # asked again, not lost


def test_a_fire_refused_because_this_clock_stepped_back_is_fired_again_when_due() -> None:
    sim = Sim()
    run_id = sim.submit(in_s=5)
    sim.advance(5)
    sim.tick()
    [act] = [p for p in sim.pending if isinstance(p.cmd, commands.Fire)]
    sim.pending = [replace(act, cmd=replace(act.cmd, now=T0))]
    sim.commit()  # applied with a time before the run's due time: refused, "not due yet"
    assert sim.run(run_id).state is RunState.SCHEDULED
    sim.tick()
    assert [f.run_ids for f in sim.asked(commands.Fire)] == [(run_id,)]


# -- leasing ----------------------------------------------------------------------------------
def test_a_queued_run_is_leased_to_a_worker_with_room_and_sent_on_its_connection() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn, payload={"n": 1})
    run = sim.run(run_id)
    assert run.state is RunState.RUNNING and run.current.worker_id == "w1"
    assert (lease.run_id, lease.fence, lease.payload) == (run_id, run.current.fence, {"n": 1})
    assert conn.leases == {run_id: lease.fence}
    assert sim.leader.leases[run_id].worker_id == "w1"


def test_room_reserved_while_a_lease_commits_is_not_given_again() -> None:
    sim = Sim()
    conn = sim.connect(capacity=1)
    first, second = sim.submit("J1"), sim.submit("J2")
    sim.tick()
    sim.commit()  # both fired, both queued
    sim.tick()
    [grant] = sim.asked(commands.LeaseRuns)
    sim.tick()  # the lease is not committed yet: the worker's one slot is reserved
    assert len(sim.asked(commands.LeaseRuns)) == 1
    sim.commit()
    sim.tick()
    assert sim.asked(commands.LeaseRuns) == []  # full: its lease is held
    held = sim.only_lease(conn)
    sim.do(sim.leader.finish(conn, messages.Complete(held.run_id, held.fence), sim.now))
    sim.commit()
    sim.tick()
    [nxt] = sim.asked(commands.LeaseRuns)
    assert {grant.grants[0][0], nxt.grants[0][0]} == {first, second}


def test_a_lease_that_was_not_committed_is_queued_again_and_frees_its_room() -> None:
    sim = Sim()
    conn = sim.connect(capacity=1)
    run_id = sim.submit()
    sim.tick()
    sim.commit()
    sim.tick()
    assert len(sim.asked(commands.LeaseRuns)) == 1
    sim.lose()
    assert conn.reserved == 0 and conn.free == 1
    sim.tick()
    [again] = sim.asked(commands.LeaseRuns)
    assert again.grants == ((run_id, "w1"),)


def test_a_namespace_at_its_concurrency_cap_gets_no_more_leases_until_one_ends() -> None:
    sim = Sim(caps={"default": 1})
    one, two = sim.connect("w1"), sim.connect("w2")
    sim.submit("J1")
    sim.submit("J2")
    sim.settle()
    assert len(sim.frames(one, messages.Lease) + sim.frames(two, messages.Lease)) == 1
    [(conn, lease)] = [(k, f) for k, f in sim.sent if isinstance(f, messages.Lease)]
    sim.do(sim.leader.finish(conn, messages.Complete(lease.run_id, lease.fence), sim.now))
    sim.settle()
    assert len(sim.frames(one, messages.Lease) + sim.frames(two, messages.Lease)) == 2


def test_a_run_leased_to_a_worker_that_left_meanwhile_is_kept_for_its_return() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id = sim.submit()
    sim.tick()
    sim.commit()
    sim.tick()  # the lease is being committed ...
    sim.do(sim.leader.disconnect(conn))  # ... when the socket closes
    sim.commit()
    assert sim.frames(conn, messages.Lease) == []
    assert sim.leader.leases[run_id].worker_id == "w1"  # it may resume it, or it expires


def test_a_worker_is_leased_only_runs_of_the_tasks_it_serves() -> None:
    sim = Sim()
    reports = sim.connect("w1", capacity=4, tasks=frozenset({"reports"}))
    mail = sim.submit("J1", task="mail")
    report = sim.submit("J2", task="reports")
    sim.settle()
    assert [lz.run_id for lz in sim.frames(reports, messages.Lease)] == [report]
    assert sim.run(mail).state is RunState.QUEUED  # waits for a worker that runs it
    mailer = sim.connect("w2", capacity=4, tasks=frozenset({"mail"}))
    sim.settle()
    assert [lz.run_id for lz in sim.frames(mailer, messages.Lease)] == [mail]


def test_a_worker_that_does_not_say_its_tasks_is_leased_any() -> None:
    sim = Sim()
    anything = sim.connect("w1", capacity=4, tasks=None)
    ids = {sim.submit("J1", task="mail"), sim.submit("J2", task="reports")}
    sim.settle()
    assert {lz.run_id for lz in sim.frames(anything, messages.Lease)} == ids


def test_a_drained_worker_is_told_once_keeps_its_lease_and_is_leased_nothing_more() -> None:
    sim = Sim()
    conn = sim.connect("w1", capacity=2)
    held, _ = leased(sim, conn)
    sim.do(sim.leader.drain(conn))
    sim.do(sim.leader.drain(conn))  # again: the same, nothing new to say
    assert conn.draining and len(sim.frames(conn, messages.Drain)) == 1
    waiting = sim.submit("J2")
    sim.settle()
    assert [lz.run_id for lz in sim.frames(conn, messages.Lease)] == [held]
    assert sim.run(waiting).state is RunState.QUEUED and held in sim.leader.leases
    other = sim.connect("w2")
    sim.settle()
    assert sim.only_lease(other).run_id == waiting


def test_a_capacity_frame_lowers_and_raises_what_a_worker_is_leased() -> None:
    sim = Sim()
    conn = sim.connect("w1", capacity=2)
    sim.do(sim.leader.set_capacity(conn, 0))  # a front door gave its slots to another shard
    queued = [sim.submit(f"J{i}") for i in range(3)]
    sim.settle()
    assert sim.frames(conn, messages.Lease) == []
    assert all(sim.run(r).state is RunState.QUEUED for r in queued)
    sim.do(sim.leader.set_capacity(conn, 2))  # raised: leased at once, up to it
    sim.settle()
    assert len(sim.frames(conn, messages.Lease)) == 2
    sim.do(sim.leader.set_capacity(conn, 1))  # lowered below what it holds: nothing more
    one = sim.frames(conn, messages.Lease)[0]
    sim.do(sim.leader.finish(conn, messages.Complete(one.run_id, one.fence), sim.now))
    sim.settle()
    assert len(sim.frames(conn, messages.Lease)) == 2  # holds 1 = its capacity
    assert sum(sim.run(r).state is RunState.QUEUED for r in queued) == 1


# -- leases that end ----------------------------------------------------------------------------
def test_a_lease_without_heartbeats_ends_as_lost_and_its_worker_is_told_to_stop() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn, heartbeat_timeout_ms=3 * S)
    for _ in range(3):  # heartbeats keep it
        sim.advance(2)
        sim.do(sim.leader.heartbeat(conn, (messages.LeaseRef(run_id, lease.fence),), sim.now))
        sim.tick()
        assert sim.asked(commands.FailRun) == []
    sim.advance(3.01)
    sim.tick()
    [fail] = sim.asked(commands.FailRun)
    assert (fail.run_id, fail.fence, fail.outcome) == (run_id, lease.fence, "lost")
    assert LeaseLost("lost") in sim.observed
    [lost] = [entry for entry in sim.logged if entry.event == "run.lease_lost"]
    assert lost.level is Level.INFO and lost.fields["run_id"] == run_id
    assert sim.frames(conn, messages.Cancel) == [messages.Cancel(run_id, lease.fence)]
    sim.tick()
    assert len(sim.asked(commands.FailRun)) == 1  # being ended: asked once
    sim.commit()
    assert sim.run(run_id).state is RunState.RETRYING
    assert run_id not in sim.leader.leases and conn.leases == {}


def test_a_worker_that_let_a_lease_expire_gets_no_lease_until_it_is_heard_again() -> None:
    """Its connection stayed open (stopped, or cut off by a partition that leaves the socket
    hanging): each lease sent to it would be lost the same way, another worker must take the
    run; once a frame comes from it, it takes leases again."""
    sim = Sim()
    quiet = sim.connect("w1")
    run_id, _ = leased(sim, quiet, heartbeat_timeout_ms=3 * S)
    other = sim.connect("w2")
    sim.advance(3.01)
    sim.tick()
    sim.settle()  # lost: retried after its backoff
    assert sim.run(run_id).state is RunState.RETRYING
    sim.advance(60)
    sim.settle()
    assert sim.run(run_id).state is RunState.RUNNING
    assert sim.run(run_id).attempts[-1].worker_id == other.worker_id
    assert quiet.free == 0
    second = sim.submit("J2")  # w2 is busy (capacity 1), w1 silent: it waits
    sim.settle()
    assert sim.run(second).state is RunState.QUEUED
    sim.do(sim.leader.heard(quiet, sim.now))  # a frame from w1 (a heartbeat, say)
    assert quiet.free == 1
    sim.settle()
    assert sim.run(second).state is RunState.RUNNING
    assert sim.run(second).attempts[-1].worker_id == quiet.worker_id


def test_a_heartbeat_with_a_stale_fence_or_from_another_worker_does_not_keep_a_lease() -> None:
    sim = Sim()
    conn, other = sim.connect("w1"), sim.connect("w2")
    run_id, lease = leased(sim, conn, heartbeat_timeout_ms=3 * S)
    sim.advance(2)
    sim.do(sim.leader.heartbeat(conn, (messages.LeaseRef(run_id, lease.fence - 1),), sim.now))
    sim.do(sim.leader.heartbeat(other, (messages.LeaseRef(run_id, lease.fence),), sim.now))
    sim.advance(1.01)
    sim.tick()
    assert [f.run_id for f in sim.asked(commands.FailRun)] == [run_id]


def test_an_end_that_was_not_committed_is_asked_again() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, _ = leased(sim, conn, heartbeat_timeout_ms=S)
    sim.advance(1.01)
    sim.tick()
    assert len(sim.asked(commands.FailRun)) == 1
    sim.lose()
    sim.tick()
    assert [f.run_id for f in sim.asked(commands.FailRun)] == [run_id]


def test_a_run_past_its_timeout_is_cancelled_and_failed_as_timed_out() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn, timeout_ms=5 * S, heartbeat_timeout_ms=60 * S)
    sim.advance(5.01)
    sim.tick()
    [fail] = sim.asked(commands.FailRun)
    assert (fail.run_id, fail.outcome) == (run_id, "timed_out")
    assert sim.frames(conn, messages.Cancel) == [messages.Cancel(run_id, lease.fence)]
    sim.commit()
    assert sim.run(run_id).attempts[-1].outcome is AttemptOutcome.TIMED_OUT


def test_a_cancelled_job_tells_the_worker_running_it_to_stop() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    sim.log(commands.CancelJob("cancel", sim.wall, "J1"))
    assert sim.frames(conn, messages.Cancel) == [messages.Cancel(run_id, lease.fence)]
    assert run_id not in sim.leader.leases and conn.free == 1


# -- results ------------------------------------------------------------------------------------
def test_a_result_is_acked_once_applied_and_not_at_all_when_it_was_not_committed() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    sim.do(sim.leader.finish(conn, messages.Complete(run_id, lease.fence, {"ok": 1}), sim.now))
    assert sim.frames(conn, messages.Ack) == []  # not before the commit
    sim.lose()
    assert sim.frames(conn, messages.Ack) == []  # the worker keeps it and sends it again
    sim.do(sim.leader.finish(conn, messages.Complete(run_id, lease.fence, {"ok": 1}), sim.now))
    sim.commit()
    assert sim.frames(conn, messages.Ack) == [messages.Ack(run_id, True)]
    assert sim.run(run_id).state is RunState.SUCCEEDED
    assert [o for o in sim.observed if isinstance(o, ResultCount)] == [ResultCount(True)]
    assert run_id not in sim.leader.leases  # forgotten by the apply, before the ack


def test_a_result_racing_the_end_of_its_lease_the_first_applied_wins_the_other_is_refused() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn, heartbeat_timeout_ms=S)
    sim.advance(1.01)
    sim.tick()  # the leader ends the lease ...
    sim.do(
        sim.leader.finish(conn, messages.Complete(run_id, lease.fence), sim.now)
    )  # ... as it ends
    sim.commit()
    [ack] = sim.frames(conn, messages.Ack)
    assert not ack.accepted and ack.reason
    assert sim.run(run_id).state is RunState.RETRYING


# -- workers that reconnect --------------------------------------------------------------------
def test_a_worker_that_reconnects_with_its_lease_keeps_it() -> None:
    sim = Sim()
    conn = sim.connect(capacity=2)
    run_id, lease = leased(sim, conn, heartbeat_timeout_ms=3 * S)
    sim.do(sim.leader.disconnect(conn))
    sim.advance(2.5)
    again = sim.connect(capacity=2, resume=(messages.LeaseRef(run_id, lease.fence),))
    sim.advance(2)  # the hello counts as a heartbeat
    sim.tick()
    assert sim.asked(commands.FailRun) == [] and sim.frames(again, messages.Cancel) == []
    assert again.leases == {run_id: lease.fence} and again.free == 1


def test_a_lease_the_worker_reconnects_without_was_never_delivered_and_ends_at_once() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    sim.do(sim.leader.disconnect(conn))
    again = sim.connect()
    [fail] = sim.asked(commands.FailRun)
    assert (fail.run_id, fail.outcome) == (run_id, "lost")
    assert "never delivered" in fail.error
    assert sim.frames(again, messages.Cancel) == [messages.Cancel(run_id, lease.fence)]


def test_a_resumed_lease_that_is_no_longer_live_is_cancelled() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    sim.log(commands.CancelJob("cancel", sim.wall, "J1"))
    sim.do(sim.leader.disconnect(conn))
    again = sim.connect(resume=(messages.LeaseRef(run_id, lease.fence),))
    assert sim.frames(again, messages.Cancel) == [messages.Cancel(run_id, lease.fence)]
    assert again.leases == {}


def test_a_hello_with_the_id_of_a_connected_worker_replaces_its_connection_unsent_frames_dropped() -> (
    None
):
    sim = Sim()
    old = sim.connect()
    old.send(messages.Cancel("J9@1", 1))  # still queued for the old socket
    new = sim.connect()
    assert old.closed and old.outbox.get_nowait() is None  # closed, its frame dropped
    assert sim.leader.workers == {"w1": new}
    sim.do(sim.leader.disconnect(old))  # the old socket's end does not unregister the new one
    assert sim.leader.workers == {"w1": new}


# -- a new leader ---------------------------------------------------------------------------------
def test_a_new_leader_gives_running_leases_a_grace_to_resume_then_ends_them() -> None:
    first = Sim()
    conn = first.connect()
    run_id, lease = leased(first, conn, heartbeat_timeout_ms=2 * S)
    second = Sim(first.state)  # elected later, on the same replicated state
    second.wall, second.mono = first.wall, first.mono
    assert second.leader.leases[run_id].fence == lease.fence
    second.advance(REBUILD_GRACE_S - 0.5)
    second.tick()
    assert second.asked(commands.FailRun) == []
    second.advance(1)
    second.tick()
    assert [f.run_id for f in second.asked(commands.FailRun)] == [run_id]


def test_a_deposed_leader_steps_down_and_puts_nothing_back() -> None:
    old = Sim()
    run_id = old.submit()
    Sim(old.state)  # another leader claims the log
    old.index = old.state.applied_index
    old.tick()
    assert old.asked(commands.Fire)
    results = old.commit()  # the fire, and the history purge
    assert all(isinstance(r, Rejected) and r.code == STALE_LEADER for r in results)
    assert len(old.stepped_down) == len(results)
    assert run_id not in old.leader.wheel


def test_events_the_rebuild_already_read_are_not_applied_twice() -> None:
    sim = Sim()
    run_id = sim.submit()
    sim.tick()
    sim.commit()
    assert sim.leader.queues["default"]
    sim.leader.queues["default"].remove(run_id)
    sim.do(
        sim.leader.on_events(
            sim.leader.rebuilt_at, [RunReady(run_id, "default", Priority.NORMAL, "default", "t")]
        )
    )
    assert run_id not in sim.leader.queues["default"]


# -- the hot window and the history --------------------------------------------------------------
def test_runs_beyond_the_hot_window_wait_in_the_state_and_are_loaded_in_their_time() -> None:
    sim = Sim(hot_window_ms=60 * S)
    far = sim.submit(in_s=600)
    loaded_at = None
    for _ in range(60):
        sim.tick()
        if far in sim.leader.wheel:
            loaded_at = sim.wall
            break
        sim.advance(10)
    # in the wheel from at most a window before it is due, and at least half a window before
    assert loaded_at is not None and T0 + 540 * S <= loaded_at <= T0 + 570 * S


def test_a_large_window_is_read_a_chunk_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leader_core, "LOAD_CHUNK", 3)
    first = Sim()
    ids = [first.submit(f"J{k}", in_s=30 + k) for k in range(8)]
    ids += [first.submit(f"K{k}", in_s=60) for k in range(4)]  # the same millisecond
    second = Sim(first.state)
    sizes = [len(second.leader.wheel)]
    while second.leader.loading and len(sizes) < 20:
        assert second.leader.sleep_for(second.now) == leader_core.LOADING_PAUSE_S
        second.tick()
        sizes.append(len(second.leader.wheel))
    assert all(r in second.leader.wheel for r in ids)
    steps = [b - a for a, b in zip([0, *sizes], sizes, strict=False) if b - a]
    assert max(steps) == 4 and len(steps) >= 4


def test_history_is_purged_one_command_at_a_time_every_period() -> None:
    sim = Sim(retention_ms=60 * S)
    for job_id in ("J1", "J2"):  # finished 2 s apart: each forgettable 60 s later
        sim.submit(job_id)
        sim.log(commands.CancelJob(f"cancel{job_id}", sim.wall, job_id))
        sim.advance(2)
    sim.advance(57.5)  # J1 is 61.5 s old, J2 59.5 s
    sim.tick()
    [purge] = sim.asked(commands.Purge)
    assert purge.before_ms == sim.wall - 60 * S
    sim.tick()
    assert len(sim.asked(commands.Purge)) == 1  # one in flight
    [purged] = sim.commit()
    assert purged == Ok([1, 1]) and "J1" not in sim.state.jobs and "J2" in sim.state.jobs
    sim.advance(leader_core.PURGE_PERIOD_S - 0.1)
    sim.tick()
    assert sim.asked(commands.Purge) == []  # J2 is forgettable now, but the period is not over
    sim.advance(0.1)
    sim.tick()
    assert len(sim.asked(commands.Purge)) == 1


def test_no_purge_is_committed_while_there_is_nothing_to_forget() -> None:
    sim = Sim(retention_ms=60 * S)
    sim.submit()  # active: not forgettable
    for _ in range(5):
        sim.tick()
        sim.commit()
        sim.advance(leader_core.PURGE_PERIOD_S)
    assert sim.asked(commands.Purge) == []
    entries = sim.index
    for _ in range(5):  # idle: the log does not grow
        sim.tick()
        sim.commit()
        sim.advance(leader_core.PURGE_PERIOD_S)
    assert sim.index == entries


def test_a_leader_with_another_bound_per_job_purges_once_to_set_it() -> None:
    sim = Sim(retention_ms=60 * S, keep_per_job=5)
    sim.tick()
    [purge] = sim.asked(commands.Purge)
    assert purge.keep == 5
    sim.commit()
    assert sim.state.history_keep == 5
    sim.advance(leader_core.PURGE_PERIOD_S)
    sim.tick()
    assert sim.asked(commands.Purge) == []


# -- progress and tracebacks --------------------------------------------------------------------
def beat(sim: Sim, conn: WorkerConn, lease: messages.Lease, progress: Any) -> None:
    """The worker on ``conn`` heartbeats ``lease`` with ``progress``."""
    ref = messages.LeaseRef(lease.run_id, lease.fence, progress)
    sim.do(sim.leader.heartbeat(conn, (ref,), sim.now))


def progress_asked(sim: Sim) -> list[tuple[tuple[str, int, Any], ...]]:
    return [cmd.updates for cmd in sim.asked(commands.Progress)]


def recorded(value: Any, **spec: Any) -> tuple[Sim, WorkerConn, str, messages.Lease]:
    """A run leased to a worker that reported the progress ``value``, committed."""
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn, **spec)
    beat(sim, conn, lease, value)
    sim.tick()
    sim.commit()
    return sim, conn, run_id, lease


def test_a_changed_progress_is_committed_and_a_repeated_one_is_not() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    beat(sim, conn, lease, None)  # no progress: nothing to record
    sim.tick()
    assert progress_asked(sim) == []
    beat(sim, conn, lease, {"done": 3, "of": 10})
    sim.tick()
    assert progress_asked(sim) == [((run_id, lease.fence, {"done": 3, "of": 10}),)]
    sim.commit()
    attempt = sim.run(run_id).current
    assert (attempt.progress, attempt.progress_ms) == ({"done": 3, "of": 10}, sim.wall)
    assert sim.run(run_id).state is RunState.RUNNING
    for _ in range(3):  # the same value, keys in another order: already held
        sim.advance(PROGRESS_PERIOD_S)
        beat(sim, conn, lease, {"of": 10, "done": 3})
        sim.tick()
        assert progress_asked(sim) == []


def test_progress_is_committed_at_most_once_per_lease_per_period_the_latest_winning() -> None:
    sim, conn, run_id, lease = recorded(1)
    for value in (2, 3, 4):  # a chatty worker: every second
        sim.advance(1)
        beat(sim, conn, lease, value)
        sim.tick()
        assert progress_asked(sim) == []
    sim.advance(PROGRESS_PERIOD_S - 3)
    sim.tick()
    assert progress_asked(sim) == [((run_id, lease.fence, 4),)]
    sim.commit()
    assert sim.run(run_id).current.progress == 4


def test_the_progress_of_many_leases_goes_in_one_command_one_command_at_a_time() -> None:
    sim = Sim()
    conn = sim.connect(capacity=3)
    for i in range(3):
        sim.submit(f"J{i}")
    sim.settle()
    leases = sim.frames(conn, messages.Lease)
    assert len(leases) == 3
    for i, lease in enumerate(leases[:2]):
        beat(sim, conn, lease, i)
    sim.tick()
    assert progress_asked(sim) == [tuple((x.run_id, x.fence, i) for i, x in enumerate(leases[:2]))]
    beat(sim, conn, leases[2], 2)
    sim.tick()  # the first is not committed yet: the next waits for it
    assert len(progress_asked(sim)) == 1
    sim.commit()
    sim.tick()
    assert progress_asked(sim) == [((leases[2].run_id, leases[2].fence, 2),)]


def test_a_progress_too_large_is_dropped_with_one_log_line() -> None:
    sim, conn, run_id, lease = recorded("small")
    huge = "x" * messages.MAX_PROGRESS_BYTES
    for _ in range(3):
        sim.advance(PROGRESS_PERIOD_S)
        beat(sim, conn, lease, huge)
        sim.tick()
        assert progress_asked(sim) == []
    [dropped] = [entry for entry in sim.logged if entry.event == "run.progress_dropped"]
    assert dropped.level is Level.WARNING and dropped.fields["run_id"] == run_id
    assert sim.run(run_id).current.progress == "small"  # kept
    sim.do(sim.leader.finish(conn, messages.Complete(run_id, lease.fence, None, huge), sim.now))
    [done] = sim.asked(commands.CompleteRun)
    assert done.progress is None  # not with the end either


def test_a_progress_that_was_not_committed_is_sent_again_with_a_later_report() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    beat(sim, conn, lease, "half")
    sim.tick()
    sim.lose()
    beat(sim, conn, lease, "half")  # workers repeat their progress in every heartbeat
    sim.tick()
    assert progress_asked(sim) == []  # in the lease's next turn
    sim.advance(PROGRESS_PERIOD_S)
    sim.tick()
    assert progress_asked(sim) == [((run_id, lease.fence, "half"),)]


def test_the_end_of_an_attempt_records_its_final_progress() -> None:
    sim, conn, run_id, lease = recorded(1)
    sim.advance(1)
    beat(sim, conn, lease, 2)  # waits for the lease's next turn ...
    # ... when the result comes, from a worker that does not send progress with it
    sim.do(sim.leader.finish(conn, messages.Complete(run_id, lease.fence, "ok"), sim.now))
    [done] = sim.asked(commands.CompleteRun)
    assert done.progress == 2
    sim.commit()
    attempt = sim.run(run_id).current
    assert (attempt.progress, attempt.progress_ms, attempt.outcome) == (2, sim.wall, "succeeded")
    sim.advance(PROGRESS_PERIOD_S)
    sim.tick()
    assert progress_asked(sim) == []  # nothing waits for it any more


def test_a_failure_keeps_the_progress_it_carries_and_the_tail_of_its_traceback() -> None:
    sim = Sim()
    conn = sim.connect()
    run_id, lease = leased(sim, conn)
    beat(sim, conn, lease, {"step": 1})
    tb = "\n".join(f"line {i}" for i in range(100))  # a worker that sends too long a one
    fail = messages.Fail(run_id, lease.fence, "ValueError: x", True, tb, {"step": 9})
    sim.do(sim.leader.finish(conn, fail, sim.now))
    [failed] = sim.asked(commands.FailRun)
    assert failed.progress == {"step": 9}  # what the result carries wins
    assert failed.traceback == messages.traceback_tail(tb)
    assert failed.traceback.endswith("line 99") and "line 79" not in failed.traceback
    sim.commit()
    attempt = sim.run(run_id).attempts[0]
    assert (attempt.error, attempt.traceback) == ("ValueError: x", failed.traceback)
    assert (attempt.progress, attempt.outcome) == ({"step": 9}, "failed")
    assert sim.run(run_id).state is RunState.RETRYING


def test_a_lost_lease_keeps_the_progress_reported_last() -> None:
    sim, conn, run_id, lease = recorded("a", heartbeat_timeout_ms=3 * S)
    sim.advance(1)
    beat(sim, conn, lease, "b")  # not committed yet when the worker goes quiet
    sim.advance(3.01)
    sim.tick()
    [lost] = sim.asked(commands.FailRun)
    assert (lost.outcome, lost.progress) == ("lost", "b")
    sim.commit()
    assert sim.run(run_id).attempts[0].progress == "b"


def test_a_new_leader_does_not_commit_again_the_progress_an_attempt_holds() -> None:
    first, _, run_id, lease = recorded({"pct": 50})
    second = Sim(first.state)  # elected later, on the same replicated state
    again = second.connect(resume=(messages.LeaseRef(run_id, lease.fence, {"pct": 50}),))
    second.tick()
    assert progress_asked(second) == []
    beat(second, again, lease, {"pct": 60})
    second.tick()
    assert progress_asked(second) == [((run_id, lease.fence, {"pct": 60}),)]


def test_progress_from_a_worker_that_does_not_hold_the_lease_is_ignored() -> None:
    sim = Sim()
    conn, other = sim.connect("w1"), sim.connect("w2")
    run_id, lease = leased(sim, conn)
    beat(sim, other, lease, "not yours")
    sim.do(
        sim.leader.heartbeat(conn, (messages.LeaseRef(run_id, lease.fence - 1, "stale"),), sim.now)
    )
    sim.tick()
    assert progress_asked(sim) == []
