"""The leader's decisions, without I/O: time and events in, typed actions out.

:class:`LeaderCore` holds what only the leader keeps in memory (the timing wheel, the ready
queues, the leases, the worker registry) and decides what to do about each input, as h11's
connection or etcd-io/raft's ``Step`` do: it never reads a clock, never awaits, never commits a
command or writes to a socket.  Each input is a method that takes the time (:class:`Now`) and
returns the :data:`Action` values to carry out, in order:

* :class:`Commit` a command to the log; once it is applied (or could not be), the shell hands
  the result back with :meth:`LeaderCore.committed`, together with the :class:`Commit`'s
  ``then`` (what the command was for);
* :class:`Send` a frame to a worker's connection, :class:`Close` a connection;
* :class:`Wake` the loop (something may be due, dispatchable or expired before the next
  planned tick); :class:`StepDown` (the log says another leader claimed after us).

The only thing it calls out to is ``read``: the replicated state as this node applied it,
under the lock the Raft thread applies under (local and synchronous; tests pass a plain
:class:`schedd.core.state.MemoryState`).  :mod:`schedd.leader.leader` is the asyncio shell that
reads the clocks, runs the loop, commits through Raft and writes to the sockets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal, assert_never

from schedd.core import allowances, commands
from schedd.core.durations import format_time
from schedd.core.fairness import ConcurrencyCaps, TaskLanes
from schedd.core.model import (
    TERMINAL_RUN_STATES,
    Attempt,
    AttemptOutcome,
    JobStatus,
    Priority,
    Run,
    RunState,
)
from schedd.core.runs import FIRE_AHEAD_MAX_MS, may_fire_ahead
from schedd.core.state import (
    STALE_LEADER,
    CapsChanged,
    LeaderEvent,
    Ok,
    Rejected,
    Result,
    RunDue,
    RunGone,
    RunLeased,
    RunReady,
    State,
    StopRun,
)
from schedd.core.wheel import TimingWheel
from schedd.leader.progress import ProgressBook, held_progress
from schedd.leader.workers import LeaseInfo, WorkerConn
from schedd.protocol import messages
from schedd.protocol.messages import MAX_PROGRESS_BYTES

MAX_FIRE_PER_TICK = 5000
#: runs read into the wheel (and the hot set) per tick: each costs 35-45 us read cold from the
#: database, so a chunk holds the event loop (and the Raft ticks on it) for ~8-10 ms
LOAD_CHUNK = 250
LOADING_PAUSE_S = 0.002  # between two chunks: Raft and the API take their turns meanwhile
IDLE_S = 0.25  # the longest the loop sleeps (a tick also expires leases)
PURGE_PERIOD_S = 5.0  # between two purges of old history (schedd.core.history)
PURGE_LIMIT = 1000  # runs (and jobs) forgotten per purge command
REBUILD_GRACE_S = 10.0  # a new leader waits this long (at least) for workers to resume leases
RESULT_TIMEOUT_S = 5.0  # a worker's result not committed by then is not acked (it re-sends)
_MIN_MS = -(2**62)  # before any due time


@dataclass(frozen=True, slots=True)
class Now:
    """The time of an input: the wall clock (UTC ms, what due times are in) and the monotonic
    clock (seconds, what heartbeat expiries are in)."""

    wall_ms: int
    mono: float


@dataclass(frozen=True, slots=True)
class Settings:
    """The leader's configuration, in ms as the node's config has it (``scheduler``, ``limits``
    and ``history``): no defaults here, the config declares them (``leader_settings`` in
    ``schedd.runtime`` maps one to the other)."""

    tick_ms: int  # the timing wheel's resolution
    caps: Mapping[str, int]  # namespace -> leases at once
    ahead_ms: int  # dispatch ahead: fire and lease this long before due (at most)
    heartbeat_interval_ms: int  # what workers are told in their welcome
    hot_window_ms: int  # the wheel holds the runs due within this much
    retention_ms: int  # finished runs older than this are purged
    keep_per_job: int  # finished runs kept per job at most
    shards: int  # the cluster's shards: ``caps`` hold for all of them together
    shard: int  # the shard this leader leads (its share of the caps: schedd.core.allowances)


# -- what a committed command was for (handed back with its result) ---------------------------
@dataclass(frozen=True, slots=True)
class Fired:
    chunk: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Leased:
    grants: tuple[tuple[str, str], ...]  # (run id, worker id)
    reserved: tuple[WorkerConn, ...]  # the connection that reserved room, per grant


@dataclass(frozen=True, slots=True)
class Ended:
    info: LeaseInfo  # a lease the leader ended (lost or timed out)


@dataclass(frozen=True, slots=True)
class Finished:
    conn: WorkerConn
    msg: messages.Complete | messages.Fail  # a worker's result, acked (or refused) once applied


@dataclass(frozen=True, slots=True)
class Progressed:
    infos: tuple[LeaseInfo, ...]  # the leases whose progress the command records


@dataclass(frozen=True, slots=True)
class Purged:
    pass


@dataclass(frozen=True, slots=True)
class Healed:
    pass


@dataclass(frozen=True, slots=True)
class Gave:
    namespace: str
    amount: int  # slots of a concurrency cap given to another shard
    reply: Callable[[Result | None], None]  # told the outcome (the coordinator waits for it)


Purpose = Fired | Leased | Ended | Finished | Progressed | Purged | Healed | Gave


# -- actions ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Commit:
    cmd: commands.Command
    then: Purpose
    timeout_s: float | None = None  # hand back "not committed" after this long


@dataclass(frozen=True, slots=True)
class Send:
    conn: WorkerConn
    msg: messages.Message


@dataclass(frozen=True, slots=True)
class Close:
    conn: WorkerConn
    discard: bool  # drop the frames not sent yet (a connection replaced by a newer one)


@dataclass(frozen=True, slots=True)
class Wake:
    pass


@dataclass(frozen=True, slots=True)
class StepDown:
    reason: str


class Level(IntEnum):
    """How much a :class:`Log` matters: the numbers of Python's ``logging`` levels."""

    DEBUG = 10
    INFO = 20
    WARNING = 30


