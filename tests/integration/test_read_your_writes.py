"""Reading your own writes: every write answers the index of its entry, every read of the state
the index its node had reached, and a read given ``min_index`` (or ``consistency=consistent``)
answers once the node's reads see it, or 503 after a bounded wait."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from schedd.api import consistency
from schedd.protocol import messages
from tests.conftest import Node
from tests.integration.test_worker_protocol import connect

API = "/api/v1"


async def _get(
    http: aiohttp.ClientSession, node: Node, path: str, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    async with http.get(node.url + API + path, headers={**node.headers(), **(headers or {})}) as r:
        return r.status, await r.json(), r.headers


async def _finished_unseen(http: aiohttp.ClientSession, node: Node, worker: str) -> str:
    """Submit a job, have a worker complete its run, and return the run's id: the node applied
    the result but its API's reads do not see it yet (the lazy node)."""
    w = await connect(http, node, worker)
    async with http.post(
        node.url + API + "/jobs", data=orjson.dumps({"task": "t"}), headers=node.headers()
    ) as r:
        assert r.status == 201
    lease = await w.expect(messages.Lease, timeout=10)
    await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
    assert (await w.expect(messages.Ack)).accepted
    await w.ws.close()
    assert node.rt.node.state_index < node.rt.node.applied_index
    return lease.run_id


async def test_writes_answer_their_entry_and_reads_the_index_they_saw(
    lazy_node: Node, http: aiohttp.ClientSession
) -> None:
    node = lazy_node
    async with http.post(
        node.url + API + "/jobs",
        data=orjson.dumps({"task": "t", "schedule": {"in": "1h"}}),
        headers=node.headers(),
    ) as r:
        assert r.status == 201
        written = int(r.headers["X-Schedd-Index"])
        job = await r.json()
    assert 0 < written <= node.rt.node.applied_index
    status, _, headers = await _get(http, node, f"/jobs/{job['id']}")
    assert status == 200 and int(headers["X-Schedd-Index"]) >= written
    async with http.delete(node.url + API + f"/jobs/{job['id']}", headers=node.headers()) as r:
        assert r.status == 204 and int(r.headers["X-Schedd-Index"]) > written


async def test_a_read_with_min_index_sees_what_the_node_had_not_yet_made_visible(
    lazy_node: Node, http: aiohttp.ClientSession
) -> None:
    node = lazy_node
    run_id = await _finished_unseen(http, node, "w-ryw")
    applied = node.rt.node.applied_index
    status, run, _ = await _get(http, node, f"/runs/{run_id}")
    assert status == 200 and run["state"] != "succeeded"  # a plain read: the last commit
    status, run, headers = await _get(http, node, f"/runs/{run_id}?min_index={applied}")
    assert status == 200 and run["state"] == "succeeded", run
    assert int(headers["X-Schedd-Index"]) >= applied
    job_id = run["job_id"]
    status, page, _ = await _get(
        http, node, f"/jobs/{job_id}/runs", {"X-Schedd-Min-Index": str(applied)}
    )
    assert status == 200 and page["runs"][0]["state"] == "succeeded"


async def test_a_consistent_read_sees_every_write_before_it(
    lazy_node: Node, http: aiohttp.ClientSession
) -> None:
    node = lazy_node
    run_id = await _finished_unseen(http, node, "w-consistent")
    applied = node.rt.node.applied_index
    status, run, headers = await _get(http, node, f"/runs/{run_id}?consistency=consistent")
    assert status == 200 and run["state"] == "succeeded"
    assert int(headers["X-Schedd-Index"]) > applied  # its own round trip's entry
    run_id = await _finished_unseen(http, node, "w-consistent-2")
    status, run, _ = await _get(
        http, node, f"/runs/{run_id}", {"X-Schedd-Consistency": "consistent"}
    )
    assert status == 200 and run["state"] == "succeeded"


async def test_an_index_not_reached_in_time_is_a_503_with_retry_after(
    lazy_node: Node, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consistency, "READ_WAIT_S", 0.2)
    node = lazy_node
    ahead = node.rt.node.applied_index + 1000
    status, body, headers = await _get(http, node, f"/jobs?min_index={ahead}")
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["error"]["field"] == "min_index" and str(ahead) in body["error"]["message"]


@pytest.mark.parametrize(
    ("query", "headers", "field"),
    [
        ("?min_index=-1", {}, "min_index"),
        ("?min_index=abc", {}, "min_index"),
        ("", {"X-Schedd-Min-Index": "1.5"}, "X-Schedd-Min-Index"),
        ("?consistency=linearizable", {}, "consistency"),
        ("", {"X-Schedd-Consistency": "strong"}, "X-Schedd-Consistency"),
    ],
)
async def test_a_bad_min_index_or_consistency_is_a_400_naming_it(
    lazy_node: Node,
    http: aiohttp.ClientSession,
    query: str,
    headers: dict[str, str],
    field: str,
) -> None:
    status, body, _ = await _get(http, lazy_node, f"/jobs{query}", headers)
    assert status == 400 and body["error"]["field"] == field, body
    assert "expected" in body["error"]["message"]
