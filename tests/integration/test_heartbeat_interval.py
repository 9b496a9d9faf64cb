"""A job whose heartbeat timeout is shorter than the cluster's heartbeat interval: its lease asks
the worker to heartbeat more often, so a healthy worker running a long handler keeps the lease
(before, every attempt was lost at the timeout and the run ended in the dead-letter queue)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from schedd.protocol import messages
from schedd.worker import Context
from schedd.worker.client import Worker
from schedd.worker.registry import Registry
from tests.conftest import Node, wait_for
from tests.integration.test_worker_protocol import connect, runs, submit


async def test_a_short_heartbeat_timeout_is_carried_by_the_lease(
    node: Node, http: aiohttp.ClientSession
) -> None:
    assert node.rt.config.scheduler.heartbeat_interval_ms == 5000  # the default
    w = await connect(http, node, "w-raw")
    await submit(http, node, {"task": "t", "heartbeat_timeout": "1500ms"})
    short = await w.expect(messages.Lease)
    assert short.heartbeat_interval is not None and abs(short.heartbeat_interval - 0.5) < 1e-9
    await w.send(messages.Complete(run_id=short.run_id, fence=short.fence))
    await w.expect(messages.Ack)
    await submit(http, node, {"task": "t", "heartbeat_timeout": "60s"})
    usual = await w.expect(messages.Lease)
    assert usual.heartbeat_interval is None, "the welcome's interval is enough"
    await w.ws.close()


async def test_a_healthy_worker_keeps_a_lease_with_a_short_heartbeat_timeout(
    node: Node, http: aiohttp.ClientSession
) -> None:
    registry = Registry()
    finished: list[int] = []

    @registry.task("slow")
    async def slow(ctx: Context, payload: Any) -> None:
        await asyncio.sleep(2.5)  # longer than the timeout, shorter than the welcome's interval
        finished.append(ctx.attempt)

    worker = Worker([node.url], token=node.token, registry=registry, drain_timeout=2.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        await wait_for(lambda: worker.connected, timeout=10)
        job = await submit(http, node, {"task": "slow", "heartbeat_timeout": "1s"})

        async def done() -> list[dict[str, Any]] | None:
            history = await runs(http, node, job["id"])
            return history if history and history[0]["state"] in ("succeeded", "failed") else None

        [run] = await wait_for(done, timeout=30)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)
    assert run["state"] == "succeeded", run
    assert [a["outcome"] for a in run["attempts"]] == ["succeeded"], run["attempts"]
    assert finished == [1]
