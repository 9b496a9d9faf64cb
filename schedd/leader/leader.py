"""The leader: runs only while this node leads (dkron's establish/revokeLeadership).

On start it commits a claim for its term (the claim's log index is the leader fence that every
leader command carries), rebuilds the timing wheel, the ready queues and the lease table from the
replicated state, then loops: fire due runs, lease queued runs to workers with room, expire
leases whose heartbeats stopped, enforce run timeouts.  It is cancelled the moment this node
stops leading; a deposed leader's commands are rejected by ``apply`` on every node.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
from collections.abc import Callable
from typing import Any

from schedd import clock
from schedd.aio import wait_event
from schedd.core import commands as c
from schedd.core.durations import format_time
from schedd.core.fairness import ConcurrencyCaps, ReadyQueues
from schedd.core.model import TERMINAL_RUN_STATES, Attempt, JobStatus, Priority, Run, RunState
from schedd.core.runs import FIRE_AHEAD_MAX_MS, may_fire_ahead
from schedd.core.state import STALE_LEADER, LeaderEvent, Ok, Rejected, Result
from schedd.core.wheel import TimingWheel
from schedd.errors import SchedError
from schedd.leader.workers import LeaseInfo, WorkerConn
from schedd.logs import log_event
from schedd.metrics import Metrics
from schedd.protocol import messages as m
from schedd.raft.node import RaftNode

log = logging.getLogger(__name__)

MAX_FIRE_PER_TICK = 5000
LOAD_CHUNK = 1000  # runs read into the wheel per tick (a read holds the state's lock: ~30 ms)
LOADING_PAUSE_S = 0.002  # between two chunks: the Raft thread takes the lock meanwhile
PURGE_PERIOD_S = 5.0  # between two purges of old history (schedd.core.history)
PURGE_LIMIT = 1000  # runs (and jobs) forgotten per purge command
REBUILD_GRACE_S = 10.0  # a new leader waits this long (at least) for workers to resume leases
_MIN_MS = -(2**62)  # before any due time


_SEQ = itertools.count()


def _rid() -> str:
    """A request id for a leader command.  Leader commands are fenced, not deduplicated, so the
    id only has to differ from the client ids ``apply`` remembers (hex, or ``token:id:digest``);
    a counter is much cheaper than uuid4 at thousands of commands a second."""
    return f"L{next(_SEQ)}"


def _pending(run: Run | None) -> bool:
    """Whether ``run`` is there and not finished (a job's next occurrence should be)."""
    return run is not None and run.state not in TERMINAL_RUN_STATES


def _ignore_result(fut: asyncio.Future[Result]) -> None:
    if not fut.cancelled():
        fut.exception()


class Leader:
    def __init__(
        self,
        node: RaftNode,
        node_id: str,
        http_url: str,
        tick_s: float = 0.01,
        on_deposed: Callable[[], None] = lambda: None,
        caps: dict[str, int] | None = None,
        metrics: Metrics | None = None,
        ahead_s: float = 0.0,
        heartbeat_interval_s: float = 5.0,
        hot_window_s: float = 600.0,
        retention_s: float = 7 * 86_400.0,
        keep_per_job: int = 1_000,
    ) -> None:
        self.node = node
        # The hot window: the wheel holds the runs due before ``loaded_until`` only; the rest
        # wait in the state database's due-time index, and the next stretch is loaded from it
        # when half the window has passed (and at election).  Far-future runs cost no memory.
        self.hot_window_ms = max(1, round(hot_window_s * 1000))
        self.loaded_until = _MIN_MS  # nothing loaded yet
        self._loading = False  # _load_window stopped short of its end: go on at the next tick
        # History retention: a Purge every PURGE_PERIOD_S (at once again while one is full).
        self.retention_ms = max(1, round(retention_s * 1000))
        self.keep_per_job = keep_per_job
        self._next_purge = 0.0  # monotonic time of the next purge (0: none in flight, due)
        self._purging = False
        # Workers heartbeat every heartbeat_interval_s (welcome); a lease whose job allows less
        # than three of those between heartbeats asks for a third of its timeout instead.
        self.heartbeat_interval_s = heartbeat_interval_s
        # Runs that may fire ahead (core.runs.may_fire_ahead) are fired and leased this long
        # before they are due; the worker starts them on time (lease.not_before).
        self.ahead_ms = min(FIRE_AHEAD_MAX_MS, max(0, round(ahead_s * 1000)))
        self.node_id = node_id
        self.http_url = http_url
        self.on_deposed = on_deposed
        self.fence = 0
        self.ready = asyncio.Event()  # set once claimed and rebuilt
        self.wheel = TimingWheel(clock.wall_ms(), tick_ms=max(1, round(tick_s * 1000)))
        self.queues: dict[str, ReadyQueues] = {}  # queue name -> runs ready for a worker
        self.metrics = metrics or Metrics()
        self.caps = ConcurrencyCaps(caps or {})  # per-namespace limit on leases at once
        self.namespace_of: dict[str, str] = {}  # run id -> namespace, for queued and leased runs
        self.leases: dict[str, LeaseInfo] = {}
        self.by_worker: dict[str, set[str]] = {}  # worker id -> run ids of its leases (above)
        self.workers: dict[str, WorkerConn] = {}
        self._rebuilt_at = -1
        self._wake = asyncio.Event()
        self._rr = 0
        self._to_heal: list[str] = []

    # -- establish leadership --------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._claim()
            self._rebuild()
            for job_id in self._to_heal:  # a recurring job without its next occurrence
                fut = self.node.submit_nowait(c.Heal(_rid(), clock.wall_ms(), self.fence, job_id))
                fut.add_done_callback(_ignore_result)  # retried at the next leadership if lost
            self.ready.set()
            log_event(
                log,
                "leader.ready",
                fence=self.fence,
                term=self.node.term,
                wheel=len(self.wheel),
                leases=len(self.leases),
            )
            while True:
                self._tick()
                self._wake.clear()
                await wait_event(self._wake, self._sleep_for())
        finally:
            self.ready.clear()
            for conn in list(self.workers.values()):
                conn.send(m.Redirect(leader=None))  # reconnect: a follower will redirect
                conn.close()
            self.workers.clear()

    async def _claim(self) -> None:
        while True:
            cmd = c.Claim(_rid(), clock.wall_ms(), self.node_id, self.node.term, self.http_url)
            try:
                res = await self.node.submit(cmd, timeout=3.0)
            except SchedError as exc:
                log_event(log, "leader.claim_retry", level=logging.WARNING, reason=str(exc))
                await asyncio.sleep(0.2)
                continue
            if isinstance(res, Ok):
                self.fence = int(res.value)
                return
            raise RuntimeError(f"claim rejected: {res.message}")

    def _rebuild(self) -> None:
        now_mono = clock.mono()
        with self.node.read() as st:
            self._to_heal = [
                job.id
                for job in st.active_recurring_jobs()
                if not _pending(st.runs.get(job.next_run_id) if job.next_run_id else None)
            ]
            self._rebuilt_at = st.applied_index
            if st.leader_fence != self.fence:
                raise RuntimeError("another leader claimed after us")
            # same read (the lock nests); the rest of the window chunk by chunk (_tick)
            self._load_window(clock.wall_ms() + self.hot_window_ms)
            for run in st.live_runs():
                if run.state is RunState.QUEUED:
                    spec = st.jobs[run.job_id].spec
                    self._enqueue(run.id, spec.queue, spec.priority, spec.namespace)
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
                            now_mono + max(hb, REBUILD_GRACE_S),
                            hb,
                            run.current.deadline_ms,
                        )
                    )

    # -- events from apply -----------------------------------------------------------------
    def on_events(self, index: int, events: list[LeaderEvent]) -> None:
        if index <= self._rebuilt_at:
            return
        for ev in events:
            kind, run_id = ev[0], ev[1]
            if kind == "leased":
                self.wheel.remove(run_id)
                self._dequeue(run_id)
                continue
            if kind == "stop":
                info = self.leases.get(run_id)
                conn = self.workers.get(info.worker_id) if info else None
                if conn is not None:
                    conn.send(m.Cancel(run_id=run_id, fence=int(ev[2])))
            self._forget(run_id)
            if kind == "due" and int(ev[2]) < self.loaded_until:  # else loaded in its time
                self.wheel.add(run_id, self._fire_at(int(ev[2]), bool(ev[3])))
            elif kind == "ready":
                self._enqueue(run_id, ev[2], Priority(ev[3]), ev[4])
        self._wake.set()

    def _fire_at(self, due_ms: int, ahead: bool) -> int:
        return due_ms - self.ahead_ms if ahead else due_ms

    def _enqueue(self, run_id: str, queue: str, priority: Priority, namespace: str) -> None:
        lanes = self.queues.get(queue)
        if lanes is None:
            self.queues[queue] = lanes = ReadyQueues()
        lanes.push(run_id, namespace, priority)
        self.namespace_of[run_id] = namespace

    def _dequeue(self, run_id: str) -> None:
        for lanes in self.queues.values():
            if lanes.remove(run_id):
                return

    def _forget(self, run_id: str) -> None:
        self.wheel.remove(run_id)
        self._dequeue(run_id)
        info = self.leases.pop(run_id, None)
        ns = self.namespace_of.pop(run_id, None)
        if info is not None:
            self._untrack(info)
            if ns is not None:
                self.caps.release(ns)
            conn = self.workers.get(info.worker_id)
            if conn is not None:
                conn.leases.pop(run_id, None)
            self._wake.set()

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
    def _sleep_for(self) -> float:
        if self._loading:
            return LOADING_PAUSE_S
        nxt = self.wheel.next_due_ms()
        if nxt is None:
            return 0.25
        return min(0.25, max(0.0, (nxt - clock.wall_ms()) / 1000))

    def _tick(self) -> None:
        now = clock.wall_ms()
        if now + self.hot_window_ms // 2 >= self.loaded_until or self._loading:
            self._load_window(now + self.hot_window_ms)
        if not self._purging and clock.mono() >= self._next_purge:
            self._purge(now)
        self._fire_due(now)
        self._dispatch(now)
        self._check_leases(now)

    def _load_window(self, until: int) -> None:
        """Put the runs due in ``[loaded_until, until)`` into the wheel (from the database's
        due-time index), at most about LOAD_CHUNK of them: ``loaded_until`` then stops where
        they do, and the next tick goes on from there.  Each read holds the state's lock, which
        the Raft thread needs to apply entries (and then to send its heartbeats): a new leader
        with 100,000 runs in its window would hold it for seconds in one read.  Events of
        entries applied before a read but handled after it are replayed on top in order, so
        the wheel ends up as the state is."""
        start = self.loaded_until
        with self.node.read() as st:
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
        log_event(
            log, "leader.window_loaded", logging.DEBUG, runs=len(runs), start=start, until=reached
        )
        self.loaded_until = reached
        self._loading = reached < until

    def _purge(self, now: int) -> None:
        self._purging = True
        fut = self.node.submit_nowait(
            c.Purge(
                _rid(), now, self.fence, now - self.retention_ms, self.keep_per_job, PURGE_LIMIT
            )
        )
        fut.add_done_callback(self._purged)

    def _purged(self, fut: asyncio.Future[Result]) -> None:
        self._purging = False
        self._next_purge = clock.mono() + PURGE_PERIOD_S
        if fut.cancelled() or fut.exception() is not None:
            return
        res = fut.result()
        if self._deposed(res) or not isinstance(res, Ok):
            return
        runs, jobs = res.value
        self.metrics.purged.labels("runs").inc(runs)
        self.metrics.purged.labels("jobs").inc(jobs)
        if runs >= PURGE_LIMIT or jobs >= PURGE_LIMIT:  # more to forget: go on at once
            self._next_purge = 0.0
            self._wake.set()

    def _fire_due(self, now: int) -> None:
        due = self.wheel.advance(now)
        for start in range(0, len(due), MAX_FIRE_PER_TICK):
            chunk = tuple(due[start : start + MAX_FIRE_PER_TICK])
            fut = self.node.submit_nowait(c.Fire(_rid(), now, self.fence, chunk))
            fut.add_done_callback(functools.partial(self._fired, chunk=chunk))

    def _fired(self, fut: asyncio.Future[Result], chunk: tuple[str, ...]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None and self._deposed(fut.result()):
            return
        if exc is None:
            self._observe_fire_lag(fut.result(), chunk)
        # Whatever did not fire (not committed, or refused: e.g. "not due yet" when this node's
        # wall clock stepped back) goes back into the wheel, or it would never fire.  A paused
        # job's runs wait for resume, which schedules them again.
        with self.node.read() as st:
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
        self._wake.set()

    def _observe_fire_lag(self, res: Result, chunk: tuple[str, ...]) -> None:
        if not isinstance(res, Ok):
            return
        now = clock.wall_ms()
        with self.node.read() as st:
            for rid, r in zip(chunk, res.value, strict=False):
                run = st.runs.get(rid) if isinstance(r, Ok) else None
                if run is not None:
                    self.metrics.fire_lag.observe(max(0, now - run.due_ms) / 1000)

    def _deposed(self, res: Result) -> bool:
        if isinstance(res, Rejected) and res.code == STALE_LEADER:
            log_event(log, "leader.deposed", level=logging.WARNING, reason=res.message)
            self.on_deposed()
            return True
        return False

    def _dispatch(self, now: int) -> None:
        grants: list[tuple[str, str]] = []
        reserved: list[WorkerConn] = []
        conns = list(self.workers.values())
        if len(conns) > 1:  # rotate, so the first-connected worker is not always served first
            self._rr = (self._rr + 1) % len(conns)
            conns = conns[self._rr :] + conns[: self._rr]
        for conn in conns:
            room = conn.free
            while room > 0:
                run_id = self._pop_ready(conn.queues)
                if run_id is None:
                    break
                grants.append((run_id, conn.worker_id))
                reserved.append(conn)
                conn.reserved += 1
                room -= 1
        if not grants:
            return
        fut = self.node.submit_nowait(c.LeaseRuns(_rid(), now, self.fence, tuple(grants)))
        fut.add_done_callback(functools.partial(self._leased, grants=grants, reserved=reserved))

    def _pop_ready(self, queues: tuple[str, ...]) -> str | None:
        """Priorities by weight and namespaces by deficit round robin (core.fairness)."""
        for q in queues:
            lanes = self.queues.get(q)
            if lanes:
                run_id = lanes.pop(self.caps.can_take)
                if run_id is not None:
                    self.caps.acquire(self.namespace_of.get(run_id, ""))
                    return run_id
        return None

    def _leased(
        self, fut: asyncio.Future[Result], grants: list[tuple[str, str]], reserved: list[WorkerConn]
    ) -> None:
        # On the connections that reserved the room: a worker that reconnected meanwhile has a
        # new connection object, whose count must not go below zero (it would take one lease
        # more than its capacity, which the worker refuses, costing the run an attempt).
        for held in reserved:
            held.reserved -= 1
        self._wake.set()
        if fut.cancelled() or fut.exception() is not None:
            self._requeue([rid for rid, _ in grants])
            return
        res = fut.result()
        if self._deposed(res) or not isinstance(res, Ok):
            self._requeue([rid for rid, _ in grants])
            return
        now_mono, now_ms = clock.mono(), clock.wall_ms()
        with self.node.read() as st:
            for (run_id, wid), r in zip(grants, res.value, strict=True):
                if not isinstance(r, Ok):
                    ns = self.namespace_of.pop(run_id, None)
                    if ns is not None:
                        self.caps.release(ns)
                    continue
                attempt: Attempt = r.value
                run = st.runs[run_id]
                self.metrics.lease_lag.observe(max(0.0, (attempt.leased_ms - run.due_ms) / 1000))
                spec = st.jobs[run.job_id].spec
                hb = spec.heartbeat_timeout_ms / 1000
                self._track(
                    LeaseInfo(run_id, attempt.fence, wid, now_mono + hb, hb, attempt.deadline_ms)
                )
                conn = self.workers.get(wid)
                if conn is None:
                    continue  # it reconnects and resumes, or the lease expires
                conn.leases[run_id] = attempt.fence
                conn.send(
                    m.Lease(
                        run_id=run_id,
                        job_id=run.job_id,
                        attempt=attempt.number,
                        fence=attempt.fence,
                        task=spec.task,
                        payload=spec.payload,
                        scheduled_at=format_time(run.scheduled_ms) or "",
                        deadline=format_time(attempt.deadline_ms),
                        idempotency_key=spec.idempotency_key,
                        not_before=format_time(run.due_ms) if run.due_ms > now_ms else None,
                        heartbeat_interval=hb / 3 if hb / 3 < self.heartbeat_interval_s else None,
                    )
                )
                log_event(
                    log,
                    "run.leased",
                    logging.DEBUG,
                    run_id=run_id,
                    fence=attempt.fence,
                    worker_id=wid,
                )

    def _requeue(self, run_ids: list[str]) -> None:
        for rid in run_ids:
            if rid not in self.leases and rid in self.namespace_of:
                self.caps.release(self.namespace_of[rid])
        with self.node.read() as st:
            for rid in run_ids:
                run = st.runs.get(rid)
                if run is not None and run.state is RunState.QUEUED:
                    spec = st.jobs[run.job_id].spec
                    self._enqueue(rid, spec.queue, spec.priority, spec.namespace)

    def _check_leases(self, now: int) -> None:
        now_mono = clock.mono()
        for info in list(self.leases.values()):
            if info.ending:
                continue
            if info.expires < now_mono:
                self._end_lease(
                    info,
                    now,
                    "lost",
                    f"lease lost: no heartbeat within {info.heartbeat_timeout:g}s",
                )
            elif info.deadline_ms is not None and info.deadline_ms < now:
                conn = self.workers.get(info.worker_id)
                if conn is not None:
                    conn.send(m.Cancel(run_id=info.run_id, fence=info.fence))
                self._end_lease(info, now, "timed_out", "timed out")

    def _end_lease(self, info: LeaseInfo, now: int, outcome: str, error: str) -> None:
        info.ending = True
        self.metrics.leases_lost.labels(outcome).inc()
        cmd = c.FailRun(
            _rid(), now, self.fence, info.run_id, info.fence, error, True, outcome, random.random()
        )
        fut = self.node.submit_nowait(cmd)
        log_event(
            log,
            "run.lease_" + outcome,
            run_id=info.run_id,
            fence=info.fence,
            worker_id=info.worker_id,
        )
        conn = self.workers.get(info.worker_id)
        if conn is not None and outcome == "lost":
            # A stalled worker still connected: it must drop the lease before it counts as
            # having room again, else new leases would reach it while it is full (the cancel is
            # ahead of them on the same socket).
            conn.send(m.Cancel(run_id=info.run_id, fence=info.fence))

        def done(f: asyncio.Future[Result]) -> None:
            if f.cancelled() or f.exception() is not None:
                info.ending = False  # retried on a later tick
            elif isinstance(f.result(), Rejected):
                self._deposed(f.result())

        fut.add_done_callback(done)

    # -- workers ---------------------------------------------------------------------------
    def connect(self, conn: WorkerConn, resume: tuple[m.LeaseRef, ...]) -> None:
        wid = conn.worker_id
        old = self.workers.get(wid)
        if old is not None and old is not conn:
            if not old.closed:
                log_event(
                    log,
                    "worker.replaced",
                    worker_id=wid,
                    hint="a new connection said hello with the id of a connected worker: "
                    "a reconnect, or two workers with one id (ids must be unique)",
                )
            old.close(discard=True)
        self.workers[wid] = conn
        now_mono, now = clock.mono(), clock.wall_ms()
        listed: set[str] = set()
        for ref in resume:
            info = self.leases.get(ref.run_id)
            if info is not None and info.fence == ref.fence and not info.ending:
                if info.worker_id != wid:
                    self._untrack(info)
                    info.worker_id = wid
                    self.by_worker.setdefault(wid, set()).add(info.run_id)
                info.expires = now_mono + info.heartbeat_timeout
                conn.leases[ref.run_id] = ref.fence
                listed.add(ref.run_id)
            else:
                # Not a live lease any more (or one being ended): the worker must stop it (a
                # finished result is still sent and refused by fence, never applied).
                conn.send(m.Cancel(run_id=ref.run_id, fence=ref.fence))
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
        #   connection are dropped above (``close(discard=True)``), and each lease ended here
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
        for run_id in sorted(self.by_worker.get(wid, set()) - listed):
            info = self.leases[run_id]
            if not info.ending:
                self._end_lease(
                    info,
                    now,
                    "lost",
                    "lease lost: the worker reconnected without it (never delivered)",
                )
        log_event(
            log,
            "worker.connected",
            worker_id=wid,
            queues=list(conn.queues),
            capacity=conn.capacity,
            resumed=len(conn.leases),
        )
        self._wake.set()

    def disconnect(self, conn: WorkerConn) -> None:
        if self.workers.get(conn.worker_id) is conn:
            del self.workers[conn.worker_id]
        log_event(log, "worker.disconnected", worker_id=conn.worker_id, leases=len(conn.leases))

    def heartbeat(self, conn: WorkerConn, refs: tuple[m.LeaseRef, ...]) -> None:
        now_mono = clock.mono()
        for ref in refs:
            info = self.leases.get(ref.run_id)
            if info is not None and info.fence == ref.fence and info.worker_id == conn.worker_id:
                info.expires = now_mono + info.heartbeat_timeout

    async def finish(self, conn: WorkerConn, msg: m.Complete | m.Fail) -> None:
        now = clock.wall_ms()
        cmd: c.Command
        if isinstance(msg, m.Complete):
            cmd = c.CompleteRun(_rid(), now, self.fence, msg.run_id, msg.fence, msg.result)
        else:
            cmd = c.FailRun(
                _rid(),
                now,
                self.fence,
                msg.run_id,
                msg.fence,
                msg.error,
                msg.retryable,
                "failed",
                random.random(),
            )
        try:
            res = await self.node.submit(cmd, timeout=5.0)
        except SchedError:
            return  # no ack: the worker keeps the result and re-sends it after reconnecting
        self.metrics.results.labels("true" if isinstance(res, Ok) else "false").inc()
        if isinstance(res, Ok):
            conn.send(m.Ack(run_id=msg.run_id, accepted=True))
            ok = isinstance(msg, m.Complete)
            log_event(
                log,
                "run.finished",
                logging.DEBUG if ok else logging.INFO,
                run_id=msg.run_id,
                fence=msg.fence,
                outcome="succeeded" if ok else "failed",
            )
        else:
            self._deposed(res)
            conn.send(m.Ack(run_id=msg.run_id, accepted=False, reason=res.message))
            log_event(
                log,
                "run.result_refused",
                level=logging.WARNING,
                run_id=msg.run_id,
                fence=msg.fence,
                reason=res.message,
            )
        conn.leases.pop(msg.run_id, None)
        self._wake.set()

    def workers_view(self) -> list[dict[str, Any]]:
        return [
            {
                "worker_id": w.worker_id,
                "queues": list(w.queues),
                "capacity": w.capacity,
                "leases": len(w.leases),
                "connected_at": format_time(w.connected_at_ms),
                "draining": w.draining,
            }
            for w in self.workers.values()
        ]
