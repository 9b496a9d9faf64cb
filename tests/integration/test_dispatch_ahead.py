"""Runs handed to a worker ahead of their due time (``scheduler.dispatch_ahead``): the lease
arrives early with ``not_before``, the handler starts at the due time on the worker's clock and
never before it, and a run cancelled while it waits never starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.core.durations import parse_time
from schedd.protocol import messages
from schedd.worker import Context
from schedd.worker.client import Worker
from schedd.worker.registry import Registry
from tests.conftest import Node, running_node, start_node, wait_for
from tests.integration.test_worker_protocol import API, committed_runs, connect, runs, submit


def _epoch(text: str) -> float:
    return parse_time(text, "t") / 1000


@pytest.fixture
async def slow_node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path / "n1", dispatch_ahead="0s") as n:
        yield n


async def test_a_lease_arrives_before_the_due_time_with_not_before(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w-ahead")
    job = await submit(http, node, {"task": "t", "schedule": {"in": "1500ms"}})
    lease = await w.expect(messages.Lease, timeout=10)
    received = time.time()
    assert lease.not_before is not None
    due = _epoch(lease.not_before)
    assert lease.scheduled_at == lease.not_before  # no jitter: due at the scheduled time
    assert received < due, "the lease should reach the worker before the run is due"
    [run] = await committed_runs(http, node, job["id"])
    assert run["state"] == "running"
    assert _epoch(run["attempts"][0]["started_at"]) == due  # the attempt starts when due
    await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
    ack = await w.expect(messages.Ack)
    assert ack.accepted
    await w.ws.close()


async def test_without_dispatch_ahead_the_lease_comes_at_the_due_time(
    slow_node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, slow_node, "w-due")
    await submit(http, slow_node, {"task": "t", "schedule": {"in": "500ms"}})
    lease = await w.expect(messages.Lease, timeout=10)
    assert lease.not_before is None
    assert time.time() >= _epoch(lease.scheduled_at)
    await w.ws.close()


async def _with_worker(node: Node, registry: Registry, body: Any) -> None:
    worker = Worker([node.url], token=node.token, registry=registry, drain_timeout=2.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        await wait_for(lambda: worker.connected, timeout=10)
        await body()
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)


async def test_the_sdk_starts_a_run_leased_ahead_at_its_due_time_never_before(
    node: Node, http: aiohttp.ClientSession
) -> None:
    registry = Registry()
    started: dict[str, float] = {}

    @registry.task("ahead.record")
    async def record(ctx: Context, payload: Any) -> None:
        started[ctx.run_id] = time.time()

    async def body() -> None:
        jobs = [
            await submit(http, node, {"task": "ahead.record", "schedule": {"in": f"{ms}ms"}})
            for ms in (1200, 1500, 1800)
        ]
        await wait_for(lambda: len(started) == 3, timeout=15)
        for job in jobs:
            [run] = await runs(http, node, job["id"])
            due = _epoch(run["scheduled_at"])
            assert started[run["id"]] >= due, "a handler started before its due time"
            assert _epoch(run["attempts"][0]["started_at"]) == due
            await wait_for(lambda j=job: _succeeded(http, node, j["id"]), timeout=10)

    await _with_worker(node, registry, body)


async def _succeeded(http: aiohttp.ClientSession, node: Node, job_id: str) -> bool:
    return [r["state"] for r in await runs(http, node, job_id)] == ["succeeded"]


async def test_a_run_cancelled_while_it_waits_on_the_worker_never_starts(
    node: Node, http: aiohttp.ClientSession
) -> None:
    registry = Registry()
    started: list[str] = []

    @registry.task("ahead.never")
    async def never(ctx: Context, payload: Any) -> None:
        started.append(ctx.run_id)

    async def body() -> None:
        job = await submit(http, node, {"task": "ahead.never", "schedule": {"in": "1800ms"}})

        async def running() -> str | None:
            [run] = await runs(http, node, job["id"])
            return str(run["id"]) if run["state"] == "running" else None

        run_id = await wait_for(running, timeout=10)
        due = _epoch((await runs(http, node, job["id"]))[0]["scheduled_at"])
        assert time.time() < due, "the run should be leased (and waiting) before it is due"
        async with http.post(
            node.url + API + f"/runs/{run_id}/cancel", headers=node.headers()
        ) as r:
            assert r.status == 200, await r.text()
        # The handler would start at `due`: wait past it, then check it never ran.
        await asyncio.sleep(max(0.0, due - time.time()) + 0.5)
        assert started == []
        [run] = await runs(http, node, job["id"])
        assert run["state"] == "cancelled"

    await _with_worker(node, registry, body)


async def _metric(http: aiohttp.ClientSession, node: Node, name: str) -> float:
    async with http.get(node.url + "/metrics", headers=node.headers()) as r:
        text = await r.text()
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")
    ]
    return values[0] if values else 0.0


@pytest.mark.parametrize("ahead", [True, False])
async def test_fire_lag_is_measured_and_a_fire_ahead_counts_as_zero(
    tmp_path: Path, http: aiohttp.ClientSession, ahead: bool
) -> None:
    n = await start_node(tmp_path / "n1", dispatch_ahead="1s" if ahead else "0s")
    try:
        await submit(http, n, {"task": "t", "schedule": {"in": "1200ms"}})
        await wait_for(lambda: _metric(http, n, "schedd_fire_lag_seconds_count"), timeout=10)
        assert await _metric(http, n, "schedd_fire_lag_seconds_count") == 1.0
        lag = await _metric(http, n, "schedd_fire_lag_seconds_sum")
        if ahead:
            assert lag == 0.0  # committed before it was due
        else:
            assert 0.0 <= lag < 5.0  # committed at or after its due time
    finally:
        await n.rt.stop()
