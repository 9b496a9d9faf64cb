"""A dead node is removed by its id after the others restarted (docs/operations.md, "Replace a
dead node"): the leader then never heard from it since its own start.

The membership the log records carries every member's id (the leader fills in what the
members' hellos said), so a restarted node still knows each member by its id; and removing a
node does not need that node's hello (only the remaining voters must take part in changes).
The removed node, started again with its data, is refused and stops with status 2."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.members import NODES, call, exit_status, members
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


async def recorded(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> dict[str, Any]:
    """Node ``i``'s membership view once it comes from the log."""
    seen: list[dict[str, Any] | None] = [None]

    async def done() -> dict[str, Any] | None:
        seen[0] = view = await members(http, cluster, i)
        return view if view and view["source"] == "log" else None

    try:
        view: dict[str, Any] = await wait_for(done, timeout=30, interval=0.1)
    except AssertionError:
        raise AssertionError(f"n{i + 1} last said {seen[0]}\n{cluster.logs()}") from None
    return view


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
async def test_a_dead_node_is_removed_by_its_id_after_the_others_restarted(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c")
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await recorded(http, cluster, await cluster.wait_serving(http))
            for i in range(3):  # every node restarted: what it knows of the others is the log's
                cluster.kill(i)
            cluster.start()
            leader = await cluster.wait_serving(http)
            view = await recorded(http, cluster, leader)
            assert {n["id"] for n in view["nodes"]} == {"n1", "n2", "n3"}, view
            # n3 dies for good; the two others restart, so neither has heard from n3 since
            cluster.kill(2)
            for i in (0, 1):
                cluster.kill(i, signal.SIGTERM)
                exit_status(cluster, i)
                cluster.start(i)
            leader = await cluster.wait_serving(http)
            status, body = await call(http, cluster, leader, "DELETE", f"{NODES}/n3")
            assert status == 200, body
            assert {n["id"] for n in body["nodes"]} == {"n1", "n2"}, body
            # n3 back with its data: told it was removed, it stops
            cluster.start(2)
            assert exit_status(cluster, 2) == 2, cluster.logs()
            assert "was removed from its cluster" in cluster.nodes[2].log.read_text()
    finally:
        cluster.stop()
