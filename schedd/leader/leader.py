"""The leader: runs only while this node leads (dkron's establish/revokeLeadership).

On start it commits a claim for its term (the claim's log index is the leader fence that every
leader command carries), rebuilds its view of the replicated state, then loops.  What it decides
is :class:`schedd.leader.core.LeaderCore`'s (fire due runs, lease queued runs to workers with
room, expire leases whose heartbeats stopped, enforce run timeouts); this module is the asyncio
shell around it: it reads the clocks, sleeps until the next tick, commits the core's commands
through Raft and hands their results back, and writes the core's frames to the workers'
connections.  It is cancelled the moment this node stops leading; a deposed leader's commands
are rejected by ``apply`` on every node.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any, assert_never

from schedd import clock
from schedd.aio import wait_event
from schedd.core import commands
from schedd.core.fairness import TaskLanes
from schedd.core.state import Committed, LeaderEvent, Ok, Result
from schedd.core.wheel import TimingWheel
from schedd.errors import SchedError
from schedd.leader.core import (
    Action,
    Close,
    Commit,
    Lag,
    LeaderCore,
    LeaseLost,
    Log,
    Now,
    PurgeCount,
    Purpose,
    ResultCount,
    Send,
    Settings,
    StepDown,
    Wake,
)
from schedd.leader.workers import LeaseInfo, WorkerConn
from schedd.logs import log_event
from schedd.metrics import Metrics
from schedd.protocol import messages
from schedd.raft.node import RaftNode

log = logging.getLogger(__name__)
core_log = logging.getLogger("schedd.leader.core")  # what the core asks to log (Log actions)

CLAIM_RETRY_S = 0.2
CAPS_TIMEOUT_S = 5.0  # a move of concurrency slots not committed by then is answered 503

_SEQ = itertools.count()


def leader_rid() -> str:
    """A request id for a leader command (unique in this process: the core's ``rid``)."""
    return f"L{next(_SEQ)}"


def now() -> Now:
    return Now(clock.wall_ms(), clock.mono())


class Deadlines:
    """Commits that wait a bounded time for their entry (a worker's result, say), failed with
    ``TimeoutError`` when it passes: one timer for all of them, where a Task and a Timeout each
    cost more than the result they wait for.  Event loop only."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[Committed]]] = []
        self._added = 0  # ties broken by arrival: futures do not compare
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, fut: asyncio.Future[Committed], timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time() + timeout_s
        heapq.heappush(self._heap, (at, self._added, fut))
        self._added += 1
        if self._timer is None or at < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        heap, now_s = self._heap, loop.time()
        while heap and (heap[0][0] <= now_s or heap[0][2].done()):
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_exception(TimeoutError())
        if heap:
            self._timer = loop.call_at(heap[0][0], self._expire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()


class Leader:
    def __init__(
        self,
        node: RaftNode,
        node_id: str,
        http_url: str,
        settings: Settings,
        on_deposed: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.node = node
        self.node_id = node_id
        self.http_url = http_url
        self.on_deposed = on_deposed
        self.ready = asyncio.Event()  # set once claimed and rebuilt
        self.metrics = metrics or Metrics()
        self.core = LeaderCore(node.read, 0, now(), settings, random.random, leader_rid)
        self._wake = asyncio.Event()
        self._deadlines = Deadlines()
        self._stopped = False

    # what the metrics, the worker endpoint and the tests look at
    @property
    def fence(self) -> int:
        return self.core.fence

    @property
    def queues(self) -> dict[str, TaskLanes]:
        return self.core.queues

    @property
    def workers(self) -> dict[str, WorkerConn]:
        return self.core.workers

    @property
    def leases(self) -> dict[str, LeaseInfo]:
        return self.core.leases

    @property
    def wheel(self) -> TimingWheel:
        return self.core.wheel

    # -- establish leadership, then loop ---------------------------------------------------
    async def run(self) -> None:
        # what the entries applied from now on change, for this term (the rebuild skips those
        # it read); a task cancelled before it ran never follows them
        self.node.follow_events(self.on_events)
        try:
            self.core.fence = await self._claim()
            self._do(self.core.rebuild(now()))
            self.ready.set()
            log_event(
                log,
                "leader.ready",
                fence=self.core.fence,
                term=self.node.term,
                wheel=len(self.core.wheel),
                leases=len(self.core.leases),
            )
            while True:
                self._do(self.core.tick(now()))
                self._wake.clear()
                await wait_event(self._wake, self.core.sleep_for(now()))
        finally:
            self._stopped = True
            self.node.unfollow_events(self.on_events)
            self._deadlines.cancel()
            self.ready.clear()
            for conn in list(self.core.workers.values()):
                conn.send(messages.Redirect(leader=None))  # reconnect: a follower will redirect
                conn.close()
            self.core.workers.clear()

    async def _claim(self) -> int:
        while True:
            cmd = commands.Claim(
                leader_rid(), clock.wall_ms(), self.node_id, self.node.term, self.http_url
            )
            try:
                res = await self.node.submit(cmd, timeout=3.0)
            except SchedError as exc:
                log_event(log, "leader.claim_retry", level=logging.WARNING, reason=str(exc))
                await asyncio.sleep(CLAIM_RETRY_S)
                continue
            if isinstance(res, Ok):
                return int(res.value)
            raise RuntimeError(f"claim rejected: {res.message}")

    # -- carrying out the core's actions ---------------------------------------------------
    def _do(self, actions: Iterable[Action]) -> None:
        for act in actions:
            match act:
                case Send(conn, msg):
                    conn.send(msg)
                case Commit(cmd, then, timeout_s):
                    fut = self.node.submit_nowait(cmd)
                    if timeout_s is not None:
                        self._deadlines.add(fut, timeout_s)
                    fut.add_done_callback(functools.partial(self._committed, then))
                case Wake():
                    self._wake.set()
                case Log(event, level, fields):
                    log_event(core_log, event, level, **fields)
                case Lag(stage, seconds, queue, priority, mono, due_ms):
                    observe = (
                        self.metrics.observe_fire_lag
                        if stage == "fire"
                        else self.metrics.observe_lease_lag
                    )
                    observe(seconds, queue, priority, mono, due_ms)
                case ResultCount(accepted):
                    self.metrics.results.labels("true" if accepted else "false").inc()
                case LeaseLost(outcome):
                    self.metrics.leases_lost.labels(outcome).inc()
                case PurgeCount(runs, jobs):
                    self.metrics.purged.labels("runs").inc(runs)
                    self.metrics.purged.labels("jobs").inc(jobs)
                case Close(conn, discard):
                    conn.close(discard=discard)
                case StepDown():
                    self.on_deposed()
                case _:
                    assert_never(act)

    def _committed(self, then: Purpose, fut: asyncio.Future[Committed]) -> None:
        if self._stopped:
            return
        res = None if fut.cancelled() or fut.exception() is not None else fut.result().result
        self._do(self.core.committed(then, res, now()))

    # -- inputs ------------------------------------------------------------------------------
    def on_events(self, index: int, events: list[LeaderEvent]) -> None:
        self._do(self.core.on_events(index, events))

    def connect(self, conn: WorkerConn, resume: tuple[messages.LeaseRef, ...]) -> None:
        self._do(self.core.connect(conn, resume, now()))

    def disconnect(self, conn: WorkerConn) -> None:
        self._do(self.core.disconnect(conn))

    def set_capacity(self, conn: WorkerConn, capacity: int) -> None:
        self._do(self.core.set_capacity(conn, capacity))

    def heard(self, conn: WorkerConn) -> None:
        self._do(self.core.heard(conn, now()))

    def drain(self, worker_id: str) -> WorkerConn | None:
        """Drain the connected worker ``worker_id`` (None: no such worker is connected)."""
        conn = self.core.workers.get(worker_id)
        if conn is not None:
            self._do(self.core.drain(conn))
        return conn

    def heartbeat(self, conn: WorkerConn, refs: tuple[messages.LeaseRef, ...]) -> None:
        self._do(self.core.heartbeat(conn, refs, now()))

    def finish(self, conn: WorkerConn, msg: messages.Complete | messages.Fail) -> None:
        self._do(self.core.finish(conn, msg, now()))

    # -- concurrency caps across shards (schedd.core.allowances; the front door coordinates) --
    def caps_view(self) -> dict[str, Any]:
        """Each capped namespace's allowance, runs in flight and waiting, and the transfers
        this shard gave that are not known to be credited yet."""
        return {"node": self.node_id, **self.core.caps_view()}

    def limit_caps(self, limits: dict[str, int], hold_s: float) -> None:
        self._do(self.core.limit_caps(limits, hold_s, now()))

    async def give_caps(self, namespace: str, amount: int, dest: int) -> Result | None:
        """Give shard ``dest`` up to ``amount`` unused slots of ``namespace``: Ok((seq,
        given)) once applied (given 0: none free), else why not (None: not committed)."""
        fut: asyncio.Future[Result | None] = asyncio.get_running_loop().create_future()

        def reply(res: Result | None) -> None:
            if not fut.done():
                fut.set_result(res)

        self._do(self.core.give(namespace, amount, dest, now(), reply))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), CAPS_TIMEOUT_S)
        except TimeoutError:
            return None  # (its slots stay off this leader's limit until it is known)

    async def take_caps(self, source: int, seq: int, namespace: str, amount: int) -> Result:
        """Credit the transfer ``seq`` of shard ``source`` (Ok(False): credited before)."""
        cmd = commands.CapsTake(
            leader_rid(), clock.wall_ms(), self.core.fence, source, seq, namespace, amount
        )
        return await self.node.submit(cmd, timeout=CAPS_TIMEOUT_S)

    async def caps_delivered(self, dest: int, seq: int) -> Result:
        """The transfers to ``dest`` up to ``seq`` are credited there."""
        cmd = commands.CapsDelivered(leader_rid(), clock.wall_ms(), self.core.fence, dest, seq)
        return await self.node.submit(cmd, timeout=CAPS_TIMEOUT_S)
