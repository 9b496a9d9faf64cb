"""Three real nodes and an SDK worker (in this process, so its reconnect log can be read):
after the leader is SIGKILLed the worker reaches the new leader without backing off, and a
node that knows no leader holds a worker's hello instead of having it poll.

Assertions are on the worker's reconnect decisions (the delays it chose, how many attempts),
not on wall-clock bounds: before this change the delays grew 0.05 -> 0.1 -> 0.2 -> 0.4 ... 2 s
with every "no leader yet" answer or refused connection during an election."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from schedd.worker.client import STABLE_SESSION, Worker
from schedd.worker.registry import Registry
from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

_DELAY = re.compile(r"worker\.reconnect target=(\S+) in=([\d.]+)s(?: after=(\S+))?")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def reconnects(self, since: float, until: float = float("inf")) -> list[tuple[float, str, str]]:
        """(delay, target, after) of each reconnect the worker scheduled in [since, until]."""
        out = []
        for r in self.records:
            found = _DELAY.search(r.getMessage())
            if found and since <= r.created <= until:
                out.append((float(found[2]), found[1], found[3] or "?"))
        return out

    def welcomes(self) -> list[logging.LogRecord]:
        return [r for r in self.records if "worker.welcome" in r.getMessage()]

    def first(self, event: str, since: float) -> float:
        return min(
            (r.created for r in self.records if event in r.getMessage() and r.created >= since),
            default=float("inf"),
        )


@contextlib.asynccontextmanager
async def sdk_worker(urls: list[str], token: str) -> AsyncIterator[tuple[Worker, _Records]]:
    logger = logging.getLogger("schedd.worker.client")
    records = _Records()
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    w = Worker(urls, token=token, worker_id="w-reconnect", registry=Registry(), concurrency=1)
    stop = asyncio.Event()
    task = asyncio.create_task(w.serve(stop))
    try:
        yield w, records
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 40)
        finally:
            logger.removeHandler(records)
            logger.setLevel(level)


async def wait_until(pred: object, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s\n{cluster.logs()}")
        await asyncio.sleep(0.02)


async def test_worker_reaches_the_new_leader_without_backing_off(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c")
    try:
        cluster.start()
        async with (
            aiohttp.ClientSession() as http,
            sdk_worker(cluster.urls, cluster.token) as (w, rec),
        ):
            # Kill only once the worker has been with the leader a while: a session that ends
            # sooner than STABLE_SESSION keeps the backoff of the attempts before it (here: the
            # worker started before the nodes listened); a real failover comes long after the
            # worker's last one.  Start over if the leader changes meanwhile (the cluster's
            # first election can be followed by another).
            deadline = time.monotonic() + 90
            while True:
                assert time.monotonic() < deadline, f"no stable leader and worker\n{cluster.logs()}"
                leader = await cluster.wait_serving(http)  # the others can elect when it dies
                old_id = cluster.nodes[leader].node_id
                if not (w.connected and w.node_id == old_id):
                    await asyncio.sleep(0.2)
                    continue
                welcomes = len(rec.welcomes())
                await asyncio.sleep(STABLE_SESSION + 0.5)
                if (
                    w.connected
                    and w.node_id == old_id
                    and len(rec.welcomes()) == welcomes
                    and await cluster.wait_leader(http) == leader
                ):
                    break
            t_kill = time.time()
            cluster.kill(leader, signal.SIGKILL)
            new = await cluster.wait_leader(http, exclude=leader)
            new_id = cluster.nodes[new].node_id
            await wait_until(
                lambda: w.connected and w.node_id == new_id,
                30,
                "worker welcomed by the new leader",
                cluster,
            )
            welcomed = rec.first(f"worker.welcome node={new_id}", t_kill)
            tries = rec.reconnects(t_kill, welcomed)
        # Each delay is one of: after the drop 50-100 ms, after the dead node refused 0-100 ms,
        # after a "no leader yet" 100-200 ms; none grows with the attempts.
        assert tries, rec.records
        assert max(d for d, _, _ in tries) <= 0.2, tries
        # A surviving node holds the hello until it knows the new leader: a handful of
        # connections, not one every 0.1-0.2 s for the length of the election.
        assert len(tries) <= 6, tries
        # The dead node is tried right after the drop and then passed over (again at most once
        # more, should an election outlast a hold and the node's DOWN_FOR).
        dead = cluster.nodes[leader].url
        assert sum(1 for _, target, _ in tries if target == dead) <= 2, tries
    finally:
        cluster.stop()


async def test_no_leader_yet_is_held_by_the_node_then_retried_soon(tmp_path: Path) -> None:
    """One node of three: no quorum, so no leader for as long as the test runs."""
    cluster = Cluster(tmp_path / "c")
    try:
        cluster.start(0)
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # wait until it serves HTTP
                try:
                    async with http.get(cluster.nodes[0].url + "/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        async with sdk_worker([cluster.nodes[0].url], cluster.token) as (w, rec):
            t0 = time.time()
            await wait_until(lambda: len(rec.reconnects(t0)) >= 3, 30, "three answers", cluster)
            elapsed = time.time() - t0
            tries = rec.reconnects(t0)[:3]
            assert not w.connected
        assert [after for _, _, after in tries] == ["no_leader"] * 3, tries
        # The node held each hello (HELLO_HOLD_S = 3 s) before it answered "no leader yet"...
        assert elapsed >= 3 * 2.5, (elapsed, tries)
        # ...and the worker came back 0.1-0.2 s after each answer, without backing off.
        assert all(0.1 <= d <= 0.2 for d, _, _ in tries[:2]), tries
    finally:
        cluster.stop()
