"""``GET /api/v1/cluster`` on three real nodes: every node's version, lag and last contact as
the leader sees them (and a follower, for itself and its leader), and a follower that dies
shows its last contact growing; a follower passes ``GET /scheduling-lag`` to the leader."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import schedd
from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


async def eventually(
    look: Callable[[], Awaitable[dict[str, Any] | None]],
    ok: Callable[[dict[str, Any]], bool],
    timeout: float = 20.0,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view = None
    while time.monotonic() < deadline:
        view = await look()
        if view is not None and ok(view):
            return view
        await asyncio.sleep(0.05)  # the next look (the view has no event to wait for)
    raise AssertionError(f"not within {timeout}s: {view}")


def by_id(view: dict[str, Any], cluster: Cluster) -> dict[str, dict[str, Any]]:
    ids = {n.raft_port: n.node_id for n in cluster.nodes}
    return {ids[int(n["raft"].rsplit(":", 1)[1])]: n for n in view["nodes"]}


async def test_every_nodes_version_lag_and_last_contact(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c")
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:

            async def settled() -> dict[str, Any] | None:
                """The leader's view once it knows every node (the leader may change while
                the cluster starts on a busy machine: look again), every node voting (so
                that the follower killed below leaves a majority)."""
                i = await cluster.wait_serving(http)
                view = await cluster.view(http, i)
                complete = (
                    view is not None
                    and view["role"] == "leader"
                    and all(
                        n["version"] is not None and n["last_contact"] is not None
                        for n in view["nodes"]
                    )
                )
                return view if complete else None

            leader = await eventually(settled, bool)
            a = next(i for i, n in enumerate(cluster.nodes) if n.node_id == leader["node_id"])
            b, c = (i for i in range(3) if i != a)
            seen = by_id(leader, cluster)
            assert {n["version"] for n in seen.values()} == {schedd.__version__}
            for i in (b, c):
                peer = seen[cluster.nodes[i].node_id]
                assert peer["lag"] is not None and peer["lag"] >= 0
                assert 0 <= peer["last_contact"] < 2  # heartbeats every 20 ms
            me = seen[cluster.nodes[a].node_id]
            assert (me["lag"], me["last_contact"], me["self"]) == (0, 0.0, True)

            follower = by_id(
                await eventually(
                    lambda: cluster.view(http, b),
                    lambda v: (
                        v["leader"] == cluster.nodes[a].node_id
                        and v["nodes"][0]["last_contact"] is not None
                    ),
                ),
                cluster,
            )
            mine, its_leader = (
                follower[cluster.nodes[b].node_id],
                follower[cluster.nodes[a].node_id],
            )
            assert 0 <= mine["last_contact"] < 2 and mine["lag"] >= 0
            assert its_leader["lag"] == 0 and its_leader["last_contact"] == mine["last_contact"]
            assert follower[cluster.nodes[c].node_id]["lag"] is None  # only the leader knows

            # the scheduling lag is the leader's: a follower asks it
            async with http.get(
                cluster.nodes[b].url + "/api/v1/scheduling-lag", headers=cluster.headers()
            ) as r:
                assert r.status == 200 and (await r.json())["leader"] == cluster.nodes[a].node_id

            cluster.kill(c)
            gone = cluster.nodes[c].node_id
            later = await eventually(
                lambda: cluster.view(http, a),
                lambda v: (by_id(v, cluster)[gone]["last_contact"] or 0) > 1.0,
            )
            assert not by_id(later, cluster)[gone]["healthy"]
    finally:
        cluster.stop()
