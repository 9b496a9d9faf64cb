"""The HTTP API against a real one-node cluster (real Raft, real aiohttp server)."""

from __future__ import annotations

import dataclasses
import io

import aiohttp
import orjson
import pytest

from tests.conftest import Node, wait_for

API = "/api/v1"


async def post(
    http: aiohttp.ClientSession, node: Node, path: str, body: object, token: str | None = None
) -> tuple[int, dict]:
    async with http.post(node.url + API + path, json=body, headers=node.headers(token)) as r:
        return r.status, await r.json()


async def get(http: aiohttp.ClientSession, node: Node, path: str) -> tuple[int, dict]:
    async with http.get(node.url + API + path, headers=node.headers()) as r:
        return r.status, await r.json()


async def test_submit_is_committed_before_201_and_readable(
    node: Node, http: aiohttp.ClientSession
) -> None:
    applied_before = node.rt.node.applied_index
    status, job = await post(http, node, "/jobs", {"task": "demo.echo", "payload": {"x": 1}})
    assert status == 201
    assert node.rt.node.applied_index > applied_before
    with node.rt.node.read() as st:
        assert job["id"] in st.jobs  # applied locally before the reply
    status, again = await get(http, node, f"/jobs/{job['id']}")
    assert (
        status == 200
        and again["payload"] == {"x": 1}
        and again["latest_run"]["job_id"] == job["id"]
    )


async def test_idempotency_key_returns_200_with_the_same_job(
    node: Node, http: aiohttp.ClientSession
) -> None:
    body = {"task": "t", "idempotency_key": "invoice-1"}
    s1, j1 = await post(http, node, "/jobs", body)
    s2, j2 = await post(http, node, "/jobs", body)
    assert (s1, s2) == (201, 200) and j1["id"] == j2["id"]
    s3, err = await post(http, node, "/jobs", {**body, "payload": {"amount": 2}})
    assert s3 == 409 and err["error"]["field"] == "idempotency_key"
    assert "'invoice-1'" in err["error"]["message"] and j1["id"] in err["error"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "task"),
        ({"task": ""}, "task"),
        ({"task": "t", "priority": "urgent"}, "priority"),
        ({"task": "t", "schedule": {"in": "soon"}}, "schedule.in"),
        ({"task": "t", "retry": {"max_attempts": 0}}, "retry.max_attempts"),
        ({"task": "t", "colour": "red"}, "colour"),
    ],
)
async def test_bad_bodies_get_400_naming_the_field(
    node: Node, http: aiohttp.ClientSession, body: dict, field: str
) -> None:
    status, err = await post(http, node, "/jobs", body)
    assert status == 400
    assert err["error"]["code"] == "invalid_argument" and err["error"]["field"] == field


async def test_not_json_is_a_400(node: Node, http: aiohttp.ClientSession) -> None:
    async with http.post(node.url + API + "/jobs", data=b"{nope", headers=node.headers()) as r:
        assert r.status == 400
        assert "JSON" in (await r.json())["error"]["message"]


async def test_payload_over_the_limit_is_413(node: Node, http: aiohttp.ClientSession) -> None:
    status, err = await post(http, node, "/jobs", {"task": "t", "payload": "x" * 70_000})
    assert status == 413 and err["error"]["code"] == "payload_too_large"
    # a body over http.max_body names both limits, each by its key, in bytes
    big = io.BytesIO(orjson.dumps({"task": "t", "payload": "x" * 2_000_000}))
    async with http.post(node.url + API + "/jobs", data=big, headers=node.headers()) as r:
        status, err = r.status, await r.json()
    assert status == 413
    assert err["error"]["message"] == (
        "request body over http.max_body (1,048,576 bytes); a job's payload may be at most "
        "scheduler.max_payload (65,536 bytes)"
    )


async def test_auth_is_required_and_roles_apply(node: Node, http: aiohttp.ClientSession) -> None:
    async with http.get(node.url + API + "/jobs") as r:
        assert r.status == 401
    async with http.get(
        node.url + API + "/jobs", headers={"Authorization": "Bearer wrong-token-123456"}
    ) as r:
        assert r.status == 401 and (await r.json())["error"]["code"] == "unauthenticated"
    async with http.get(node.url + "/healthz") as r:
        assert r.status == 200


