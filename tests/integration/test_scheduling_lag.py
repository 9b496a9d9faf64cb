"""``GET /api/v1/scheduling-lag`` on a real node: the fire and lease lags of the runs the leader
fired and leased, by queue and priority, what is due and not leased now, the skips, and with
``samples=true`` each run's lags one by one."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import pytest

from schedd.api.openapi import spec
from schedd.protocol import messages
from tests.conftest import Node, wait_for
from tests.integration.test_metrics import scrape
from tests.integration.test_openapi import _component
from tests.integration.test_worker_protocol import RawWorker, committed, connect, submit

API = "/api/v1"


async def lag(http: aiohttp.ClientSession, node: Node, query: str = "") -> tuple[int, Any]:
    async with http.get(node.url + API + "/scheduling-lag" + query, headers=node.headers()) as r:
        return r.status, await r.json()


async def complete_and_leave(worker: RawWorker, leases: list[messages.Lease]) -> None:
    for held in leases:
        await worker.send(messages.Complete(run_id=held.run_id, fence=held.fence))
    await worker.ws.close()


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
    await complete_and_leave(worker, leases)


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


def _ms(instant: str) -> int:
    return int(datetime.fromisoformat(instant.replace("Z", "+00:00")).timestamp() * 1000)


async def test_samples_are_each_run_fired_and_leased_with_its_due_time_and_lag(
    node: Node, http: aiohttp.ClientSession
) -> None:
    worker = await connect(http, node, "w1", capacity=10)
    jobs = [await submit(http, node, {"task": "t", "priority": p}) for p in ("high", "high", "low")]
    due = {_ms(job["latest_run"]["due_at"]) for job in jobs}
    leases = [await worker.expect(messages.Lease) for _ in range(3)]

    async def sampled() -> Any:
        _, view = await lag(http, node, "?minutes=15&samples=true")
        samples = view["samples"]
        return view if len(samples["fire"]) == len(samples["lease"]) == 3 else None

    view = await wait_for(sampled)
    assert view["window"] == 900 and view["lease"]["count"] == 3
    errors = sorted(_component(spec(), "SchedulingLag").iter_errors(view), key=str)
    assert not errors, errors[0]
    for kind in ("fire", "lease"):
        samples = view["samples"][kind]
        assert sorted((q, p) for _, _, q, p in samples) == [
            ("default", "high"),
            ("default", "high"),
            ("default", "low"),
        ]
        assert {due_ms for due_ms, _, _, _ in samples} == due  # each run's own due time
        for _, lag_s, _, _ in samples:
            assert 0 <= lag_s < 5  # a run due now is fired and leased at once
    _, plain = await lag(http, node, "?minutes=15")
    assert "samples" not in plain and plain["lease"] == view["lease"]
    await complete_and_leave(worker, leases)


async def test_a_samples_other_than_true_or_false_is_a_400_naming_it(
    node: Node, http: aiohttp.ClientSession
) -> None:
    for bad in ("yes", "1", "TRUE", ""):
        status, body = await lag(http, node, f"?samples={bad}")
        assert status == 400 and body["error"]["field"] == "samples", body
    status, body = await lag(http, node, "?samples=false")
    assert status == 200 and "samples" not in body


async def test_a_follower_asks_the_leader_with_the_samples_too(
    node: Node, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    async def leader_answers(request: Any, path: str) -> Any:
        asked.append(path)
        return {"leader": "n2"}

    monkeypatch.setattr(node.rt, "leader", None)  # as a follower sees it
    monkeypatch.setattr(node.rt.proxy, "get", leader_answers)
    for query in ("?minutes=15&samples=true", "", "?samples=false&minutes=2"):
        status, body = await lag(http, node, query)
        assert (status, body) == (200, {"leader": "n2"})
    assert asked == [
        API + "/scheduling-lag?minutes=15&samples=true",
        API + "/scheduling-lag?minutes=5",
        API + "/scheduling-lag?minutes=2",
    ]


async def test_a_bulk_replay_is_not_lag_its_runs_count_from_the_replay(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Dead-lettered runs due 30 s ago and replayed now are leased at once: their lease lag is
    counted from the replay, so the lease histogram (what the lag alert reads) stays low."""
    worker = await connect(http, node, "w-replay", capacity=10)
    past = datetime.fromtimestamp(time.time() - 30, UTC).isoformat()
    jobs = [
        await submit(
            http,
            node,
            {
                "task": "t",
                "queue": "default",
                "schedule": {"at": past},
                "retry": {"max_attempts": 1},
            },
        )
        for _ in range(3)
    ]
    # each first attempt: leased 30 s late (a true lag), then fails for good
    for lease in [await worker.expect(messages.Lease) for _ in jobs]:
        await worker.send(messages.Fail(run_id=lease.run_id, fence=lease.fence, error="boom"))
        assert (await worker.expect(messages.Ack)).accepted
    await committed(node)
    before = await _lease_lag_buckets(http, node)
    assert before["+Inf"] - before["1.0"] >= 3  # the first attempts' lags: about 30 s
    body = orjson.dumps({"task": "t", "dry_run": False})
    async with http.post(node.url + API + "/dlq/replay", data=body, headers=node.headers()) as r:
        assert r.status == 200, await r.text()
    for lease in [await worker.expect(messages.Lease) for _ in jobs]:
        await worker.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
        assert (await worker.expect(messages.Ack)).accepted
    after = await _lease_lag_buckets(http, node)
    assert after["+Inf"] - before["+Inf"] == 3  # the replays were observed...
    assert after["1.0"] - before["1.0"] == 3  # ...each under a second late
    _, view = await lag(http, node, "?minutes=1&samples=true")
    replayed = view["samples"]["lease"][-3:]
    assert all(lag_s < 1 for _, lag_s, _, _ in replayed), replayed
    await worker.ws.close()


async def _lease_lag_buckets(http: aiohttp.ClientSession, node: Node) -> dict[str, float]:
    """``le`` -> the cumulative count of schedd_lease_lag_seconds, summed over its labels."""
    out: dict[str, float] = {}
    for (name, labels), value in (await scrape(http, node)).items():
        if name == "schedd_lease_lag_seconds_bucket":
            le = dict(labels)["le"]
            out[le] = out.get(le, 0.0) + value
    return out
