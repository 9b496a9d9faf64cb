"""``GET /api/v1/scheduling-lag`` on a real node: the fire and lease lags of the runs the leader
fired and leased, by queue and priority, what is due and not leased now, and the skips."""

from __future__ import annotations

from typing import Any

import aiohttp

from schedd.protocol import messages
from tests.conftest import Node, wait_for
from tests.integration.test_worker_protocol import committed, connect, submit

API = "/api/v1"


async def lag(http: aiohttp.ClientSession, node: Node, query: str = "") -> tuple[int, Any]:
    async with http.get(node.url + API + "/scheduling-lag" + query, headers=node.headers()) as r:
        return r.status, await r.json()


async def test_the_lags_of_what_was_fired_and_leased_by_queue_and_priority(
    node: Node, http: aiohttp.ClientSession
) -> None:
    status, before = await lag(http, node)
    assert status == 200 and before["leader"] == "n1" and before["window"] == 300
    assert (before["fire"]["count"], before["lease"]["count"], before["fire"]["p50"]) == (
        0,
        0,
        None,
    )
    worker = await connect(http, node, "w1", capacity=10)
    for priority in ("high", "high", "low"):
        await submit(http, node, {"task": "t", "priority": priority})
    leases = [await worker.expect(messages.Lease) for _ in range(3)]
    stuck = await submit(http, node, {"task": "t", "queue": "nobody"})  # queued, never leased

    async def fired_all() -> Any:
        _, view = await lag(http, node, "?minutes=1")
        return view if view["fire"]["count"] == 4 and view["lease"]["count"] == 3 else None

    await wait_for(fired_all)
    await committed(node)  # the counts of now are read from what the node's reads see
    _, view = await lag(http, node, "?minutes=1")
    assert view["window"] == 60
    lease = view["lease"]
    assert [(g["queue"], g["priority"], g["count"]) for g in lease["by"]] == [
        ("default", "high", 2),
        ("default", "low", 1),
    ]
    for stats in (lease, view["fire"], *lease["by"]):
        assert 0 <= stats["p50"] <= stats["p99"] < 5  # a run now is fired and leased at once
    assert ("nobody", "normal", 1) in [
        (g["queue"], g["priority"], g["count"]) for g in view["fire"]["by"]
    ]
    assert (view["queued"], view["overdue"], view["due_not_leased"]) == (1, 0, 1)
    assert stuck["latest_run"]["state"] in ("scheduled", "queued")
    for held in leases:
        await worker.send(messages.Complete(run_id=held.run_id, fence=held.fence))
    await worker.ws.close()


async def test_skipped_occurrences_are_counted_by_reason(
    node: Node, http: aiohttp.ClientSession
) -> None:
    worker = await connect(http, node, "w1")
    job = await submit(http, node, {"task": "t", "schedule": {"every": "1h", "overlap": "skip"}})

    async def trigger() -> dict[str, Any]:
        path = node.url + API + f"/jobs/{job['id']}/trigger"
        async with http.post(path, headers=node.headers()) as r:
            assert r.status == 201
            run: dict[str, Any] = await r.json()
            return run

    await trigger()
    await worker.expect(messages.Lease)  # the first runs ...
    second = await trigger()  # ... so the second overlaps it: skipped
    assert (second["state"], second["reason"]) == ("skipped", "overlap")
    _, view = await lag(http, node)
    assert view["skipped"] == [{"reason": "overlap", "count": 1}] and view["misfires"] == 0
    await worker.ws.close()


async def test_a_window_outside_1_to_60_minutes_is_a_400(
    node: Node, http: aiohttp.ClientSession
) -> None:
    for bad in ("0", "61", "five"):
        status, body = await lag(http, node, f"?minutes={bad}")
        assert status == 400 and body["error"]["field"] == "minutes", body
