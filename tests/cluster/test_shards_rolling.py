"""A rolling restart of a cluster of three shards under load, the way an upgrade is made: each
node in turn is stopped with SIGTERM (it hands every shard it leads to another node before it
stops, and exits 0), started again on the same data directory, and the next one only once the
node has applied what every shard's leader had committed.

Meanwhile a client submits one-off jobs at a steady rate through every node and a worker runs
them and a job recurring every second.  At the end every acknowledged job is on every node
once and succeeded, no submit waited longer than MAX_SUBMIT_S, each stopped node said it had
handed over each shard it led, and the recurring job fired on after the last restart, each
fire executed once per fence."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.client import AsyncClient
from tests.acceptance.test_rolling_upgrade import (
    MAX_SUBMIT_S,
    SCHEDULER,
    executions,
    node_jobs,
    start_load,
    until,
)
from tests.cluster.harness import Cluster
from tests.cluster.test_shards import one_each

# a restart of every node under load: the fault-injection tier (scripts/test --long)
pytestmark = [pytest.mark.cluster, pytest.mark.long, pytest.mark.timeout(300)]

SHARDS = 3
SETTLE_S = 3.0


async def view(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> dict[str, Any] | None:
    v = await cluster.view(http, i)
    return v if v and len(v.get("shards") or []) == SHARDS else None


async def caught_up(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> None:
    """Node i serves every shard, each led by a node, and has applied in each what that
    shard's leader had committed once node i answered."""
    node_id = cluster.nodes[i].node_id
    ids = [n.node_id for n in cluster.nodes]

    async def led() -> dict[str, Any] | None:
        assert cluster.nodes[i].alive, f"{node_id} exited\n{cluster.logs()}"
        v = await view(http, cluster, i)
        # (a leader named by its Raft address: its node's hello is not heard yet)
        return v if v and all(s["leader"] in ids for s in v["shards"]) else None

    mine = await until(f"{node_id} serves every shard, each led", led, 30, cluster)
    targets = []
    for k, shard in enumerate(mine["shards"]):
        theirs = await view(http, cluster, ids.index(shard["leader"]))
        targets.append(0 if theirs is None else theirs["shards"][k]["commit_index"])

    async def applied() -> bool:
        v = await led()
        return bool(v) and all(
            s["applied_index"] >= t for s, t in zip(v["shards"], targets, strict=True)
        )

    await until(f"{node_id} applies every shard's leader's index", applied, 30, cluster)


@contextlib.asynccontextmanager
async def serving(cluster: Cluster) -> AsyncIterator[tuple[aiohttp.ClientSession, AsyncClient]]:
    """An HTTP session and a client of every node of the started cluster, once each node
    serves every shard caught up."""
    async with (
        aiohttp.ClientSession() as http,
        AsyncClient(
            cluster.urls, token=cluster.token, retry_budget=30, timeout=5, batching=False
        ) as client,
    ):
        for i in range(cluster.size):
            await caught_up(http, cluster, i)
        yield http, client


async def test_a_rolling_restart_of_three_shards_under_load_loses_nothing(
    tmp_path: Path, timed_record: Path
) -> None:
    cluster = Cluster(tmp_path / "cluster", scheduler=SCHEDULER, shards=SHARDS)
    load_task: asyncio.Task[None] | None = None
    try:
        cluster.start()
        async with serving(cluster) as (http, client):
            tick, load, load_task = await start_load(cluster, client)
            await asyncio.sleep(SETTLE_S)

            handed: dict[str, list[int]] = {}
            for i in range(3):
                node_id = cluster.nodes[i].node_id
                leaders = await until(
                    "each node leads a shard", lambda: one_each(http, cluster), 60, cluster
                )
                leads = [k for k, who in enumerate(leaders) if who == node_id]
                since = cluster.log_size(i)
                proc = cluster.nodes[i].proc
                assert proc is not None
                cluster.kill(i, signal.SIGTERM)
                await until(f"{node_id} stops", lambda p=proc: p.poll() is not None, 30, cluster)
                assert proc.returncode == 0, cluster.logs()
                said = cluster.log_events(i, ("leader.handed_over",), since)
                handed[node_id] = sorted(
                    int(line.split("shard=")[1].split()[0]) for line in said if "shard=" in line
                )
                assert handed[node_id] == leads, (node_id, leads, said)
                cluster.start(i)
                await caught_up(http, cluster, i)
                await asyncio.sleep(SETTLE_S)
            last_restart = len(executions(timed_record))
            await asyncio.sleep(SETTLE_S)
            load.stop.set()
            await load_task
            load_task = None

            assert sum(len(v) for v in handed.values()) == SHARDS  # each stopped as a leader
            assert not load.failed, load.failed
            slowest = max(s for _, s in load.timings)
            assert slowest <= MAX_SUBMIT_S, slowest
            acked = set(load.acked.values())
            assert len(acked) == len(load.acked) >= 60  # one job per submit

            async def all_done() -> bool:
                for i in range(3):
                    jobs = await node_jobs(cluster, i)
                    ids = collections.Counter(j.id for j in jobs)
                    if any(n > 1 for n in ids.values()) or not acked <= set(ids):
                        return False
                    states = {
                        j.id: j.latest_run.state if j.latest_run else None
                        for j in jobs
                        if j.id in acked
                    }
                    if any(s != "succeeded" for s in states.values()):
                        return False
                return True

            await until(
                "every acknowledged job succeeded, on every node, once", all_done, 60, cluster
            )
            runs = executions(timed_record)
            assert len(runs) > last_restart  # the recurring job (and the rest) ran on
            fences = collections.Counter((run_id, fence) for run_id, fence, _ in runs)
            assert all(n == 1 for n in fences.values()), fences.most_common(3)
            ticks = [r for r in runs if r[0].startswith(tick.id)]
            assert len(ticks) >= 5, ticks
    finally:
        if load_task is not None:
            load_task.cancel()
        cluster.stop()
