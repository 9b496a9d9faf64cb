"""Tasks for ``tests/acceptance/test_cli_first_hour.py``'s real worker
(``--import tests.acceptance.cli_tasks``)."""

from __future__ import annotations

import asyncio
from typing import Any

from schedd.worker import Context, task

LONG_ERROR = "the report database refused the connection: " + "details " * 40


@task("cli.ok")
async def ok(ctx: Context, payload: Any) -> dict[str, Any]:
    await asyncio.sleep(0.05)
    return {"rows": 3}


def _connect_to_reports(dsn: str) -> None:
    raise ConnectionError(LONG_ERROR.strip())


@task("cli.boom")
async def boom(ctx: Context, payload: Any) -> None:
    _connect_to_reports("reports://db")


@task("cli.slow")
async def slow(ctx: Context, payload: Any) -> None:
    """Reports progress, then waits until cancelled (at most a minute)."""
    ctx.progress = {"done": 1, "of": 10}
    try:
        await asyncio.wait_for(ctx.cancelled.wait(), timeout=60)
    except TimeoutError:
        pass
