"""A rolling upgrade of a cluster of three shards from an earlier build, under load, with the
real binaries.

Three nodes of :data:`SHARDS_RELEASE` (built into a virtualenv of its own by
``tests/acceptance/upgrade.py``), each a supervisor with a process per shard, serve two workers
of this tree, each connected to one node only and taking one queue: worker ``a`` on the node
upgraded first (queue ``a``, and a job recurring every second), worker ``b`` on the node
upgraded last (queue ``b``).  One-off jobs are submitted to both queues at a steady rate through
every node.  The nodes are upgraded to this tree one at a time: SIGTERM (the node hands every
shard it leads to another node), the same data directory started with this tree's ``schedd``,
and the next only once the node has applied what every shard's leader had committed.  Between
the first node's return and the last node's stop the cluster is mixed: worker ``a``'s front
door is of this tree and some shards are led by nodes of the earlier build, worker ``b``'s the
other way round.

At the end every acknowledged job is on every node once and succeeded, each run's fence was
executed once, no submit waited longer than MAX_SUBMIT_S, the recurring job fired on after the
last upgrade, and no one-off job submitted while the cluster was mixed waited for its
execution longer than :data:`MAX_WAIT_S`: each worker was served from every shard, whichever
build its node and the shards' leaders ran."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest

from tests.acceptance.test_rolling_upgrade import (
    MAX_SUBMIT_S,
    SCHEDULER,
    Load,
    executions,
    node_jobs,
    p99,
    ran_since,
    until,
    upgrade,
)
from tests.acceptance.upgrade import SHARDS_RELEASE, release_bin
from tests.cluster.harness import BIN, REPO, Cluster
from tests.cluster.test_shards_rolling import caught_up, serving

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.long,  # an upgrade under load, a minute: the fault-injection tier
    pytest.mark.timeout(480),  # the earlier build's virtualenv is built on the first run
    pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the repository's history"),
]

SHARDS = 3
SETTLE_S = 4.0  # load between one upgrade and the next
#: the longest a one-off job may wait from its submit until the worker runs it: a node's stop
#: and the shards' hand-over take a second or two; a shard whose runs no worker is served
#: would wait for the whole of the next node's upgrade
MAX_WAIT_S = 5.0


def start_worker(cluster: Cluster, queue: str, i: int) -> None:
    """A worker taking queue ``queue`` from node i only."""
    cluster.spawn(
        [
            *(str(BIN / "schedd-worker"), f"--token={cluster.token}", "--worker-id", queue),
            *("--server", cluster.urls[i], "--queue", queue, "--concurrency", "16"),
            *("--import", "tests.acceptance.tasks", "--drain-timeout", "1"),
        ],
        cluster.root / f"worker-{queue}.log",
    )


async def test_a_rolling_upgrade_of_three_shards_from_an_earlier_build(
    tmp_path: Path, timed_record: Path
) -> None:
    built = time.monotonic()
    earlier = release_bin(SHARDS_RELEASE)
    build_s = time.monotonic() - built
    cluster = Cluster(tmp_path / "cluster", scheduler=SCHEDULER, shards=SHARDS)
    cluster.bins.update({i: earlier for i in range(3)})
    load_task: asyncio.Task[None] | None = None
    try:
        cluster.start()
        async with serving(cluster) as (http, client):
            start_worker(cluster, "a", 0)
            start_worker(cluster, "b", 2)
            tick = await client.submit(
                "acc.record", {"sleep": 0}, every="1s", queue="a", heartbeat_timeout="3s"
            )
            load = Load(client, queues=("a", "b"))
            load_task = asyncio.create_task(load.run())
            await asyncio.sleep(SETTLE_S)
            began = time.monotonic()
            mixed_ms = [0, 0]  # the wall-clock ms the cluster was mixed from, and until
            rejoin: list[float] = []
            for i in range(3):
                if i == 2:
                    mixed_ms[1] = time.time_ns() // 1_000_000
                # SIGTERM, then this tree's schedd on the same data directory
                _, back_s = await upgrade(http, cluster, i, caught=caught_up)
                rejoin.append(back_s)
                if i == 0:
                    mixed_ms[0] = time.time_ns() // 1_000_000
                await asyncio.sleep(SETTLE_S)
            upgraded_s = time.monotonic() - began
            last_ms = time.time_ns() // 1_000_000
            await until(
                "the recurring job runs after the last upgrade",
                lambda: ran_since(timed_record, tick.id, last_ms) >= 3,
                20,
                cluster,
            )
            load.stop.set()
            await load_task
            load_task = None

            assert not load.failed, {k: repr(e) for k, e in list(load.failed.items())[:5]}
            slowest = max(s for _, s in load.timings)
            assert slowest <= MAX_SUBMIT_S, slowest
            acked = set(load.acked.values())
            assert len(acked) == len(load.acked) >= 100  # one job per submit

            async def all_done() -> dict[str, float] | None:
                """Each acknowledged job's due time (ms), once it succeeded on every node."""
                due: dict[str, float] = {}
                for i in range(3):
                    jobs = await node_jobs(cluster, i)
                    ids = collections.Counter(j.id for j in jobs)
                    if any(n > 1 for n in ids.values()) or not acked <= set(ids):
                        return None
                    for j in jobs:
                        if j.id not in acked:
                            continue
                        run = j.latest_run
                        if run is None or run.state != "succeeded" or run.scheduled_at is None:
                            return None
                        due[j.id] = run.scheduled_at.timestamp() * 1000
                return due

            due = await until(
                "every acknowledged job succeeded, on every node, once", all_done, 60, cluster
            )
            ran = executions(timed_record)
            fences = collections.Counter((run_id, fence) for run_id, fence, _ in ran)
            assert all(n == 1 for n in fences.values()), fences.most_common(3)
            first: dict[str, int] = {}
            for run_id, _, ms in ran:
                job_id = run_id.split("@")[0]
                first[job_id] = min(ms, first.get(job_id, ms))
            waits = sorted(
                (first[j] - due[j]) / 1000 for j in acked if mixed_ms[0] <= due[j] < mixed_ms[1]
            )
            assert len(waits) >= 50, "too few jobs submitted while the cluster was mixed"
            assert waits[-1] <= MAX_WAIT_S, (
                f"a job waited {waits[-1]:.1f}s for the worker (p50 {waits[len(waits) // 2]:.2f}s)"
                f"\n{cluster.logs()}"
            )
            # node 1's front door (this tree's, first) served shards led by the earlier build
            singles = cluster.log_events(0, ("mux.shard_single",))
            assert singles, cluster.logs()
            ticks = [r for r in ran if r[0].startswith(tick.id)]
            assert len(ticks) >= 5, ticks
        print(
            f"\nearlier build {SHARDS_RELEASE[:7]} (virtualenv {build_s:.1f}s); "
            f"{len(acked)} jobs; upgrade {upgraded_s:.1f}s, each node back in "
            + ", ".join(f"{s:.1f}s" for s in rejoin)
            + f"; mixed {(mixed_ms[1] - mixed_ms[0]) / 1000:.1f}s (node 1 served a shard per worker "
            f"{len(singles)} times), waits for a worker then: p50 {waits[len(waits) // 2]:.2f}s "
            f"p99 {p99(waits):.2f}s max {waits[-1]:.2f}s; submits max {slowest:.2f}s"
        )
    finally:
        if load_task is not None:
            load_task.cancel()
        cluster.stop()
