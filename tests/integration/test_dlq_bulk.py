"""``POST /api/v1/dlq/replay`` and ``/dlq/drop`` on a real node: a dry run says what the real
request then does, the filters (and a list of run ids) pick the runs, a repeated X-Request-Id
does nothing twice, and more runs than ``limits.max_bulk`` is a 400 naming the limit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.protocol import messages
from tests.conftest import Node, running_node, wait_for
from tests.integration.test_worker_protocol import RawWorker, connect, submit

API = "/api/v1"


async def post(
    http: aiohttp.ClientSession, node: Node, path: str, body: Any, request_id: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = node.headers()
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    async with http.post(node.url + API + path, json=body, headers=headers) as r:
        return r.status, await r.json()


async def dlq_ids(http: aiohttp.ClientSession, node: Node) -> set[str]:
    async with http.get(node.url + API + "/dlq?limit=1000", headers=node.headers()) as r:
        return {run["id"] for run in (await r.json())["runs"]}


async def fail_all(
    worker: RawWorker, count: int, error: Callable[[messages.Lease], str]
) -> list[messages.Lease]:
    """Fail the next ``count`` leases for good (leases and acks interleave on the socket)."""
    leases: list[messages.Lease] = []
    acked = 0
    while acked < count:
        msg = await worker.recv()
        if isinstance(msg, messages.Lease):
            leases.append(msg)
            await worker.send(messages.Fail(msg.run_id, msg.fence, error(msg), retryable=False))
        elif isinstance(msg, messages.Ack):
            assert msg.accepted, msg
            acked += 1
    return leases


async def dead_letter(
    http: aiohttp.ClientSession, node: Node, worker: RawWorker, jobs: list[tuple[str, str, str]]
) -> dict[str, tuple[str, str, str]]:
    """Submit one job per (task, namespace, error), fail each lease for good with that error;
    once every run is in the dead-letter queue: run id -> (task, namespace, error)."""
    errors: dict[str, str] = {}
    tasks: dict[str, tuple[str, str, str]] = {}
    for task, namespace, error in jobs:
        job = await submit(
            http,
            node,
            {"task": task, "namespace": namespace, "retry": {"max_attempts": 1}},
        )
        errors[job["id"]] = error
        tasks[job["latest_run"]["id"]] = (task, namespace, error)
    await fail_all(worker, len(jobs), lambda lease: errors[lease.job_id])

    async def all_dead() -> bool:
        return await dlq_ids(http, node) >= set(tasks)

    await wait_for(all_dead)
    return tasks


async def test_a_dry_run_counts_what_the_replay_then_does_once_per_request_id(
    node: Node, http: aiohttp.ClientSession
) -> None:
    worker = await connect(http, node, "w1", capacity=10)
    dead = await dead_letter(
        http, node, worker, [("mail", "default", "boom")] * 3 + [("sms", "default", "boom")] * 2
    )
    status, dry = await post(http, node, "/dlq/replay", {"dry_run": True})
    assert status == 200, dry
    assert dry["message"] == "replay 5 runs of 2 tasks"
    assert (dry["action"], dry["dry_run"], dry["count"], dry["skipped"]) == ("replay", True, 5, [])
    assert dry["tasks"] == [{"task": "mail", "count": 3}, {"task": "sms", "count": 2}]
    assert set(dry["run_ids"]) == set(dead)
    assert await dlq_ids(http, node) == set(dead)  # a dry run does nothing

    status, done = await post(http, node, "/dlq/replay", {"dry_run": False}, "bulk-replay-1")
    assert status == 200, done
    assert done["message"] == "replayed 5 runs of 2 tasks"
    assert (done["count"], done["tasks"], set(done["run_ids"])) == (
        dry["count"],
        dry["tasks"],
        set(dry["run_ids"]),
    )
    assert await dlq_ids(http, node) == set()
    # replayed: each is leased again with a fresh attempt; fail them again, into the queue
    again = await fail_all(worker, len(dead), lambda lease: "again")
    assert {lease.run_id for lease in again} == set(dead)
    assert {lease.attempt for lease in again} == {2}
    await wait_for(lambda: _equals(dlq_ids(http, node), set(dead)))
    # the same request again: the first answer, and nothing replayed a second time
    status, repeated = await post(http, node, "/dlq/replay", {"dry_run": False}, "bulk-replay-1")
    assert status == 200 and repeated == done
    assert await dlq_ids(http, node) == set(dead)
    await worker.ws.close()


async def _equals(got: Any, expected: set[str]) -> bool:
    return bool(await got == expected)


async def test_filters_and_a_list_of_run_ids_pick_the_runs(
    node: Node, http: aiohttp.ClientSession
) -> None:
    worker = await connect(http, node, "w1", capacity=10)
    dead = await dead_letter(
        http,
        node,
        worker,
        [
            ("mail", "default", "SMTP: disk full"),
            ("mail", "default", "timeout"),
            ("mail", "other", "disk full again"),
            ("sms", "default", "Disk Full"),
        ],
    )

    def where(task: str | None = None, ns: str | None = None, text: str = "") -> set[str]:
        return {
            r
            for r, (t, n, e) in dead.items()
            if task in (None, t) and ns in (None, n) and text in e.casefold()
        }

    async def matched(body: dict[str, Any]) -> set[str]:
        status, out = await post(http, node, "/dlq/drop", {"dry_run": True, **body})
        assert status == 200, out
        return set(out["run_ids"])

    assert await matched({"error": "DISK FULL"}) == where(text="disk full")
    assert len(where(text="disk full")) == 3  # either case
    assert await matched({"error": "disk", "task": "mail", "namespace": "default"}) == where(
        "mail", "default", "disk"
    )
    assert await matched({"task": "sms"}) == where("sms")
    assert await matched({"namespace": "other", "queue": "default"}) == where(ns="other")
    assert await matched({"queue": "elsewhere"}) == set()
    assert await matched({"since": "2999-01-01T00:00:00Z"}) == set()
    assert await matched({"since": "2000-01-01T00:00:00Z"}) == set(dead)

    keep = next(iter(where("mail", "default", "timeout")))
    named = [r for r in dead if r != keep] + ["nope@1"]
    status, out = await post(http, node, "/dlq/drop", {"dry_run": False, "run_ids": named})
    assert status == 200, out
    assert (out["action"], out["count"], out["skipped"]) == ("drop", 3, ["nope@1"])
    assert out["message"] == "dropped 3 runs of 2 tasks; 1 skipped (not in the dead-letter queue)"
    assert await dlq_ids(http, node) == {keep}
    async with http.get(node.url + API + f"/runs/{named[0]}", headers=node.headers()) as r:
        assert (await r.json())["state"] == "failed"  # dropped from the queue, kept in history
    await worker.ws.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "dry_run"),
        ({"dry_run": "yes"}, "dry_run"),
        ({"dry_run": True, "colour": "red"}, "colour"),
        ({"dry_run": True, "task": "mail", "run_ids": ["a@1"]}, "run_ids"),
        ({"dry_run": True, "run_ids": ["a@1", "a@1"]}, "run_ids[1]"),
        ({"dry_run": True, "run_ids": []}, "run_ids"),
        ({"dry_run": True, "namespace": "Not Ident"}, "namespace"),
        ({"dry_run": True, "since": "yesterday"}, "since"),
    ],
)
async def test_a_bad_selection_is_a_400_naming_the_field(
    node: Node, http: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    status, out = await post(http, node, "/dlq/replay", body)
    assert status == 400 and out["error"]["field"] == field, out


async def test_more_matching_runs_than_the_limit_is_a_400_naming_it(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_node(tmp_path / "n1", limits={"max_bulk": 2}) as node:
        worker = await connect(http, node, "w1", capacity=10)
        await dead_letter(http, node, worker, [("mail", "default", "boom")] * 3)
        for dry_run in (True, False):
            status, out = await post(http, node, "/dlq/replay", {"dry_run": dry_run})
            assert status == 400, out
            message = out["error"]["message"]
            assert "more than 2 runs" in message and "limits.max_bulk" in message
            assert "narrower filter" in message
        assert len(await dlq_ids(http, node)) == 3  # nothing was done
        status, out = await post(
            http, node, "/dlq/replay", {"dry_run": True, "run_ids": ["a@1"] * 3}
        )
        assert status == 400 and out["error"]["field"] == "run_ids"  # more ids than the limit
        await worker.ws.close()
