"""A node that loses leadership and wins it again between two looks of the runtime's role
watcher (leader -> follower -> leader) must start a new leader with a claim for the new term,
not keep the old one running with a claim that belongs to an earlier term (found by the bench
under load: the cluster view kept naming the old claim)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import restart_leader_in_new_term, start_node, wait_for
from tests.integration.test_worker_protocol import API


async def test_a_term_change_while_leading_restarts_the_leader_with_a_new_claim(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = await start_node(tmp_path / "n1")
    try:
        rt: Any = n.rt
        old_term, old_fence = rt.node.term, rt.leader.fence
        await restart_leader_in_new_term(rt, monkeypatch)
        assert rt.leader.fence > old_fence  # a new claim was committed
        async with http.get(n.url + API + "/cluster", headers=n.headers()) as r:
            body = await r.json()
        assert r.status == 200, body
        assert rt._leader_term == old_term + 5
        # the leader history names both claims, in order, with their fences
        claims = [(c["term"], c["node"], c["index"]) for c in body["leaders"]]
        assert claims[-2:] == [(old_term, "n1", old_fence), (old_term + 5, "n1", rt.leader.fence)]
        assert body["leaders"][-1]["at"] >= body["leaders"][-2]["at"]
        # and it schedules: a job submitted now is fired and queued by the new leader
        async with http.post(n.url + API + "/jobs", json={"task": "t"}, headers=n.headers()) as r:
            job = await r.json()

        async def queued() -> bool:
            async with http.get(n.url + API + f"/jobs/{job['id']}/runs", headers=n.headers()) as r:
                runs = (await r.json())["runs"]
            return bool(runs) and runs[0]["state"] == "queued"

        await wait_for(queued, timeout=10)
    finally:
        await n.rt.stop()
