"""Power loss, on a filesystem that forgets what was not synced (tests/cluster/lossyfs.py).

Every node's data directory is a lossy FUSE mount.  The whole cluster loses power while clients
submit: all three nodes are killed at once, each filesystem puts back every file as it was at
its last sync (or keeps a random prefix of the unsynced writes: torn tails), and the nodes start
again on what is left.  Every job the cluster acknowledged must be there, on every node, every
replica must hold the same jobs, and no node may refuse to start.  A single node also loses
power in the middle of a log compaction (the marker written after the barrier) and in the
middle of a SQLite checkpoint.

The last test shows that the first one can fail: the same power loss on nodes whose journal
never syncs (``fdatasync`` replaced in the node processes) loses acknowledged jobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.cluster.harness import REPO, Cluster
from tests.cluster.lossyfs import LossyMount, available, lossy_cluster
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(420),
    pytest.mark.skipif(available() is not None, reason=str(available())),
    pytest.mark.long,  # the fault-injection tier (scripts/test --long)
]

SUBMITTERS = 8
#: small compaction thresholds: snapshots are written often, under the load
RAFT = {"log_compaction_min_entries": 200, "log_compaction_min_time": "2s"}


async def submit_until(
    http: aiohttp.ClientSession, cluster: Cluster, acked: list[str], stop: asyncio.Event, k: int
) -> None:
    """Submit one job at a time to node ``k`` (the next one on a failure) until ``stop``."""
    i = k
    while not stop.is_set():
        body = {"task": "acc.record", "schedule": {"in": "1h"}, "payload": {"n": len(acked)}}
        try:
            async with http.post(
                cluster.urls[i % cluster.size] + "/api/v1/jobs",
                data=orjson.dumps(body),
                headers=cluster.headers(),
                timeout=aiohttp.ClientTimeout(total=10),
            ) as r:
                if r.status == 201:
                    acked.append(str((await r.json())["id"]))
                    continue
        except (aiohttp.ClientError, TimeoutError):
            pass
        i += 1
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def submitting(
    http: aiohttp.ClientSession, cluster: Cluster, acked: list[str]
) -> AsyncIterator[None]:
    """SUBMITTERS clients submitting (:func:`submit_until`) while the block runs."""
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(submit_until(http, cluster, acked, stop, k)) for k in range(SUBMITTERS)
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def load_then_lose_power(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    mounts: list[LossyMount],
    acked: list[str],
    rng: random.Random,
    keep: str,
) -> int:
    """Submit until a random number of acknowledgements, kill every node at once with jobs in
    flight, and drop what each filesystem had not synced.  Returns the writes undone."""
    before = len(acked)
    target = before + rng.randint(150, 400)
    async with submitting(http, cluster, acked):
        await wait_for(lambda: len(acked) >= target, timeout=120, interval=0.005)
        for n in cluster.nodes:  # all at once: the power goes
            assert n.proc is not None
            n.proc.send_signal(signal.SIGKILL)
        # Whatever the killed nodes answered before they died counts as acknowledged.
        for n in cluster.nodes:
            assert n.proc is not None
            n.proc.wait(10)
    return sum(m.crash(keep, rng.randrange(1 << 30)) for m in mounts)


async def check_every_node(
    http: aiohttp.ClientSession, cluster: Cluster, acked: list[str], timeout: float = 60
) -> None:
    """Every acknowledged job on every node, and every replica the same jobs."""
    await cluster.wait_leader(http, timeout=timeout)
    want = set(acked)

    async def complete(url: str) -> set[str] | None:
        ids = await cluster.job_ids(http, url)
        return ids if ids is not None and want <= ids else None

    for url in cluster.urls:
        try:
            await wait_for(lambda u=url: complete(u), timeout=timeout)
        except AssertionError:
            ids = await cluster.job_ids(http, url) or set()
            raise AssertionError(
                f"{url} lost {len(want - ids)} of {len(want)} acknowledged jobs: "
                f"{sorted(want - ids)[:5]}\n{cluster.logs()}"
            ) from None

    # Every replica the same (a submit whose answer the power cut off may have made a job
    # beyond those acknowledged: on every node alike, once they have all caught up)
    async def same() -> bool:
        sets = [await cluster.job_ids(http, url) for url in cluster.urls]
        return all(s is not None for s in sets) and sets[0] == sets[1] == sets[2]

    await wait_for(same, timeout=30)
    assert all(n.alive for n in cluster.nodes), cluster.logs()


@pytest.mark.parametrize(("keep", "seed"), [("none", 1), ("random", 2)])
async def test_power_loss_of_every_node_loses_no_acknowledged_job(
    tmp_path: Path, keep: str, seed: int
) -> None:
    rng = random.Random(seed)
    with lossy_cluster(tmp_path, raft=dict(RAFT)) as (cluster, mounts):
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            acked: list[str] = []
            for _ in range(2):  # twice: a recovered cluster must survive the next one too
                undone = await load_then_lose_power(http, cluster, mounts, acked, rng, keep)
                assert undone > 0  # there was unsynced data to lose
                cluster.start()
                await check_every_node(http, cluster, acked)


@pytest.mark.parametrize(
    "file", ["raft.dump.new", "state.db"], ids=["compaction-barrier", "checkpoint"]
)
async def test_power_loss_of_one_node_in_the_middle_of_a_write(tmp_path: Path, file: str) -> None:
    """``raft.dump.new``: the compaction's marker being written, after the state database's log
    was synced (the barrier); ``state.db``: written only by a checkpoint (the state database is
    in WAL mode)."""
    with lossy_cluster(tmp_path, raft=dict(RAFT)) as (cluster, mounts):
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)  # the other follower votes meanwhile
            victim = (leader + 1) % cluster.size
            proc = cluster.nodes[victim].proc
            assert proc is not None
            mounts[victim].call(f"trap {file} {proc.pid} 3")
            acked: list[str] = []
            async with submitting(http, cluster, acked):
                await wait_for(lambda: proc.poll() is not None, timeout=120, interval=0.05)
                assert mounts[victim].call("status")["trapped"]
                await wait_for(lambda: len(acked) >= 100, timeout=60)
            cluster.start(victim)
            await check_every_node(http, cluster, acked)


SITE_NO_FSYNC = """\
import schedd.raft.journal as journal
journal._fdatasync = lambda fd: None  # a deliberately broken build: the journal never syncs
"""


@pytest.mark.long
async def test_the_power_loss_test_fails_when_the_journal_does_not_sync(tmp_path: Path) -> None:
    site = tmp_path / "broken"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE_NO_FSYNC)
    rng = random.Random(3)
    path = f"{site}{os.pathsep}{REPO}"
    with lossy_cluster(tmp_path, raft=dict(RAFT), env={"PYTHONPATH": path}) as (cluster, mounts):
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            acked: list[str] = []
            # What it loses is what was acknowledged since the state databases' last
            # checkpoint (0.2 s at most): almost always something, but a power loss just
            # after a checkpoint with nothing in flight could lose nothing - up to 3 of them.
            for _ in range(3):
                await load_then_lose_power(http, cluster, mounts, acked, rng, "none")
                cluster.start()
                try:
                    await check_every_node(http, cluster, acked, timeout=20)
                except AssertionError as failure:
                    assert re.search(r"lost \d+ of|no leader", str(failure)), failure
                    return
            raise AssertionError("3 power losses on a journal that never syncs lost nothing")
