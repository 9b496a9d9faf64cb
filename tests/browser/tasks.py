"""Tasks for the browser tests' real ``schedd-worker`` (``--import tests.browser.tasks``)."""

from __future__ import annotations

import asyncio
from typing import Any

from schedd.worker import Context, task


@task("ui.ok")
async def ok(ctx: Context, payload: Any) -> dict[str, Any]:
    ctx.progress = {"done": 3, "of": 4}
    await asyncio.sleep(float((payload or {}).get("sleep", 0.05)))
    return {"attempt": ctx.attempt}


@task("ui.disk")
async def disk(ctx: Context, payload: Any) -> None:
    raise OSError("disk full on /data")


@task("ui.parse")
async def parse(ctx: Context, payload: Any) -> None:
    raise ValueError(f"cannot parse record {(payload or {}).get('record', 0)}")
