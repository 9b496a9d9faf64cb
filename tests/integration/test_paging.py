"""Run history and the dead-letter queue page through the database (``limit`` + ``cursor``),
on a real node: the pages put together are the whole list, newest first, each item once, and
the last page says it is the last."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from schedd.protocol import messages
from tests.conftest import Node
from tests.integration.test_api import get
from tests.integration.test_worker_protocol import API, committed, connect, submit


async def pages(
    http: aiohttp.ClientSession, node: Node, path: str, limit: int
) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    cursor: str | None = None
    for _ in range(50):
        query = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        async with http.get(node.url + API + path + query, headers=node.headers()) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        out.append(body["runs"])
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError(f"{path}: no last page after 50")


async def everything(http: aiohttp.ClientSession, node: Node, path: str) -> list[dict[str, Any]]:
    async with http.get(node.url + API + path + "?limit=1000", headers=node.headers()) as r:
        body = await r.json()
    assert body["next_cursor"] is None
    runs: list[dict[str, Any]] = body["runs"]
    return runs


async def test_a_jobs_run_history_pages_newest_first(
    node: Node, http: aiohttp.ClientSession
) -> None:
    job = await submit(http, node, {"task": "t", "schedule": {"in": "1h"}})
    for _ in range(6):  # six triggered runs and the scheduled one
        async with http.post(
            node.url + API + f"/jobs/{job['id']}/trigger", data=b"{}", headers=node.headers()
        ) as r:
            assert r.status in (200, 201), await r.text()
    path = f"/jobs/{job['id']}/runs"
    whole = await everything(http, node, path)
    assert len(whole) == 7
    assert [r["scheduled_at"] for r in whole] == sorted(
        (r["scheduled_at"] for r in whole), reverse=True
    )
    got = await pages(http, node, path, 3)
    assert [len(p) for p in got] == [3, 3, 1]
    assert [r["id"] for p in got for r in p] == [r["id"] for r in whole]
    # a page that ends exactly at the last run is the last one
    assert [len(p) for p in await pages(http, node, path, 7)] == [7]
    async with http.get(node.url + API + path + "?cursor=yesterday", headers=node.headers()) as r:
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["field"] == "cursor" and "next_cursor" in err["message"]


async def test_the_dead_letter_queue_pages_newest_first(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w-dead", capacity=1)
    dead = []
    for k in range(5):
        job = await submit(http, node, {"task": "t", "payload": k, "retry": {"max_attempts": 1}})
        lease = await w.expect(messages.Lease)
        assert lease.job_id == job["id"]
        await w.send(
            messages.Fail(run_id=lease.run_id, fence=lease.fence, error=f"e{k}", retryable=False)
        )
        assert (await w.expect(messages.Ack)).accepted
        dead.append(lease.run_id)
    await w.ws.close()
    await committed(node)
    got = await pages(http, node, "/dlq", 2)
    assert [len(p) for p in got] == [2, 2, 1]
    assert [r["id"] for p in got for r in p] == dead[::-1]
    assert [r["error"] for p in got for r in p] == [f"e{k}" for k in range(4, -1, -1)]
    # a replayed run leaves the queue; the pages close over the gap
    async with http.post(
        node.url + API + f"/dlq/{dead[2]}/replay", data=orjson.dumps({}), headers=node.headers()
    ) as r:
        assert r.status == 200, await r.text()
    assert [r["id"] for p in await pages(http, node, "/dlq", 2) for r in p] == [
        dead[4],
        dead[3],
        dead[1],
        dead[0],
    ]


async def test_listings_filter_by_name_id_prefix_latest_run_state_and_time(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w-filter", capacity=1)
    a = await submit(http, node, {"task": "t", "name": "nightly", "retry": {"max_attempts": 1}})
    lease = await w.expect(messages.Lease)
    await w.send(messages.Fail(run_id=lease.run_id, fence=lease.fence, error="x", retryable=False))
    assert (await w.expect(messages.Ack)).accepted
    await w.ws.close()
    b = await submit(http, node, {"task": "u", "name": "nightly", "schedule": {"in": "1h"}})
    c = await submit(http, node, {"task": "t", "name": "hourly", "schedule": {"in": "1h"}})
    await committed(node)

    async def ids(query: str) -> list[str]:
        status, body = await get(http, node, f"/jobs?{query}")
        assert status == 200, body
        return [j["id"] for j in body["jobs"]]

    assert await ids("name=nightly") == [b["id"], a["id"]]  # newest first
    assert await ids("name=nightly&task=u") == [b["id"]]
    assert await ids(f"id_prefix={c['id'].lower()}") == [c["id"]]
    assert await ids("last_run=failed") == [a["id"]]
    assert await ids("last_run=scheduled") == [c["id"], b["id"]]
    assert await ids(f"ids={c['id']},{a['id'].lower()},{'0' * 26}") == [c["id"], a["id"]]
    assert await ids(f"ids={c['id']}&name=nightly") == []
    status, body = await get(http, node, f"/jobs/{b['id']}/runs?state=scheduled")
    assert status == 200 and len(body["runs"]) == 1
    status, body = await get(http, node, f"/jobs/{b['id']}/runs?state=failed")
    assert status == 200 and body["runs"] == []
    status, body = await get(http, node, f"/jobs/{b['id']}/runs?since=2999-01-01T00:00:00Z")
    assert status == 200 and body["runs"] == []
    status, body = await get(http, node, "/dlq?task=t&since=2000-01-01T00:00:00Z")
    assert [r["job_id"] for r in body["runs"]] == [a["id"]]
    status, body = await get(http, node, "/dlq?task=u")
    assert status == 200 and body["runs"] == []
    for path, field in (
        ("/jobs?id_prefix=IL!", "id_prefix"),
        ("/jobs?last_run=exploded", "last_run"),
        (f"/jobs/{b['id']}/runs?state=exploded", "state"),
        (f"/jobs/{b['id']}/runs?since=yesterday", "since"),
        ("/dlq?since=yesterday", "since"),
        ("/jobs?ids=", "ids"),
        ("/jobs?ids=not-an-id", "ids"),
        ("/jobs?ids=" + ",".join([a["id"]] * 201), "ids"),
        ("/dlq?queue=Not+A+Queue", "queue"),
        ("/explain?every=1h&from=0399-07-22T00:00:00Z", "from"),
        (f"/jobs/{b['id']}/explain?from=tomorrow", "from"),
    ):
        status, body = await get(http, node, path)
        assert status == 400, (path, body)
        assert body["error"]["field"] == field, (path, body)


async def test_the_dead_letter_queue_filters_by_error_text_page_by_page(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w-errors", capacity=1)
    errors = ["OSError: disk full on /data", "TimeoutError", "OSError: DISK FULL on /logs"]
    errors += ["TimeoutError", "ValueError: the disk full of records is not valid"]
    jobs = []
    for error in errors:
        jobs.append(await submit(http, node, {"task": "t", "retry": {"max_attempts": 1}}))
        lease = await w.expect(messages.Lease)
        fail = messages.Fail(run_id=lease.run_id, fence=lease.fence, error=error, retryable=False)
        await w.send(fail)
        assert (await w.expect(messages.Ack)).accepted
    await w.ws.close()
    await committed(node)
    disk = [j["id"] for j, e in zip(jobs, errors, strict=True) if "disk full" in e.casefold()]
    status, first = await get(http, node, "/dlq?error=Disk%20Full&limit=2")
    assert status == 200 and [r["job_id"] for r in first["runs"]] == disk[::-1][:2]
    assert first["next_cursor"] is not None
    status, second = await get(
        http, node, f"/dlq?error=Disk%20Full&limit=2&cursor={first['next_cursor']}"
    )
    assert [r["job_id"] for r in second["runs"]] == disk[:1] and second["next_cursor"] is None
    status, timeouts = await get(http, node, "/dlq?error=timeouterror&task=t")
    assert len(timeouts["runs"]) == 2
    status, none = await get(http, node, "/dlq?error=nothing%20like%20it")
    assert status == 200 and none["runs"] == [] and none["next_cursor"] is None
    for bad in ("", "x" * 201):
        status, body = await get(http, node, f"/dlq?error={bad}")
        assert status == 400 and body["error"]["field"] == "error", body


async def job_pages(http: aiohttp.ClientSession, node: Node, query: str, limit: int) -> list[str]:
    """The ids of every page of ``GET /jobs?query``, ``limit`` a page, in order."""
    out: list[str] = []
    cursor: str | None = None
    for _ in range(50):
        page = f"/jobs?{query}&limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        status, body = await get(http, node, page)
        assert status == 200, body
        out += [j["id"] for j in body["jobs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError(f"{query}: no last page after 50")


async def test_jobs_list_newest_first_or_by_next_fire_or_latest_run_with_cursors(
    node: Node, http: aiohttp.ClientSession
) -> None:
    # a..e in this order, fire times out of order; b has run, d is cancelled (no next fire)
    offsets = {"a": "3h", "b": "1h", "c": "5h", "d": "2h", "e": "4h"}
    ids = {}
    for key, delay in offsets.items():
        ids[key] = (await submit(http, node, {"task": f"sort-{key}", "schedule": {"in": delay}}))[
            "id"
        ]
    async with http.post(
        node.url + API + f"/jobs/{ids['b']}/trigger", data=b"{}", headers=node.headers()
    ) as r:
        assert r.status == 201, await r.text()
    async with http.delete(node.url + API + f"/jobs/{ids['d']}", headers=node.headers()) as r:
        assert r.status == 204
    await committed(node)
    mine = {v: k for k, v in ids.items()}

    async def order(query: str) -> str:
        got = await job_pages(http, node, query, 2)
        return "".join(mine[i] for i in got if i in mine)

    assert await order("sort=created") == "edcba"  # the default: newest first
    assert await order("") == "edcba"
    assert await order("order=asc") == "abcde"
    assert await order("sort=next_fire") == "baecd"  # soonest first; no next fire last
    assert await order("sort=next_fire&order=desc") == "dceab"
    # the latest run's scheduled time: b's trigger (now) is older than every job's first run
    # (in 1-5 hours), which is what each job's latest run is
    assert await order("sort=latest_run") == "ceadb"
    # a cursor is read in its own sort: one from another is refused, by name
    status, body = await get(http, node, "/jobs?sort=next_fire&limit=1")
    cursor = body["next_cursor"]
    assert status == 200 and cursor is not None and "." in cursor
    status, err = await get(http, node, f"/jobs?cursor={cursor}")
    assert status == 400 and err["error"]["field"] == "cursor", err
    assert "sorted by created" in err["error"]["message"]
    for bad, field in (("sort=name", "sort"), ("order=up", "order"), ("cursor=1.x", "cursor")):
        status, err = await get(http, node, f"/jobs?{bad}")
        assert status == 400 and err["error"]["field"] == field, (bad, err)
        assert "expected" in err["error"]["message"]