@dataclass(frozen=True, slots=True)
class Log:
    """Log the event ``event`` with ``fields`` (the shell's logger: ``schedd.leader.core``)."""

    event: str
    level: Level
    fields: Mapping[str, object]


# -- observations: the shell records them as metrics ------------------------------------------
@dataclass(frozen=True, slots=True)
class LeaseLost:
    outcome: str  # an AttemptOutcome's value: a lease the leader ended (lost, timed out)


@dataclass(frozen=True, slots=True)
class Lag:
    """A run fired (``fire``) or leased (``lease``) ``seconds`` after it was due."""

    stage: Literal["fire", "lease"]
    seconds: float
    queue: str
    priority: str
    mono: float
    due_ms: int


@dataclass(frozen=True, slots=True)
class PurgeCount:
    runs: int  # finished runs a purge forgot
    jobs: int


@dataclass(frozen=True, slots=True)
class ResultCount:
    accepted: bool  # a worker's result was applied (or refused)


Observation = LeaseLost | Lag | PurgeCount | ResultCount
Action = Commit | Send | Close | Wake | StepDown | Log | Observation
WAKE = Wake()


def _gave(reply: Callable[[Result | None], None], amount: int, res: Result | None) -> None:
    """Tell ``reply`` how a give of ``amount`` slots went: Ok((its seq, amount)) once applied."""
    reply(Ok((res.value, amount)) if isinstance(res, Ok) else res)


def _pending(run: Run | None) -> bool:
    """Whether ``run`` is there and not finished (a job's next occurrence should be)."""
    return run is not None and run.state not in TERMINAL_RUN_STATES


