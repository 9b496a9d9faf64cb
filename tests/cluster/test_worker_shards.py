"""Workers of a cluster of three shards over three nodes: a worker connects to one node and is
served runs from every shard (that node's front door holds a connection to each shard's
leader for it), never holds more than its capacity across the shards, is listed once by
every node, and keeps being served by a shard whose leader's node was killed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.ids import shard_of_id
from schedd.worker.client import Worker
from schedd.worker.registry import Registry
from tests.cluster.harness import Cluster
from tests.cluster.test_shards import SHARDS, call, one_each, submit
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

CAPACITY = 2


class Gauge:
    """How many runs the worker's handler runs at once, and the most it ever ran."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.ran: list[str] = []

    async def handler(self, ctx: Any, payload: Any) -> dict[str, Any]:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.15)
        finally:
            self.now -= 1
        self.ran.append(ctx.run_id)
        return {"k": payload["k"]}


@contextlib.asynccontextmanager
async def worker(
    url: str, token: str, gauge: Gauge, capacity: int = CAPACITY
) -> AsyncIterator[Worker]:
    registry = Registry()
    registry.register("t.hold", gauge.handler)
    w = Worker([url], token=token, worker_id="w-shards", registry=registry, concurrency=capacity)
    stop = asyncio.Event()
    task = asyncio.create_task(w.serve(stop))
    try:
        yield w
    finally:
        stop.set()
        await asyncio.wait_for(task, 40)


async def succeeded(
    http: aiohttp.ClientSession, cluster: Cluster, url: str, ids: list[str]
) -> list[dict[str, Any]] | None:
    """Each job's latest run, once every one of them succeeded."""
    runs = []
    for job_id in ids:
        status, job = await call(http, cluster, "GET", f"{url}/api/v1/jobs/{job_id}")
        run = (job or {}).get("latest_run") if status == 200 else None
        if not run or run["state"] != "succeeded":
            return None
        runs.append(run)
    return runs


async def test_a_worker_is_served_from_every_shard_within_its_capacity(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", shards=SHARDS)
    cluster.start()
    gauge = Gauge()
    try:
        async with aiohttp.ClientSession() as http:
            leaders = await wait_for(
                lambda: one_each(http, cluster), 60, interval=0.2
            )  # one shard led by each node
            home = 0  # the worker's node: it leads one shard, the others lead the rest
            async with worker(cluster.urls[home], cluster.token, gauge):
                jobs = [
                    await submit(
                        http,
                        cluster,
                        k % 3,
                        {"task": "t.hold", "payload": {"k": k}},
                        f"worker-shards-{k}",
                    )
                    for k in range(24)
                ]
                ids = [j["id"] for j in jobs]
                assert {shard_of_id(i, SHARDS) for i in ids} == {0, 1, 2}
                runs = await wait_for(
                    lambda: succeeded(http, cluster, cluster.urls[1], ids), 90, interval=0.3
                )  # every run of every shard done by the one worker
                # each ran once, on its first attempt: no lease over the capacity was refused
                assert all(len(r["attempts"]) == 1 for r in runs), runs
                assert len(gauge.ran) == len(ids), gauge.ran
                # the capacity holds across the shards, and is used
                assert gauge.most == CAPACITY, gauge.most

                # every node lists the worker once, with its whole capacity
                for url in cluster.urls:
                    status, body = await call(http, cluster, "GET", f"{url}/api/v1/workers")
                    assert status == 200, body
                    mine = [w for w in body["workers"] if w["worker_id"] == "w-shards"]
                    assert len(mine) == 1, body
                    assert mine[0]["capacity"] == CAPACITY, mine
                    assert mine[0]["node"] == f"n{home + 1}", mine

                # the node leading a shard (not the worker's) dies: that shard's runs go on
                victim = next(i for i in range(3) if i != home and f"n{i + 1}" in leaders)
                lost = leaders.index(f"n{victim + 1}")
                cluster.kill(victim)
                witness = next(i for i in range(3) if i not in (home, victim))
                more = []
                for k in range(100, 160):
                    if len(more) == 6:
                        break
                    job = await submit(
                        http,
                        cluster,
                        witness,
                        {"task": "t.hold", "payload": {"k": k}},
                        f"after-failover-{k}",
                    )
                    if shard_of_id(job["id"], SHARDS) == lost:
                        more.append(job["id"])
                assert len(more) == 6, more
                await wait_for(
                    lambda: succeeded(http, cluster, cluster.urls[witness], more), 90, interval=0.3
                )  # the runs of the shard whose leader died, served after the failover
                assert gauge.most == CAPACITY
    finally:
        cluster.stop()
        print(cluster.logs())
