"""Per-namespace quotas: submission rate limits (429 + Retry-After) and concurrency caps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from schedd.protocol import messages
from tests.conftest import Node, start_node
from tests.integration.test_api import API, post
from tests.integration.test_worker_protocol import connect


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[Node]:
    n = await start_node(
        tmp_path / "n1",
        limits={"submit_rate": {"slow": 1.0}, "submit_burst": 3, "concurrency": {"capped": 1}},
    )
    try:
        yield n
    finally:
        await n.rt.stop()


async def test_submission_rate_limit_is_a_429_with_retry_after(
    limited: Node, http: aiohttp.ClientSession
) -> None:
    for _ in range(3):  # the burst
        status, _ = await post(
            http, limited, "/jobs", {"task": "t", "namespace": "slow", "schedule": {"in": "1h"}}
        )
        assert status == 201
    async with http.post(
        limited.url + API + "/jobs",
        headers=limited.headers(),
        json={"task": "t", "namespace": "slow"},
    ) as r:
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert (await r.json())["error"]["code"] == "resource_exhausted"
    status, _ = await post(http, limited, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
    assert status == 201  # other namespaces are not limited
    status, err = await post(
        http, limited, "/jobs/batch", {"jobs": [{"task": "t", "namespace": "slow"}] * 5}
    )
    assert status == 400 and "burst" in err["error"]["message"]  # retrying would never help


async def test_a_namespace_concurrency_cap_holds_back_leases(
    limited: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, limited, "w1", capacity=5)
    for _ in range(3):
        await post(http, limited, "/jobs", {"task": "t", "namespace": "capped"})
    free = await post(http, limited, "/jobs", {"task": "t", "namespace": "free"})
    leases = [await w.expect(messages.Lease), await w.expect(messages.Lease)]
    assert sorted(lease.job_id == free[1]["id"] for lease in leases) == [False, True]
    with pytest.raises(asyncio.TimeoutError):
        await w.expect(messages.Lease, timeout=0.5)  # the capped namespace has one lease out
    capped = next(lease for lease in leases if lease.job_id != free[1]["id"])
    await w.send(messages.Complete(run_id=capped.run_id, fence=capped.fence))
    nxt = await w.expect(messages.Lease)
    assert nxt.run_id != capped.run_id
    await w.ws.close()


async def test_the_caps_endpoint_between_nodes_takes_only_signed_well_formed_requests(
    limited: Node, http: aiohttp.ClientSession
) -> None:
    """``POST /internal/caps`` carries no token: a request not signed with the Raft secret (none
    here: the node's own machine only) is 403, a malformed one a 400 naming the field, and a
    signed one is answered by the leader, changing nothing that was not asked."""
    from schedd import clock
    from schedd.protocol.signed import CAPS_PATH, caps_proof

    def signed(body: dict[str, object], secret: bytes | None = None) -> dict[str, object]:
        body = {**body, "at": clock.wall_ms()}
        return {**body, "proof": caps_proof(secret, body)}

    async def ask(body: object) -> tuple[int, dict[str, object]]:
        async with http.post(limited.url + CAPS_PATH, json=body) as r:
            return r.status, await r.json()

    status, err = await ask({"op": "steal"})
    assert status == 400 and err["error"]["field"] == "op"
    status, err = await ask(signed({"op": "view"}, secret=b"k" * 32))
    assert status == 403, err  # signed with a secret this node does not have
    status, err = await ask({**signed({"op": "view"}), "at": 1})
    assert status == 400 and err["error"]["field"] == "at"  # an old request (or a replay)
    status, err = await ask(signed({"op": "give", "namespace": "capped", "amount": 0, "dest": 1}))
    assert status == 400 and err["error"]["field"] == "amount"
    status, err = await ask(signed({"op": "limit", "limits": {"capped": -1}, "hold_s": 1}))
    assert status == 400 and err["error"]["field"] == "limits"
    status, view = await ask(signed({"op": "view"}))
    assert status == 200, view
    assert view["namespaces"] == {"capped": {"allowance": 1, "in_use": 0, "waiting": 0}}
    assert view["outbox"] == []
    # one shard: there is no other to give to, and nothing moves
    status, given = await ask(signed({"op": "give", "namespace": "capped", "amount": 1, "dest": 1}))
    assert (status, given) == (200, {"seq": 0, "amount": 0})