class LeaderCore:
    """The leader's state and decisions for one term (see the module docstring)."""

    def __init__(
        self,
        read: Callable[[], AbstractContextManager[State]],
        fence: int,
        now: Now,
        settings: Settings,
        rand: Callable[[], float],
        rid: Callable[[], str],
    ) -> None:
        self.read = read
        self.fence = fence  # the log index of this leader's claim: every command carries it
        self.rand = rand  # the jitter of a retry's backoff (FailRun)
        # A request id for each command: leader commands are fenced, not deduplicated, so an id
        # only has to differ from the client ids ``apply`` remembers (hex, or
        # ``token:id:digest``): the shell counts, much cheaper than uuid4.
        self.rid = rid
        # The hot window: the wheel holds the runs due before ``loaded_until`` only; the rest
        # wait in the state database's due-time index, and the next stretch is loaded from it
        # when half the window has passed (and at election).  Far-future runs cost no memory.
        self.hot_window_ms = max(1, settings.hot_window_ms)
        self.loaded_until = _MIN_MS  # nothing loaded yet
        self.loading = False  # _load_window stopped short of its end: go on at the next tick
        # History retention: a Purge every PURGE_PERIOD_S (at once again while one is full).
        self.retention_ms = max(1, settings.retention_ms)
        self.keep_per_job = settings.keep_per_job
        self._next_purge = 0.0  # monotonic time of the next purge (0: due)
        self._purging = False  # one in flight
        # Workers heartbeat every heartbeat_interval_ms (welcome); a lease whose job allows less
        # than three of those between heartbeats asks for a third of its timeout instead.
        self.heartbeat_interval_s = settings.heartbeat_interval_ms / 1000
        # Runs that may fire ahead (core.runs.may_fire_ahead) are fired and leased this long
        # before they are due; the worker starts them on time (lease.not_before).
        self.ahead_ms = min(FIRE_AHEAD_MAX_MS, max(0, settings.ahead_ms))
        self.wheel = TimingWheel(now.wall_ms, tick_ms=max(1, settings.tick_ms))
        self.queues: dict[str, TaskLanes] = {}  # queue name -> runs ready for a worker
        # Per-namespace limits on leases at once: with several shards, this shard's allowance
        # of each cap (schedd.core.allowances), less the slots being given away, and lowered
        # to a coordinator's soft limit while that holds (its slots go to another shard).
        self.cap_config = dict(settings.caps)
        self.shards, self.shard = settings.shards, settings.shard
        self.ledger = allowances.EMPTY  # this shard's moves of slots (from the state)
        self.giving: dict[str, int] = {}  # namespace -> slots in a give not yet applied
        self.soft: dict[str, tuple[int, float]] = {}  # namespace -> (limit, until when)
        self.caps = ConcurrencyCaps({})  # set at the end (and again by rebuild)
        self.namespace_of: dict[str, str] = {}  # run id -> namespace, for queued and leased runs
        #: run id -> when a replayed or unblocked queued run could first run (its lease lag is
        #: counted from there, not from its old due time)
        self.ready_since: dict[str, int] = {}
        self.leases: dict[str, LeaseInfo] = {}
        self.by_worker: dict[str, set[str]] = {}  # worker id -> run ids of its leases (above)
        self.workers: dict[str, WorkerConn] = {}
        self.progress = ProgressBook(
            self._progress_dropped
        )  # workers' progress reports waiting to be committed
        self.rebuilt_at = -1  # the applied index the rebuild read: older events are in it
        self._rr = 0
        self._out: list[Action] = []
        self._set_caps(None)

    def _progress_dropped(self, info: LeaseInfo, size: int) -> None:
        self._log(
            "run.progress_dropped",
            Level.WARNING,
            run_id=info.run_id,
            fence=info.fence,
            worker_id=info.worker_id,
            bytes=size,
            limit=MAX_PROGRESS_BYTES,
            hint="a progress larger than the limit (as JSON) is not kept",
        )

    def _log(self, event: str, level: Level, **fields: object) -> None:
        self._out.append(Log(event, level, fields))

    def _emit(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    # -- establish leadership --------------------------------------------------------------
    def rebuild(self, now: Now) -> list[Action]:
        """Read the replicated state into the wheel, the queues and the lease table; heal the
        recurring jobs that lost their next occurrence.  Raises if another leader claimed
        after ours (the shell gives up this term)."""
        with self.read() as st:
            to_heal = [
                job.id
                for job in st.active_recurring_jobs()
                if not _pending(st.runs.get(job.next_run_id) if job.next_run_id else None)
            ]
            self.rebuilt_at = st.applied_index
            if st.leader_fence != self.fence:
                raise RuntimeError("another leader claimed after us")
            self.ledger = st.caps
            self._set_caps(now)
            # same read (the lock nests); the rest of the window chunk by chunk (tick)
            self._load_window(now.wall_ms + self.hot_window_ms)
            for run in st.live_runs():
                if run.state is RunState.QUEUED:
                    spec = st.jobs[run.job_id].spec
                    self._enqueue(run.id, spec.queue, spec.priority, spec.namespace, spec.task)
                elif run.state is RunState.RUNNING and run.current is not None:
                    spec = st.jobs[run.job_id].spec
                    self.namespace_of[run.id] = run.namespace
                    self.caps.acquire(run.namespace)
                    hb = spec.heartbeat_timeout_ms / 1000
                    # Give the worker time to notice the new leader, reconnect and resume: at
                    # least a heartbeat timeout, and never less than REBUILD_GRACE_S.
                    self._track(
                        LeaseInfo(
                            run.id,
                            run.current.fence,
                            run.current.worker_id,
                            now.mono + max(hb, REBUILD_GRACE_S),
                            hb,
                            run.current.deadline_ms,
                            progress=held_progress(run.current.progress),
                        )
                    )
        for job_id in to_heal:  # a recurring job without its next occurrence
            # retried at the next leadership if lost
            self._out.append(
                Commit(commands.Heal(self.rid(), now.wall_ms, self.fence, job_id), Healed())
            )
        return self._emit()

    # -- events from apply -----------------------------------------------------------------
    def on_events(self, index: int, events: Iterable[LeaderEvent]) -> list[Action]:
        """What the entry at ``index`` changed (``schedd.core.state.LeaderEvent``)."""
        if index <= self.rebuilt_at:
            return []
        moved = False  # slots of a cap moved: the limits are set again
        for ev in events:
            match ev:
                case RunLeased(run_id):
                    self.wheel.remove(run_id)
                    self._dequeue(run_id)
                case RunDue(run_id, due_ms, ahead):
                    self._forget(run_id)
                    if due_ms < self.loaded_until:  # else loaded in its time
                        self.wheel.add(run_id, self._fire_at(due_ms, ahead))
                case RunReady(run_id, queue, priority, namespace, task, since_ms):
                    self._forget(run_id)
                    self._enqueue(run_id, queue, priority, namespace, task)
                    if since_ms is not None:
                        self.ready_since[run_id] = since_ms
                case StopRun(run_id, fence):
                    info = self.leases.get(run_id)
                    conn = self.workers.get(info.worker_id) if info else None
                    if conn is not None:
                        self._out.append(Send(conn, messages.Cancel(run_id=run_id, fence=fence)))
                    self._forget(run_id)
                case RunGone(run_id):
                    self._forget(run_id)
                case CapsChanged(ledger):
                    self.ledger, moved = ledger, True
                case _:
                    assert_never(ev)
        if moved:
            self._set_caps(None)
        self._out.append(WAKE)
        return self._emit()

    def _fire_at(self, due_ms: int, ahead: bool) -> int:
        return due_ms - self.ahead_ms if ahead else due_ms

    def _enqueue(
        self, run_id: str, queue: str, priority: Priority, namespace: str, task: str
    ) -> None:
        lanes = self.queues.get(queue)
        if lanes is None:
            self.queues[queue] = lanes = TaskLanes()
        lanes.push(run_id, task, namespace, priority)
        self.namespace_of[run_id] = namespace

    def _dequeue(self, run_id: str) -> None:
        for lanes in self.queues.values():
            if lanes.remove(run_id):
                return

    def _forget(self, run_id: str) -> None:
        self.wheel.remove(run_id)
        self._dequeue(run_id)
        self.ready_since.pop(run_id, None)
        info = self.leases.pop(run_id, None)
        ns = self.namespace_of.pop(run_id, None)
        if info is not None:
            self._untrack(info)
            if ns is not None:
                self.caps.release(ns)
            conn = self.workers.get(info.worker_id)
            if conn is not None:
                conn.leases.pop(run_id, None)
            self._out.append(WAKE)

    def _track(self, info: LeaseInfo) -> None:
        """Record a lease (replacing any other of its run) under its worker id."""
        old = self.leases.get(info.run_id)
        if old is not None:
            self._untrack(old)
        self.leases[info.run_id] = info
        self.by_worker.setdefault(info.worker_id, set()).add(info.run_id)

    def _untrack(self, info: LeaseInfo) -> None:
        runs = self.by_worker.get(info.worker_id)
        if runs is not None:
            runs.discard(info.run_id)
            if not runs:
                del self.by_worker[info.worker_id]

    # -- the loop --------------------------------------------------------------------------
    def sleep_for(self, now: Now) -> float:
        """How long the loop may sleep before the next tick (unless woken)."""
        if self.loading:
            return LOADING_PAUSE_S
        nxt = self.wheel.next_due_ms()
        if nxt is None:
            return IDLE_S
        return min(IDLE_S, max(0.0, (nxt - now.wall_ms) / 1000))

    def tick(self, now: Now) -> list[Action]:
        """Load the next stretch of the hot window, purge old history, fire what is due, lease
        queued runs to workers with room, end leases that expired or timed out, and record the
        progress workers reported (``schedd.leader.progress``)."""
        if now.wall_ms + self.hot_window_ms // 2 >= self.loaded_until or self.loading:
            self._load_window(now.wall_ms + self.hot_window_ms)
        if not self._purging and now.mono >= self._next_purge:
            before = now.wall_ms - self.retention_ms
            if self._purge_due(before):
                self._purging = True
                cmd = commands.Purge(
                    self.rid(), now.wall_ms, self.fence, before, self.keep_per_job, PURGE_LIMIT
                )
                self._out.append(Commit(cmd, Purged()))
            else:  # nothing to forget: no entry (an idle cluster's log stays as it is)
                self._next_purge = now.mono + PURGE_PERIOD_S
        if self.soft and min(until for _, until in self.soft.values()) <= now.mono:
            self._set_caps(now)  # a coordinator's soft limit lapsed
        self._fire_due(now.wall_ms)
        self._dispatch(now.wall_ms)
        self._check_leases(now)
        self._record_progress(now)
        return self._emit()

    def _load_window(self, until: int) -> None:
        """Put the runs due in ``[loaded_until, until)`` into the wheel (from the database's
        due-time index), at most about LOAD_CHUNK of them: ``loaded_until`` then stops where
        they do, and the next tick goes on from there.  Each read holds the event loop (and the
        state's lock, which a tick thread would need to apply entries and then to send its
        heartbeats): a new leader with 100,000 runs in its window would hold them for seconds
        in one read.  Events of
        entries applied before a read but handled after it are replayed on top in order, so
        the wheel ends up as the state is."""
        start = self.loaded_until
        with self.read() as st:
            runs = st.due_runs(start, until, LOAD_CHUNK)
            reached = until
            if len(runs) == LOAD_CHUNK:  # more may follow: stop before the last due time
                last = runs[-1].due_ms
                if runs[0].due_ms == last:  # one millisecond holds them all: take all of it
                    runs, reached = st.due_runs(last, last + 1), last + 1
                else:
                    runs, reached = [r for r in runs if r.due_ms < last], last
            for run in runs:
                ahead = may_fire_ahead(st.jobs[run.job_id].spec, run)
                self.wheel.add(run.id, self._fire_at(run.due_ms, ahead))
        self._log("leader.window_loaded", Level.DEBUG, runs=len(runs), start=start, until=reached)
        self.loaded_until = reached
        self.loading = reached < until

    def _fire_due(self, now: int) -> None:
        due = self.wheel.advance(now)
        for start in range(0, len(due), MAX_FIRE_PER_TICK):
            chunk = tuple(due[start : start + MAX_FIRE_PER_TICK])
            self._out.append(
                Commit(commands.Fire(self.rid(), now, self.fence, chunk), Fired(chunk))
            )

    def _dispatch(self, now: int) -> None:
        n = len(self.workers)
        if n > 1:  # rotate, so the first-connected worker is not always served first
            self._rr = (self._rr + 1) % n
        if not any(self.queues.values()):
            return  # nothing queued: no pass over every connected worker (thousands, idle)
        grants: list[tuple[str, str]] = []
        reserved: list[WorkerConn] = []
        conns = list(self.workers.values())
        if n > 1:
            conns = conns[self._rr :] + conns[: self._rr]
        for conn in conns:
            room = conn.free
            while room > 0:
                run_id = self._pop_ready(conn.queues, conn.tasks)
                if run_id is None:
                    break
                grants.append((run_id, conn.worker_id))
                reserved.append(conn)
                conn.reserved += 1
                room -= 1
        if grants:
            cmd = commands.LeaseRuns(self.rid(), now, self.fence, tuple(grants))
            self._out.append(Commit(cmd, Leased(tuple(grants), tuple(reserved))))

    def _pop_ready(self, queues: tuple[str, ...], tasks: frozenset[str] | None) -> str | None:
        """Of the tasks the worker serves: priorities by weight, namespaces by deficit round
        robin, tasks by the weight of their most urgent run (core.fairness)."""
        for q in queues:
            lanes = self.queues.get(q)
            if lanes:
                run_id = lanes.pop(tasks, self.caps.can_take)
                if run_id is not None:
                    self.caps.acquire(self.namespace_of.get(run_id, ""))
                    return run_id
        return None

    def _check_leases(self, now: Now) -> None:
        for info in list(self.leases.values()):
            if info.ending:
                continue
            if info.expires < now.mono:
                conn = self.workers.get(info.worker_id)
                if conn is not None:  # connected, but silent: no new lease until it is heard
                    conn.silent = True
                self._end_lease(
                    info,
                    now.wall_ms,
                    AttemptOutcome.LOST,
                    f"lease lost: no heartbeat within {info.heartbeat_timeout:g}s",
                )
            elif info.deadline_ms is not None and info.deadline_ms < now.wall_ms:
                conn = self.workers.get(info.worker_id)
                if conn is not None:
                    self._out.append(
                        Send(conn, messages.Cancel(run_id=info.run_id, fence=info.fence))
                    )
                self._end_lease(
                    info,
                    now.wall_ms,
                    AttemptOutcome.TIMED_OUT,
                    "timeout: no result by its deadline (the job's timeout)",
                )

    def _record_progress(self, now: Now) -> None:
        """Commit the progress whose lease's turn has come, in one command, one at a time."""
        if self.progress.busy:
            return
        due = self.progress.due(
            now.mono, lambda info: self.leases.get(info.run_id) is info and not info.ending
        )
        if due:
            self.progress.busy = True
            updates = tuple((info.run_id, info.fence, value) for info, value in due)
            cmd = commands.Progress(self.rid(), now.wall_ms, self.fence, updates)
            infos = tuple(info for info, _ in due)
            self._out.append(Commit(cmd, Progressed(infos), RESULT_TIMEOUT_S))

    def _end_lease(self, info: LeaseInfo, now: int, outcome: AttemptOutcome, error: str) -> None:
        info.ending = True
        self._out.append(LeaseLost(outcome.value))
        cmd = commands.FailRun(
            self.rid(),
            now,
            self.fence,
            info.run_id,
            info.fence,
            error,
            True,
            outcome,
            self.rand(),
            progress=self.progress.final(info, None),  # reported, not yet recorded
        )
        self._out.append(Commit(cmd, Ended(info)))
        self._log(
            "run.lease_" + outcome.value,
            Level.INFO,
            run_id=info.run_id,
            fence=info.fence,
            worker_id=info.worker_id,
        )
        conn = self.workers.get(info.worker_id)
        if conn is not None and outcome is AttemptOutcome.LOST:
            # A stalled worker still connected: it must drop the lease before it counts as
            # having room again, else new leases would reach it while it is full (the cancel is
            # ahead of them on the same socket).
            self._out.append(Send(conn, messages.Cancel(run_id=info.run_id, fence=info.fence)))

    # -- results of commands ---------------------------------------------------------------
    def committed(self, then: Purpose, result: Result | None, now: Now) -> list[Action]:
        """A command this core asked for was applied with ``result``, or (None) was not
        committed: no leader, a timeout, a full queue."""
        deposed = isinstance(result, Rejected) and result.code == STALE_LEADER
        if deposed:
            assert isinstance(result, Rejected)
            self._log("leader.deposed", Level.WARNING, reason=result.message)
            self._out.append(StepDown(result.message))
        if isinstance(then, Fired):
            if not deposed:  # a deposed leader puts nothing back: the next one rebuilds
                self._fired(then.chunk, result, now)
        elif isinstance(then, Leased):
            self._leased(then, result, now)  # a refusal (deposed too) re-queues
        elif isinstance(then, Ended):
            if result is None:
                then.info.ending = False  # retried on a later tick
        elif isinstance(then, Finished):
            self._finished(then, result)
        elif isinstance(then, Progressed):
            self.progress.busy = False
            if not isinstance(result, Ok):  # (an update refused inside an Ok: the attempt ended)
                self.progress.not_recorded(then.infos)
        elif isinstance(then, Purged):
            self._purged(result, now)
        elif isinstance(then, Gave):
            # applied (the ledger has it now) or not: the slots are no longer being given
            left = self.giving.get(then.namespace, 0) - then.amount
            if left > 0:
                self.giving[then.namespace] = left
            else:
                self.giving.pop(then.namespace, None)
            self._set_caps(now)
            then.reply(result)
        return self._emit()

    # -- concurrency caps across shards (schedd.core.allowances) ---------------------------
    def _set_caps(self, now: Now | None) -> None:
        """Set each capped namespace's limit: the allowance, less what is being given, and
        no more than a soft limit that still holds (``now`` None: keep the soft limits)."""
        if now is not None:
            self.soft = {ns: v for ns, v in self.soft.items() if v[1] > now.mono}
        limits = {}
        for ns, cap in self.cap_config.items():
            n = self._allowance(ns, cap)
            soft = self.soft.get(ns)
            limits[ns] = max(0, n if soft is None else min(n, soft[0]))
        self.caps.update(limits)
        self._out.append(WAKE)

    def _allowance(self, ns: str, cap: int) -> int:
        """This shard's allowance of ``ns``'s cap, less the slots being given away."""
        allowed = allowances.allowance(cap, self.shards, self.shard, self.ledger, ns)
        return allowed - self.giving.get(ns, 0)

    def caps_report(self) -> dict[str, allowances.ShardCaps]:
        """Each capped namespace's allowance here, runs in flight and runs waiting."""
        waiting: dict[str, int] = {}
        for lanes in self.queues.values():
            for (ns, _prio), n in lanes.depth().items():
                waiting[ns] = waiting.get(ns, 0) + n
        return {
            ns: allowances.ShardCaps(
                self._allowance(ns, cap), self.caps.in_use(ns), waiting.get(ns, 0)
            )
            for ns, cap in self.cap_config.items()
        }

    def caps_view(self) -> dict[str, Any]:
        """:meth:`caps_report` and the transfers given not known to be credited yet, as JSON
        (``POST /internal/caps`` op view)."""
        return {
            "namespaces": {ns: c._asdict() for ns, c in self.caps_report().items()},
            "outbox": [t._asdict() for t in self.ledger.outbox],
        }

    def limit_caps(self, limits: Mapping[str, int], hold_s: float, now: Now) -> list[Action]:
        """A coordinator's soft limits: lease no more than ``limits[ns]`` runs of ``ns`` for
        ``hold_s`` (so that the slots its runs free can be given to another shard)."""
        self.soft = {ns: (max(0, n), now.mono + hold_s) for ns, n in limits.items()}
        self._set_caps(now)
        return self._emit()

    def give(
        self,
        namespace: str,
        amount: int,
        dest: int,
        now: Now,
        reply: Callable[[Result | None], None],
    ) -> list[Action]:
        """Give shard ``dest`` up to ``amount`` slots of ``namespace`` that no run here uses:
        they are taken off this leader's limit at once, and off its allowance once the give
        is applied; ``reply`` is told the result (Ok(seq) with the amount, or why not)."""
        free = self.caps_report().get(namespace)
        n = 0 if free is None else min(amount, free.allowance - free.in_use)
        if n <= 0 or dest == self.shard or not 0 <= dest < self.shards:
            reply(Ok((0, 0)))
            return self._emit()
        self.giving[namespace] = self.giving.get(namespace, 0) + n
        self._set_caps(None)
        cmd = commands.CapsGive(self.rid(), now.wall_ms, self.fence, namespace, n, dest)
        self._out.append(Commit(cmd, Gave(namespace, n, functools.partial(_gave, reply, n))))
        return self._emit()

    def _fired(self, chunk: tuple[str, ...], res: Result | None, now: Now) -> None:
        if isinstance(res, Ok):
            with self.read() as st:
                for rid, r in zip(chunk, res.value, strict=False):
                    run = st.runs.get(rid) if isinstance(r, Ok) else None
                    job = None if run is None else st.jobs.get(run.job_id)
                    if run is not None and job is not None:
                        lag = Lag(
                            "fire",
                            max(0, now.wall_ms - run.due_ms) / 1000,
                            job.spec.queue,
                            job.spec.priority.value,
                            now.mono,
                            run.due_ms,
                        )
                        self._out.append(lag)
        # Whatever did not fire (not committed, or refused: e.g. "not due yet" when this node's
        # wall clock stepped back) goes back into the wheel, or it would never fire.  A paused
        # job's runs wait for resume, which schedules them again.
        with self.read() as st:
            for rid in chunk:
                run = st.runs.get(rid)
                if run is None or run.state not in (RunState.SCHEDULED, RunState.RETRYING):
                    continue
                job = st.jobs.get(run.job_id)
                if (
                    run.state is RunState.SCHEDULED
                    and job is not None
                    and job.status is JobStatus.PAUSED
                ):
                    continue
                self.wheel.add(rid, run.due_ms)
        self._out.append(WAKE)

    def _leased(self, then: Leased, res: Result | None, now: Now) -> None:
        # On the connections that reserved the room: a worker that reconnected meanwhile has a
        # new connection object, whose count must not go below zero (it would take one lease
        # more than its capacity, which the worker refuses, costing the run an attempt).
        for held in then.reserved:
            held.reserved -= 1
        self._out.append(WAKE)
        if not isinstance(res, Ok):
            self._requeue([rid for rid, _ in then.grants])
            return
        with self.read() as st:
            for (run_id, wid), r in zip(then.grants, res.value, strict=True):
                if not isinstance(r, Ok):
                    ns = self.namespace_of.pop(run_id, None)
                    if ns is not None:
                        self.caps.release(ns)
                    continue
                attempt: Attempt = r.value
                run = st.runs[run_id]
                spec = st.jobs[run.job_id].spec
                since = self.ready_since.pop(run_id, run.due_ms)
                self._out.append(
                    Lag(
                        "lease",
                        max(0.0, (attempt.leased_ms - since) / 1000),
                        spec.queue,
                        spec.priority.value,
                        now.mono,
                        since,
                    )
                )
                hb = spec.heartbeat_timeout_ms / 1000
                self._track(
                    LeaseInfo(run_id, attempt.fence, wid, now.mono + hb, hb, attempt.deadline_ms)
                )
                conn = self.workers.get(wid)
                if conn is None:
                    continue  # it reconnects and resumes, or the lease expires
                conn.leases[run_id] = attempt.fence
                lease = messages.Lease(
                    run_id=run_id,
                    job_id=run.job_id,
                    attempt=attempt.number,
                    fence=attempt.fence,
                    task=spec.task,
                    payload=spec.payload,
                    scheduled_at=format_time(run.scheduled_ms) or "",
                    deadline=format_time(attempt.deadline_ms),
                    idempotency_key=spec.idempotency_key,
                    not_before=format_time(run.due_ms) if run.due_ms > now.wall_ms else None,
                    heartbeat_interval=hb / 3 if hb / 3 < self.heartbeat_interval_s else None,
                )
                self._out.append(Send(conn, lease))
                self._log(
                    "run.leased", Level.DEBUG, run_id=run_id, fence=attempt.fence, worker_id=wid
                )

    def _requeue(self, run_ids: list[str]) -> None:
        for rid in run_ids:
            if rid not in self.leases and rid in self.namespace_of:
                self.caps.release(self.namespace_of[rid])
        with self.read() as st:
            for rid in run_ids:
                run = st.runs.get(rid)
                if run is not None and run.state is RunState.QUEUED:
                    spec = st.jobs[run.job_id].spec
                    self._enqueue(rid, spec.queue, spec.priority, spec.namespace, spec.task)

    def _purge_due(self, before_ms: int) -> bool:
        """Whether a purge would change anything: a finished run or job to forget, or the
        per-job bound the log holds is not this leader's (a purge carries it)."""
        with self.read() as st:
            return (
                st.history_keep != self.keep_per_job
                or bool(st.finished_runs_before(before_ms, 1))
                or bool(st.forgettable_jobs(before_ms, 1))
            )

    def _purged(self, res: Result | None, now: Now) -> None:
        self._purging = False
        self._next_purge = now.mono + PURGE_PERIOD_S
        if not isinstance(res, Ok):  # not committed, or refused (a deposed leader's too)
            return
        runs, jobs = res.value
        self._out.append(PurgeCount(runs, jobs))
        if runs >= PURGE_LIMIT or jobs >= PURGE_LIMIT:  # more to forget: go on at once
            self._next_purge = 0.0
            self._out.append(WAKE)

    def _finished(self, then: Finished, res: Result | None) -> None:
        conn, msg = then.conn, then.msg
        if res is None:
            return  # no ack: the worker keeps the result and re-sends it after reconnecting
        self._out.append(ResultCount(isinstance(res, Ok)))
        if isinstance(res, Ok):
            self._out.append(Send(conn, messages.Ack(run_id=msg.run_id, accepted=True)))
            ok = isinstance(msg, messages.Complete)
            self._log(
                "run.finished",
                Level.DEBUG if ok else Level.INFO,
                run_id=msg.run_id,
                fence=msg.fence,
                outcome="succeeded" if ok else "failed",
            )
        else:
            self._out.append(
                Send(conn, messages.Ack(run_id=msg.run_id, accepted=False, reason=res.message))
            )
            self._log(
                "run.result_refused",
                Level.WARNING,
                run_id=msg.run_id,
                fence=msg.fence,
                reason=res.message,
            )
        conn.leases.pop(msg.run_id, None)
        self._out.append(WAKE)

    # -- workers ---------------------------------------------------------------------------
    def heard(self, conn: WorkerConn, now: Now) -> list[Action]:
        """A frame came from the worker: it is heard, and one that had gone silent (a lease of
        it expired while its connection stayed open) may take leases again."""
        conn.heard_ms = now.wall_ms
        if not conn.silent:
            return []
        conn.silent = False
        return [WAKE]

    def connect(
        self, conn: WorkerConn, resume: tuple[messages.LeaseRef, ...], now: Now
    ) -> list[Action]:
        """A worker said hello on ``conn``, holding the leases ``resume`` lists."""
        wid = conn.worker_id
        old = self.workers.get(wid)
        if old is not None and old is not conn:
            if not old.closed:
                self._log(
                    "worker.replaced",
                    Level.INFO,
                    worker_id=wid,
                    hint="a new connection said hello with the id of a connected worker: "
                    "a reconnect, or two workers with one id (ids must be unique)",
                )
            self._out.append(Close(old, discard=True))
        self.workers[wid] = conn
        listed: set[str] = set()
        for ref in resume:
            info = self.leases.get(ref.run_id)
            if info is not None and info.fence == ref.fence and not info.ending:
                if info.worker_id != wid:
                    self._untrack(info)
                    info.worker_id = wid
                    self.by_worker.setdefault(wid, set()).add(info.run_id)
                info.expires = now.mono + info.heartbeat_timeout
                self.progress.reported(info, ref.progress)
                conn.leases[ref.run_id] = ref.fence
                listed.add(ref.run_id)
            else:
                # Not a live lease any more (or one being ended): the worker must stop it (a
                # finished result is still sent and refused by fence, never applied).
                self._out.append(Send(conn, messages.Cancel(run_id=ref.run_id, fence=ref.fence)))
        # The leases recorded for this worker id that its hello does not list never reached
        # it, and never will: end them now (lost: retried with backoff and a new fence, as an
        # expired lease is) instead of after max(heartbeat timeout, REBUILD_GRACE_S) - and
        # every leader change restarted that wait.  Why nothing the worker holds is ended:
        # * ``resume`` lists every lease the worker holds: from the frame's arrival until the
        #   result is acked or the lease cancelled (schedd/worker/client.py, ``_held``),
        #   including leases waiting for ``not_before``, refused ones whose fail is unacked,
        #   and finished ones whose result is unacked.  Its heartbeats list the same set, so
        #   a lease missing here would never be heartbeated: it would expire all the same.
        # * A worker's socket is one connection at a time: the SDK closes a socket before it
        #   opens the next and builds the hello when the new one is open, so no lease frame of
        #   an earlier connection can arrive after it.  Frames still queued for a replaced
        #   connection are dropped (``Close(discard=True)`` above), and each lease ended here
        #   is followed by a cancel on this connection, so even a worker that overlapped two
        #   sockets (not the SDK) would drop one that reached it late.
        # * Every lease in ``self.leases`` was sent, if at all, on an earlier connection or by
        #   an earlier leader: ``_leased`` records a lease and sends it on the worker's current
        #   connection in one step, and grants committed from now on go to this connection.
        # * A result the worker had acked is already applied here: ``_forget`` runs (from the
        #   apply) before the ack is sent; if a Complete and this end race anyway, the fenced
        #   apply keeps the first and refuses the other.
        # * Two live workers sharing one id already displace each other's connection on every
        #   hello (above); that misconfiguration is logged, not supported.
        # The scenarios in tests/unit/test_leader_core.py check each of these.
        for run_id in sorted(self.by_worker.get(wid, set()) - listed):
            info = self.leases[run_id]
            if not info.ending:
                self._end_lease(
                    info,
                    now.wall_ms,
                    AttemptOutcome.LOST,
                    "lease lost: the worker reconnected without it (never delivered)",
                )
        self._log(
            "worker.connected",
            Level.INFO,
            worker_id=wid,
            queues=list(conn.queues),
            capacity=conn.capacity,
            resumed=len(conn.leases),
        )
        self._out.append(WAKE)
        return self._emit()

    def drain(self, conn: WorkerConn) -> list[Action]:
        """An operator drains the worker on ``conn``: it is leased nothing more, and told so
        (it finishes the leases it holds)."""
        if not conn.draining:
            conn.draining = True
            self._out.append(Send(conn, messages.Drain()))
            self._log(
                "worker.drain_requested",
                Level.INFO,
                worker_id=conn.worker_id,
                leases=len(conn.leases),
            )
        return self._emit()

    def set_capacity(self, conn: WorkerConn, capacity: int) -> list[Action]:
        """The worker on ``conn`` holds at most ``capacity`` leases from now on (a ``capacity``
        frame): raised, it is offered more at once; lowered, it takes none until below it."""
        raised = capacity > conn.capacity
        conn.capacity = capacity
        if raised:
            self._out.append(WAKE)
        return self._emit()

    def disconnect(self, conn: WorkerConn) -> list[Action]:
        """``conn`` closed (its leases stay: the worker may resume them elsewhere)."""
        if self.workers.get(conn.worker_id) is conn:
            del self.workers[conn.worker_id]
        self._log(
            "worker.disconnected", Level.INFO, worker_id=conn.worker_id, leases=len(conn.leases)
        )
        return self._emit()

    def heartbeat(
        self, conn: WorkerConn, refs: tuple[messages.LeaseRef, ...], now: Now
    ) -> list[Action]:
        """The worker on ``conn`` still runs the leases ``refs`` lists, each with its progress
        (committed by a later tick when it changed: ``schedd.leader.progress``)."""
        for ref in refs:
            info = self._held_by(conn, ref.run_id, ref.fence)
            if info is not None:
                info.expires = now.mono + info.heartbeat_timeout
                self.progress.reported(info, ref.progress)
        return self._emit()

    def _held_by(self, conn: WorkerConn, run_id: str, fence: int) -> LeaseInfo | None:
        """The lease of ``run_id`` with ``fence``, if the worker on ``conn`` holds it."""
        info = self.leases.get(run_id)
        if info is not None and info.fence == fence and info.worker_id == conn.worker_id:
            return info
        return None

    def finish(
        self, conn: WorkerConn, msg: messages.Complete | messages.Fail, now: Now
    ) -> list[Action]:
        """A worker's result: commit it, then ack (or refuse) it on ``conn``.  The attempt's
        final progress goes with it: the one the result carries, or the one reported last."""
        progress = self.progress.final(self._held_by(conn, msg.run_id, msg.fence), msg.progress)
        cmd: commands.Command
        if isinstance(msg, messages.Complete):
            cmd = commands.CompleteRun(
                self.rid(),
                now.wall_ms,
                self.fence,
                msg.run_id,
                msg.fence,
                msg.result,
                progress,
            )
        else:
            cmd = commands.FailRun(
                self.rid(),
                now.wall_ms,
                self.fence,
                msg.run_id,
                msg.fence,
                msg.error,
                msg.retryable,
                AttemptOutcome.FAILED,
                self.rand(),
                None if msg.traceback is None else messages.traceback_tail(msg.traceback),
                progress,
            )
        return [Commit(cmd, Finished(conn, msg), RESULT_TIMEOUT_S)]
