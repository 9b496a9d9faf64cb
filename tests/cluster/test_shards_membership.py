"""Membership of a cluster of three shards, one command or one setting for all of them: a
fourth node joins by itself (``raft.join``) and becomes a voter of every shard's group, each
at its own Raft port; the operator removes a node with one ``schedctl node remove`` (every
shard's group drops it, and the node stops once it is out of all of them); the jobs of every
shard are on the new node and the cluster serves on."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.shard.layout import shard_address
from tests.cluster.harness import Cluster
from tests.cluster.members import NODES, exit_status, new_node, raft_addr, run, schedctl
from tests.cluster.test_shards import SHARDS, call, shard_leaders, submit
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


async def shard_voters(
    http: aiohttp.ClientSession, cluster: Cluster, i: int
) -> list[set[str]] | None:
    """The voters of each shard's group, as node i's process of that shard knows them."""
    out = []
    for k in range(SHARDS):
        status, view = await call(
            http,
            cluster,
            "GET",
            f"{cluster.urls[i]}{NODES}",
            headers={"X-Schedd-Shard": str(k)},
        )
        if status != 200:
            return None
        out.append({n["raft"] for n in view["nodes"] if n["role"] == "voter"})
    return out


def in_every_shard(cluster: Cluster, nodes: list[int]) -> list[set[str]]:
    return [{shard_address(raft_addr(cluster, i), k) for i in nodes} for k in range(SHARDS)]


async def recorded(http: aiohttp.ClientSession, cluster: Cluster) -> None:
    """Until each shard's group recorded its membership: the three nodes, in every shard."""

    async def done() -> bool:
        return await shard_voters(http, cluster, 0) == in_every_shard(cluster, [0, 1, 2])

    await wait_for(done, 60, interval=0.3)  # the three nodes, in every shard


@pytest.mark.long  # membership changes of every group: the fault-injection tier
async def test_a_node_joins_every_shard_and_one_command_removes_one_from_all(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c", shards=SHARDS)
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:

            async def led() -> list[Any] | None:
                leaders = await shard_leaders(http, cluster, 0)
                return leaders if all(leaders) else None

            await wait_for(led, 60, interval=0.2)  # every shard has a leader
            jobs = [
                await submit(
                    http, cluster, k % 3, {"task": "t.x", "schedule": {"in": "1h"}}, f"members-{k}"
                )
                for k in range(9)
            ]

            await recorded(http, cluster)

            # n4 joins by itself, through a node's API: it becomes a voter of every shard
            n4 = new_node(cluster, "n4", {"join": [cluster.nodes[1].url]}, shards=SHARDS)
            cluster.start(n4)

            async def joined() -> bool:
                return await shard_voters(http, cluster, 2) == in_every_shard(
                    cluster, [0, 1, 2, n4]
                )

            await wait_for(joined, 120, interval=0.5)  # n4 a voter of every shard
            for job in jobs:  # every shard's jobs, on n4

                async def there(job_id: str = job["id"]) -> bool:
                    status, _ = await call(
                        http, cluster, "GET", f"{cluster.urls[n4]}/api/v1/jobs/{job_id}"
                    )
                    return status == 200

                await wait_for(there, 60, interval=0.3)  # a job read on n4

            # a removal stopped half-way: n1 out of shard 0 alone (where its name is then
            # forgotten) ...
            status, body = await call(
                http,
                cluster,
                "DELETE",
                f"{cluster.urls[2]}/api/v1/cluster/nodes/n1",
                headers={"X-Schedd-Shard": "0"},
            )
            assert status == 200, body
            # ... and one command by its name removes n1 from every shard (the rest of them);
            # n1 stops once out of all of them
            code, out = await schedctl(cluster, 2, "node", "remove", "n1")
            assert code == 0, out
            assert exit_status(cluster, 0, timeout=60) == 2
            log = cluster.nodes[0].log.read_text()
            assert log.count("shard.removed") == SHARDS, log[-3000:]
            assert await shard_voters(http, cluster, 2) == in_every_shard(cluster, [1, 2, n4])

            # the cluster serves on: a new job through n4, read through n3
            late = await submit(
                http, cluster, n4, {"task": "t.x", "schedule": {"in": "1h"}}, "members-after"
            )

            async def served() -> bool:
                status, _ = await call(
                    http, cluster, "GET", f"{cluster.urls[2]}/api/v1/jobs/{late['id']}"
                )
                return status == 200

            await wait_for(served, 60, interval=0.3)  # the new job read on n3
    finally:
        cluster.stop()
        print(cluster.logs())


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
async def test_a_lost_majority_is_recovered_in_every_shard_from_one_survivor(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c", shards=SHARDS)
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            await recorded(http, cluster)
            jobs = [
                await submit(
                    http,
                    cluster,
                    k % 3,
                    {"task": "t.x", "schedule": {"in": "1h"}},
                    f"lost-majority-{k}",
                )
                for k in range(9)
            ]
            survivor = 0
            config = str(cluster.nodes[survivor].config)
            env = cluster.env
            cluster.kill(survivor, signal.SIGTERM)
            assert exit_status(cluster, survivor) == 0
            code, out = await run(
                "schedd", "recover", "--force-new-cluster", "--config", config, env=env
            )
            assert code == 1 and "still answer" in out, out  # the others answer: nothing done
            for i in (1, 2):
                cluster.kill(i)
            code, out = await run(
                "schedd", "recover", "--force-new-cluster", "--config", config, env=env
            )
            assert code == 0 and "NEW ONE-NODE CLUSTER" in out, out
            assert all(f"shard {k}: applied index" in out for k in range(SHARDS)), out
            cluster.start(survivor)

            async def alone() -> bool:  # it leads every shard by itself
                leaders = await shard_leaders(http, cluster, survivor)
                return leaders == ["n1"] * SHARDS

            await wait_for(alone, 60, interval=0.3)  # n1 leads every shard alone
            for job in jobs:
                status, _ = await call(
                    http, cluster, "GET", f"{cluster.urls[survivor]}/api/v1/jobs/{job['id']}"
                )
                assert status == 200, job
            late = await submit(http, cluster, survivor, {"task": "t.x"}, "after-the-recovery-1")
            assert late["id"]
    finally:
        cluster.stop()
        print(cluster.logs())
