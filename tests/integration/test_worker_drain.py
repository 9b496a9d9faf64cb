"""``POST /api/v1/workers/{worker_id}/drain``: the leader tells the worker to drain and leases it
nothing more; it finishes what it holds, and ``GET /workers`` shows it draining.  Spoken frame
by frame with a raw worker, and with the SDK's worker."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from schedd.auth import Role, Token, TokenStore
from schedd.protocol import messages
from schedd.worker import Context
from schedd.worker.client import Worker
from schedd.worker.registry import Registry
from tests.conftest import Node, wait_for
from tests.integration.test_worker_protocol import connect, submit

API = "/api/v1"


async def drain(
    http: aiohttp.ClientSession, node: Node, worker_id: str, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    async with http.post(
        node.url + API + f"/workers/{worker_id}/drain", headers=node.headers(token)
    ) as r:
        return r.status, await r.json()


async def workers(http: aiohttp.ClientSession, node: Node) -> dict[str, dict[str, Any]]:
    async with http.get(node.url + API + "/workers", headers=node.headers()) as r:
        return {w["worker_id"]: w for w in (await r.json())["workers"]}


async def get_run(http: aiohttp.ClientSession, node: Node, run_id: str) -> dict[str, Any]:
    async with http.get(node.url + API + f"/runs/{run_id}", headers=node.headers()) as r:
        run: dict[str, Any] = await r.json()
        return run


async def queued(http: aiohttp.ClientSession, node: Node, run_id: str) -> dict[str, Any]:
    """The run once it is queued (fired: due, waiting for a worker)."""

    async def look() -> dict[str, Any] | None:
        run = await get_run(http, node, run_id)
        return run if run["state"] == "queued" else None

    found: dict[str, Any] = await wait_for(look)
    return found


async def test_a_drained_worker_finishes_its_lease_and_is_leased_nothing_more(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w1 = await connect(http, node, "w1", capacity=2)
    first = await submit(http, node, {"task": "t"})
    held = await w1.expect(messages.Lease)
    assert held.job_id == first["id"]

    status, view = await drain(http, node, "w1")
    assert status == 200, view
    assert (view["worker_id"], view["draining"], view["leases"]) == ("w1", True, 1)
    assert isinstance(await w1.recv(), messages.Drain)  # the next frame it gets
    assert (await workers(http, node))["w1"]["draining"] is True

    # w1 has room for one more but is leased nothing: the next run waits for another worker
    second = await submit(http, node, {"task": "t"})
    run_id = second["latest_run"]["id"]
    waiting = await queued(http, node, run_id)
    assert "draining" in waiting["waiting"]
    w2 = await connect(http, node, "w2")
    assert (await w2.expect(messages.Lease)).run_id == run_id

    # what w1 holds it finishes: the result is accepted
    await w1.send(messages.Complete(run_id=held.run_id, fence=held.fence))
    ack = await w1.expect(messages.Ack)
    assert ack.accepted and ack.run_id == held.run_id
    # draining twice is the same answer, and tells the worker nothing new
    status, again = await drain(http, node, "w1")
    assert status == 200 and again["draining"] is True and again["leases"] == 0
    for w in (w1, w2):
        await w.ws.close()


async def test_draining_an_unknown_worker_is_a_404_and_needs_the_admin_role(
    node: Node, http: aiohttp.ClientSession
) -> None:
    status, body = await drain(http, node, "nobody")
    assert status == 404 and body["error"]["field"] == "worker_id"
    assert "'nobody'" in body["error"]["message"]
    node.rt.tokens = TokenStore(
        [
            (Token("admin", Role.ADMIN), node.token),
            (Token("ops", Role.SUBMIT), "submit-secret-0123456789"),
        ]
    )
    w = await connect(http, node, "w1")
    status, body = await drain(http, node, "w1", "submit-secret-0123456789")
    assert status == 403 and body["error"]["code"] == "permission_denied"
    assert (await workers(http, node))["w1"]["draining"] is False
    await w.ws.close()


async def test_the_sdk_worker_finishes_its_running_handler_and_takes_nothing_after_a_drain(
    node: Node, http: aiohttp.ClientSession
) -> None:
    registry = Registry()
    started, release = asyncio.Event(), asyncio.Event()

    @registry.task("slow")
    async def slow(ctx: Context, payload: Any) -> str:
        started.set()
        await release.wait()
        return "done"

    worker = Worker([node.url], token=node.token, registry=registry, worker_id="sdk")
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        await wait_for(lambda: worker.connected, timeout=10)
        first = await submit(http, node, {"task": "slow"})
        await asyncio.wait_for(started.wait(), 10)
        status, view = await drain(http, node, "sdk")
        assert status == 200 and view["draining"] and view["leases"] == 1
        second = await submit(http, node, {"task": "slow"})
        release.set()  # the running handler ends: its result is committed

        async def first_succeeded() -> bool:
            run = await get_run(http, node, first["latest_run"]["id"])
            return bool(run["state"] == "succeeded" and run["result"] == "done")

        await wait_for(first_succeeded, timeout=10)
        assert worker.connected and (await workers(http, node))["sdk"]["draining"] is True
        waiting = await queued(http, node, second["latest_run"]["id"])
        assert "draining" in waiting["waiting"]
        assert worker.leases == ()  # it took nothing new
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)
