"""A submit says when nothing connected would run the job: a job nobody serves is accepted
(a worker may connect later) with a warning naming the task and queue."""

from __future__ import annotations

import aiohttp
import orjson

from tests.conftest import Node
from tests.integration.test_worker_protocol import API, connect, submit


async def test_a_submit_warns_when_no_connected_worker_serves_the_task(
    node: Node, http: aiohttp.ClientSession
) -> None:
    alone = await submit(http, node, {"task": "mail.send", "schedule": {"in": "1h"}})
    assert alone["warnings"] == [
        "no worker is connected: task 'mail.send' on queue 'default' waits for one"
    ]
    w = await connect(http, node, "w-warn", tasks=("reports.generate",))
    try:
        other = await submit(http, node, {"task": "mail.send", "schedule": {"in": "1h"}})
        assert other["warnings"] == [
            "no connected worker serves task 'mail.send' on queue 'default'"
        ]
        served = await submit(http, node, {"task": "reports.generate", "schedule": {"in": "1h"}})
        assert "warnings" not in served
    finally:
        await w.ws.close()


async def test_a_batch_warns_per_new_job_and_the_batching_client_passes_it_on(
    node: Node, http: aiohttp.ClientSession
) -> None:
    from schedd.client import AsyncClient

    w = await connect(http, node, "w-batch", tasks=("reports.generate",))
    try:
        body = {
            "jobs": [
                {"task": "billing.charge", "schedule": {"in": "1h"}},
                {"task": "reports.generate", "schedule": {"in": "1h"}},
            ]
        }
        async with http.post(
            node.url + API + "/jobs/batch", data=orjson.dumps(body), headers=node.headers()
        ) as r:
            assert r.status == 201
            unserved, served = (await r.json())["jobs"]
        assert unserved["warnings"] == [
            "no connected worker serves task 'billing.charge' on queue 'default'"
        ]
        assert "warnings" not in served
        token = node.headers()["Authorization"].removeprefix("Bearer ")
        async with AsyncClient(node.url, token=token) as client:  # batching is the default
            job = await client.submit("billing.charge", in_="1h")
        assert job.warnings == (
            "no connected worker serves task 'billing.charge' on queue 'default'",
        )
    finally:
        await w.ws.close()


async def test_a_task_name_close_to_one_a_worker_serves_gets_a_did_you_mean(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w-typo", tasks=("demo.echo", "demo.sleep"))
    try:
        typo = await submit(http, node, {"task": "demo.ecko", "schedule": {"in": "1h"}})
        assert typo["warnings"] == [
            "no connected worker serves task 'demo.ecko' on queue 'default'; "
            "did you mean 'demo.echo'?"
        ]
        far = await submit(http, node, {"task": "billing.charge", "schedule": {"in": "1h"}})
        assert "did you mean" not in far["warnings"][0]
    finally:
        await w.ws.close()


async def test_an_at_in_the_past_is_accepted_with_a_warning(
    node: Node, http: aiohttp.ClientSession
) -> None:
    job = await submit(
        http, node, {"task": "t", "queue": "later", "schedule": {"at": "2020-01-01T00:00:00Z"}}
    )
    assert job["warnings"][0] == (
        "schedule.at 2020-01-01T00:00:00.000Z is in the past: the run is due now"
    )
    soon = await submit(http, node, {"task": "t", "queue": "later", "schedule": {"in": "1h"}})
    assert not any("past" in w for w in soon.get("warnings", []))


async def test_a_time_zone_not_found_is_answered_with_the_one_meant(
    node: Node, http: aiohttp.ClientSession
) -> None:
    body = {"task": "t", "schedule": {"cron": "0 2 * * *", "timezone": "berlin"}}
    async with http.post(
        node.url + API + "/jobs", data=orjson.dumps(body), headers=node.headers()
    ) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["field"] == "schedule.timezone"
    assert error["message"].endswith("got 'berlin'; did you mean 'Europe/Berlin'?")
