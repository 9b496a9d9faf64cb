"""Demo tasks: ``schedd-worker --import schedd.worker.demo_tasks``.

- ``demo.echo``: returns its payload.
- ``demo.sleep``: sleeps ``payload["seconds"]`` (cancellable), returns ``{"slept": seconds}``.
- ``demo.fail``: always raises (retryable, unless ``payload["retryable"]`` is false).
- ``demo.flaky``: fails while ``ctx.attempt < payload["succeed_on"]``, then succeeds.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from schedd.worker.registry import Context, NonRetryable, task


class DemoFailure(Exception):
    """What the failing demo tasks raise."""


def _field(payload: Any, name: str) -> Any:
    if not isinstance(payload, dict) or name not in payload:
        raise NonRetryable(f"payload.{name}: required")
    return payload[name]


@task("demo.echo")
async def echo(ctx: Context, payload: Any) -> Any:
    return payload


@task("demo.sleep")
async def sleep(ctx: Context, payload: Any) -> dict[str, float]:
    seconds = _field(payload, "seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise NonRetryable(f"payload.seconds: expected a non-negative number, got {seconds!r}")
    await asyncio.sleep(seconds)
    return {"slept": float(seconds)}


@task("demo.fail")
async def fail(ctx: Context, payload: Any) -> None:
    message = f"demo.fail always fails (attempt {ctx.attempt})"
    if isinstance(payload, dict) and payload.get("retryable") is False:
        raise NonRetryable(message)
    raise DemoFailure(message)


@task("demo.flaky")
async def flaky(ctx: Context, payload: Any) -> dict[str, int]:
    succeed_on = _field(payload, "succeed_on")
    if isinstance(succeed_on, bool) or not isinstance(succeed_on, int):
        raise NonRetryable(f"payload.succeed_on: expected an integer, got {succeed_on!r}")
    if ctx.attempt < succeed_on:
        raise DemoFailure(f"demo.flaky: attempt {ctx.attempt} < succeed_on {succeed_on}")
    return {"attempt": ctx.attempt}
