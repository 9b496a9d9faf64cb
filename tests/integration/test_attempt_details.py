"""What a run's attempts tell about the work on a real one-node cluster with a real worker: the
progress the task reports while it runs (and its last one, with the end), and the tail of the
traceback of a task that raised."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.worker import Context
from schedd.worker.client import Worker
from schedd.worker.registry import Registry
from tests.conftest import Node, running_node, wait_for
from tests.integration.test_worker_protocol import submit

API = "/api/v1"


@pytest.fixture
async def beating_node(tmp_path: Path) -> AsyncIterator[Node]:
    """A node whose workers heartbeat (and so report progress) five times a second."""
    async with running_node(tmp_path / "n1", heartbeat_interval="0.2s") as n:
        yield n


async def attempt_of(http: aiohttp.ClientSession, node: Node, run_id: str) -> dict[str, Any]:
    """The run's last attempt as ``GET /runs/{id}`` shows it, with the run's state."""
    async with http.get(node.url + API + f"/runs/{run_id}", headers=node.headers()) as r:
        assert r.status == 200, await r.text()
        run = await r.json()
    return {"state": run["state"], **(run["attempts"][-1] if run["attempts"] else {})}


def explode_in_the_middle_of_the_work(rows: list[int]) -> int:
    return rows[0] // 0 if rows else int("not a number")


async def test_a_task_progress_shows_in_its_attempt_and_a_raising_task_leaves_its_traceback(
    beating_node: Node, http: aiohttp.ClientSession
) -> None:
    node = beating_node
    registry = Registry()
    seen = asyncio.Event()  # the test saw the progress: the task may finish

    @registry.task("report")
    async def report(ctx: Context, payload: Any) -> str:
        ctx.progress = {"done": 1, "of": 2}
        await asyncio.wait_for(seen.wait(), 30)  # running until the test has seen it (bounded)
        ctx.progress = {"done": 2, "of": 2}  # the last one: sent with the result
        return "ok"

    @registry.task("load")
    def load(ctx: Context, payload: Any) -> int:
        return explode_in_the_middle_of_the_work(payload["rows"])

    worker = Worker([node.url], token=node.token, registry=registry, drain_timeout=2.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        await wait_for(lambda: worker.connected, timeout=10)
        job = await submit(http, node, {"task": "report"})
        run_id = job["latest_run"]["id"]

        async def progress_shown() -> dict[str, Any] | None:
            attempt = await attempt_of(http, node, run_id)
            return attempt if attempt.get("progress") is not None else None

        running = await wait_for(progress_shown, timeout=15)
        seen.set()
        assert running["state"] == "running" and running["outcome"] is None
        assert running["progress"] == {"done": 1, "of": 2}
        assert running["progress_at"] is not None and running["traceback"] is None

        async def finished(rid: str) -> dict[str, Any] | None:
            attempt = await attempt_of(http, node, rid)
            return attempt if attempt["state"] in ("succeeded", "failed") else None

        done = await wait_for(lambda: finished(run_id), timeout=15)
        assert (done["state"], done["outcome"]) == ("succeeded", "succeeded")
        assert done["progress"] == {"done": 2, "of": 2}  # recorded with the end
        assert done["progress_at"] >= running["progress_at"]

        failing = await submit(
            http, node, {"task": "load", "payload": {"rows": [7]}, "retry": {"max_attempts": 1}}
        )
        failed = await wait_for(lambda: finished(failing["latest_run"]["id"]), timeout=15)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)
    assert (failed["state"], failed["outcome"]) == ("failed", "failed")
    assert failed["error"] == "ZeroDivisionError: integer division or modulo by zero"
    tb = failed["traceback"]
    assert "in explode_in_the_middle_of_the_work" in tb and "in load" in tb
    assert tb.splitlines()[-1] == failed["error"]
    assert failed["progress"] is None and failed["progress_at"] is None
