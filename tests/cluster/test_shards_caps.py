"""A namespace's concurrency cap holds for a cluster of three shards as a whole: a worker that
could run six at once never runs more than the cap of the namespace's runs, whichever shards
they are in, and runs of a shard whose share of the cap is nothing still run (slots move to
it); after the node whose front door moves the slots is killed, another node's does."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from schedd.ids import shard_of_id
from tests.cluster.harness import Cluster
from tests.cluster.test_shards import SHARDS, one_each, submit
from tests.cluster.test_worker_shards import Gauge, succeeded, worker
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

CAP = 2  # shares: 1, 1 and 0 (shard 2's runs run only on slots moved to it)


def moved(cluster: Cluster) -> int:
    """How many moves of slots the nodes logged."""
    return sum(
        n.log.read_text(errors="replace").count("caps.moved")
        for n in cluster.nodes
        if n.log.exists()
    )


async def test_a_concurrency_cap_holds_across_shards_and_moves_to_where_runs_wait(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c", shards=SHARDS, limits={"concurrency": {"default": CAP}})
    cluster.start()
    gauge = Gauge()
    try:
        async with aiohttp.ClientSession() as http:
            leaders = await wait_for(lambda: one_each(http, cluster), 60, interval=0.2)
            coordinator = int(leaders[0][1:]) - 1  # the node leading shard 0 moves the slots
            home = (coordinator + 1) % 3  # the worker's node
            async with worker(cluster.urls[home], cluster.token, gauge, capacity=6):
                ids = [
                    (
                        await submit(
                            http,
                            cluster,
                            k % 3,
                            {"task": "t.hold", "payload": {"k": k}},
                            f"caps-shards-{k}",
                        )
                    )["id"]
                    for k in range(18)
                ]
                assert {shard_of_id(i, SHARDS) for i in ids} == {0, 1, 2}
                await wait_for(
                    lambda: succeeded(http, cluster, cluster.urls[home], ids), 120, interval=0.3
                )
                assert gauge.most == CAP, gauge.most  # never more than the cap, and used
                assert moved(cluster) >= 1

                # the coordinator's node dies; shard 0 is led elsewhere, whose node moves them
                cluster.kill(coordinator)
                witness = next(i for i in range(3) if i not in (coordinator, home))
                more = [
                    (
                        await submit(
                            http,
                            cluster,
                            witness,
                            {"task": "t.hold", "payload": {"k": k}},
                            f"caps-after-{k}",
                        )
                    )["id"]
                    for k in range(100, 112)
                ]
                before = moved(cluster)
                gauge.most = 0
                await wait_for(
                    lambda: succeeded(http, cluster, cluster.urls[witness], more), 120, interval=0.3
                )
                assert gauge.most <= CAP, gauge.most
                assert moved(cluster) > before
    finally:
        cluster.stop()