async def test_unknown_job_and_route_are_404(node: Node, http: aiohttp.ClientSession) -> None:
    status, err = await get(http, node, "/jobs/nope")
    assert status == 404 and err["error"]["code"] == "not_found"
    status, _ = await get(http, node, "/nothing-here")
    assert status == 404
    async with http.delete(node.url + API + "/jobs/nope", headers=node.headers()) as r:
        assert r.status == 404


async def test_list_pages_with_a_cursor_and_filters(
    node: Node, http: aiohttp.ClientSession
) -> None:
    ids = []
    for i in range(5):
        _, job = await post(
            http, node, "/jobs", {"task": "a" if i % 2 else "b", "schedule": {"in": "1h"}}
        )
        ids.append(job["id"])
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        q = "/jobs?limit=2" + (f"&cursor={cursor}" if cursor else "")
        _, page = await get(http, node, q)
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]  # newest first
    _, only_a = await get(http, node, "/jobs?task=a")
    assert [j["id"] for j in only_a["jobs"]] == ids[1::2][::-1]
    status, err = await get(http, node, "/jobs?limit=0")
    assert status == 400 and err["error"]["field"] == "limit"


async def test_cancel_then_runs_show_cancelled(node: Node, http: aiohttp.ClientSession) -> None:
    _, job = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
    async with http.delete(node.url + API + f"/jobs/{job['id']}", headers=node.headers()) as r:
        assert r.status == 204
    _, runs = await get(http, node, f"/jobs/{job['id']}/runs")
    assert [r["state"] for r in runs["runs"]] == ["cancelled"]
    _, got = await get(http, node, f"/jobs/{job['id']}")
    assert got["status"] == "cancelled"


async def test_batch_is_all_or_nothing(node: Node, http: aiohttp.ClientSession) -> None:
    status, out = await post(http, node, "/jobs/batch", {"jobs": [{"task": "a"}, {"task": "b"}]})
    assert status == 201 and [j["task"] for j in out["jobs"]] == ["a", "b"]
    status, err = await post(http, node, "/jobs/batch", {"jobs": [{"task": "a"}, {"task": ""}]})
    assert status == 400 and err["error"]["field"].startswith("jobs[1]")
    _, listed = await get(http, node, "/jobs")
    assert len(listed["jobs"]) == 2


async def test_cluster_view_names_the_leader(node: Node, http: aiohttp.ClientSession) -> None:
    status, view = await get(http, node, "/cluster")
    assert status == 200 and view["role"] == "leader" and view["leader"] == "n1"
    assert view["applied_index"] >= 1 and view["leader_url"] == node.url
    async with http.get(node.url + "/readyz") as r:
        assert r.status == 200


async def test_a_leader_is_not_ready_until_its_scheduler_is(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Elected but not yet serving what only the leader serves (workers, dispatch): /readyz
    says so, so a load balancer does not send it the requests that would get 503."""
    leader = node.rt.leader
    assert leader is not None and leader.ready.is_set()
    leader.ready.clear()
    try:
        async with http.get(node.url + "/readyz") as r:
            assert r.status == 503
            assert "just elected" in (await r.json())["error"]["message"]
    finally:
        leader.ready.set()
    async with http.get(node.url + "/readyz") as r:
        assert r.status == 200


async def test_the_raft_status_is_published_whole_by_the_tick_thread(node: Node) -> None:
    raft = node.rt.node
    status = await wait_for(lambda: raft.raft_status if raft.raft_status.role == "leader" else None)
    assert status.leader == node.rt.config.raft.listen and status.term == raft.term >= 1
    assert status.has_quorum and status.peers == () and raft.leader_reachable()
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.role = "follower"  # type: ignore[misc]
    await wait_for(lambda: raft.raft_status is not status, timeout=5)  # republished, not changed
    assert status.role == "leader"


async def test_a_repeated_request_id_is_applied_once(
    node: Node, http: aiohttp.ClientSession
) -> None:
    headers = dict(node.headers(), **{"X-Request-Id": "retry-me-12345"})
    ids = []
    for _ in range(2):
        async with http.post(node.url + API + "/jobs", json={"task": "t"}, headers=headers) as r:
            assert r.status == 201
            ids.append((await r.json())["id"])
    assert ids[0] == ids[1]
    _, listed = await get(http, node, "/jobs")
    assert [j["id"] for j in listed["jobs"]] == ids[:1]
    async with http.post(
        node.url + API + "/jobs",
        json={"task": "t"},
        headers=dict(node.headers(), **{"X-Request-Id": "x"}),
    ) as r:
        assert r.status == 400 and (await r.json())["error"]["field"] == "X-Request-Id"
