"""PATCH, trigger, run cancel, explain and the DLQ over HTTP against a real one-node cluster."""

from __future__ import annotations

import aiohttp
import pytest

from tests.conftest import Node
from tests.integration.test_api import API, get, post


async def patch(
    http: aiohttp.ClientSession, node: Node, path: str, body: object
) -> tuple[int, dict]:
    async with http.patch(node.url + API + path, json=body, headers=node.headers()) as r:
        return r.status, await r.json()


async def test_pause_resume_and_update(node: Node, http: aiohttp.ClientSession) -> None:
    _, job = await post(
        http,
        node,
        "/jobs",
        {"task": "t", "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}},
    )
    status, paused = await patch(http, node, f"/jobs/{job['id']}", {"paused": True})
    assert status == 200 and paused["status"] == "paused"
    status, resumed = await patch(
        http, node, f"/jobs/{job['id']}", {"paused": False, "priority": "high"}
    )
    assert status == 200 and resumed["status"] == "active" and resumed["priority"] == "high"
    status, moved = await patch(http, node, f"/jobs/{job['id']}", {"schedule": {"every": "90s"}})
    assert status == 200 and moved["schedule"]["every"] == 90
    _, runs = await get(http, node, f"/jobs/{job['id']}/runs")
    assert {r["state"] for r in runs["runs"]} == {"cancelled", "scheduled"}
    assert [r["reason"] for r in runs["runs"] if r["state"] == "cancelled"] == ["rescheduled"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, None),
        ({"paused": "yes"}, "paused"),
        ({"colour": 1}, "colour"),
        ({"schedule": {"cron": "nope"}}, "schedule.cron"),
    ],
)
async def test_bad_patches_are_400(
    node: Node, http: aiohttp.ClientSession, body: object, field: str | None
) -> None:
    _, job = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
    status, err = await patch(http, node, f"/jobs/{job['id']}", body)
    assert status == 400 and err["error"].get("field") == field


async def test_trigger_and_cancel_a_run(node: Node, http: aiohttp.ClientSession) -> None:
    _, job = await post(http, node, "/jobs", {"task": "t", "schedule": {"every": "1h"}})
    status, run = await post(http, node, f"/jobs/{job['id']}/trigger", {"overlap": "override"})
    assert status == 201 and run["state"] == "queued" and run["job_id"] == job["id"]
    async with http.post(node.url + API + f"/runs/{run['id']}/cancel", headers=node.headers()) as r:
        assert r.status == 200 and (await r.json())["state"] == "cancelled"
    status, err = await post(http, node, f"/jobs/{job['id']}/trigger", {"overlap": "maybe"})
    assert status == 400 and err["error"]["field"] == "overlap"


async def test_explain_names_dst_changes(node: Node, http: aiohttp.ClientSession) -> None:
    status, out = await get(http, node, "/explain?cron=30+2+*+*+*&timezone=Europe/Berlin&count=400")
    assert status == 200 and len(out["fires"]) == 400
    notes = [f["note"] for f in out["fires"] if f["note"]]
    assert any("does not exist" in n for n in notes) and any("happens twice" in n for n in notes)
    _, job = await post(http, node, "/jobs", {"task": "t", "schedule": {"cron": "*/5 * * * *"}})
    status, out = await get(http, node, f"/jobs/{job['id']}/explain?count=3")
    assert status == 200 and len(out["fires"]) == 3
    status, _err = await get(http, node, "/explain?count=3")
    assert status == 400


async def test_dependency_cycle_and_unknown_dependency(
    node: Node, http: aiohttp.ClientSession
) -> None:
    status, err = await post(http, node, "/jobs", {"task": "t", "depends_on": ["nope"]})
    assert status == 404 and err["error"]["field"] == "depends_on[0]"
    _, a = await post(http, node, "/jobs", {"task": "a", "schedule": {"in": "1h"}})
    status, _b = await post(http, node, "/jobs", {"task": "b", "depends_on": [a["id"]]})
    assert status == 201
    status, err = await patch(http, node, f"/jobs/{a['id']}", {"payload": 1})
    assert status == 200
    async with http.delete(node.url + API + "/dlq/nope@1", headers=node.headers()) as r:
        assert r.status == 404


async def test_a_whole_graph_in_one_batch_with_refs(
    node: Node, http: aiohttp.ClientSession
) -> None:
    status, out = await post(
        http,
        node,
        "/jobs/batch",
        {
            "jobs": [
                {"ref": "extract", "task": "etl.extract"},
                {"ref": "load", "task": "etl.load", "depends_on": ["extract"]},
            ]
        },
    )
    assert status == 201
    extract, load = out["jobs"]
    assert load["depends_on"] == [extract["id"]]
    status, err = await post(
        http,
        node,
        "/jobs/batch",
        {
            "jobs": [
                {"ref": "a", "task": "t", "depends_on": ["b"]},
                {"ref": "b", "task": "t", "depends_on": ["a"]},
            ]
        },
    )
    assert status == 409 and "a -> b -> a" in err["error"]["message"]


async def test_explain_of_a_paused_job_says_so(node: Node, http: aiohttp.ClientSession) -> None:
    _, job = await post(http, node, "/jobs", {"task": "t", "schedule": {"cron": "0 * * * *"}})
    await patch(http, node, f"/jobs/{job['id']}", {"paused": True})
    status, out = await get(http, node, f"/jobs/{job['id']}/explain?count=2")
    assert status == 200 and len(out["fires"]) == 2
    assert all("job paused" in f["note"] for f in out["fires"])
