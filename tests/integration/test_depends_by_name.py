"""``depends_on`` takes a job's name as well as its id (as every schedctl command does), and a
run its upstream blocks or made skip names that upstream job and its latest run."""

from __future__ import annotations

from typing import Any

import aiohttp

from schedd.protocol import messages
from tests.conftest import Node, wait_for
from tests.integration.test_api import get, post
from tests.integration.test_worker_protocol import API, connect, submit


async def _got(http: aiohttp.ClientSession, node: Node, path: str) -> dict[str, Any]:
    status, body = await get(http, node, path)
    assert status == 200, body
    return body


async def _latest_run_if(
    http: aiohttp.ClientSession, node: Node, job_id: str, state: str
) -> dict[str, Any] | None:
    """The job's latest run (as ``GET /runs/{id}`` shows it) once it is in ``state``."""
    run = (await _got(http, node, f"/jobs/{job_id}"))["latest_run"]
    return await _got(http, node, f"/runs/{run['id']}") if run["state"] == state else None


async def test_depends_on_a_name_and_the_blocked_run_names_its_upstream(
    node: Node, http: aiohttp.ClientSession
) -> None:
    up = await submit(
        http, node, {"task": "t", "name": "extract", "schedule": {"in": "1h"}, "namespace": "dn"}
    )
    down = await submit(
        http, node, {"task": "t", "namespace": "dn", "depends_on": ["extract"], "name": "load"}
    )
    assert down["depends_on"] == [up["id"]]
    run = await wait_for(
        lambda: _latest_run_if(
            http, node, down["id"], "blocked"
        )  # fired at once, blocked by its upstream
    )
    assert run["reason"] == "dependencies"
    [upstream] = run["upstream"]
    assert upstream["job_id"] == up["id"] and upstream["name"] == "extract"
    assert (upstream["status"], upstream["state"]) == ("active", "scheduled")
    assert upstream["run_id"] == up["latest_run"]["id"]
    job = await _got(http, node, f"/jobs/{down['id']}")
    assert job["latest_run"]["upstream"] == [upstream]


async def test_a_run_skipped_for_its_upstream_names_the_failed_run(
    node: Node, http: aiohttp.ClientSession
) -> None:
    worker = await connect(http, node, "w-dep", capacity=1)
    up = await submit(
        http, node, {"task": "t", "name": "fetch", "namespace": "ds", "retry": {"max_attempts": 1}}
    )
    lease = await worker.expect(messages.Lease)
    await worker.send(
        messages.Fail(run_id=lease.run_id, fence=lease.fence, error="boom", retryable=False)
    )
    assert (await worker.expect(messages.Ack)).accepted
    status, down = await post(
        http, node, "/jobs", {"task": "t", "namespace": "ds", "depends_on": ["fetch"]}
    )
    assert status == 201
    run = await wait_for(lambda: _latest_run_if(http, node, down["id"], "skipped"))
    assert run["reason"] == "upstream_failed"
    assert run["upstream"] == [
        {
            "job_id": up["id"],
            "name": "fetch",
            "status": "done",
            "run_id": lease.run_id,
            "state": "failed",
        }
    ]
    await worker.ws.close()


async def test_an_unknown_or_ambiguous_name_is_refused_naming_it(
    node: Node, http: aiohttp.ClientSession
) -> None:
    status, body = await post(
        http, node, "/jobs", {"task": "t", "namespace": "dx", "depends_on": ["nope"]}
    )
    assert status == 404 and body["error"]["field"] == "depends_on[0]"
    assert "'nope'" in body["error"]["message"]
    twins = [
        await submit(
            http, node, {"task": "t", "name": "twin", "namespace": "dx", "schedule": {"in": "1h"}}
        )
        for _ in range(2)
    ]
    status, body = await post(
        http,
        node,
        "/jobs/batch",
        {"jobs": [{"task": "t", "namespace": "dx", "depends_on": ["twin"]}]},
    )
    assert status == 409 and body["error"]["field"] == "jobs[0].depends_on[0]"
    assert all(t["id"] in body["error"]["message"] for t in twins)
    # in a batch, a ref wins over a name
    status, body = await post(
        http,
        node,
        "/jobs/batch",
        {
            "jobs": [
                {"ref": "twin", "task": "t", "namespace": "dx", "schedule": {"in": "1h"}},
                {"task": "t", "namespace": "dx", "depends_on": ["twin"]},
            ]
        },
    )
    assert status == 201
    first, second = body["jobs"]
    assert second["depends_on"] == [first["id"]]


async def test_a_name_used_many_times_means_its_one_live_job_and_twice_is_refused(
    node: Node, http: aiohttp.ClientSession
) -> None:
    body = {"task": "t", "name": "nightly", "namespace": "dm", "schedule": {"in": "1h"}}
    for _ in range(52):  # more than a page of cancelled jobs of that name, oldest first
        old = await submit(http, node, body)
        async with http.delete(node.url + API + f"/jobs/{old['id']}", headers=node.headers()) as r:
            assert r.status == 204
    live = await submit(http, node, body)
    status, down = await post(
        http, node, "/jobs", {"task": "t", "namespace": "dm", "depends_on": ["nightly"]}
    )
    assert status == 201 and down["depends_on"] == [live["id"]]
    status, body2 = await post(
        http,
        node,
        "/jobs",
        {"task": "t", "namespace": "dm", "depends_on": ["nightly", live["id"]]},
    )
    assert status == 400 and body2["error"]["field"] == "depends_on[1]"
    assert "expected each upstream once" in body2["error"]["message"]
