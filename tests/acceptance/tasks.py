"""Tasks for the acceptance tests' real ``schedd-worker`` (``--import tests.acceptance.tasks``).

``acc.record`` appends one line per execution (run id, fence, attempt) to the file named by
``SCHEDD_TEST_RECORD``, so the test can see every execution the worker made (and, with
``SCHEDD_TEST_RECORD_TIME`` set, the wall-clock time in ms as a fourth field); with
``"fail_below": N`` in its payload it then fails attempts 1 to N-1 (retries, dead-lettering).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from schedd.worker import Context, task


@task("acc.record")
async def record(ctx: Context, payload: Any) -> dict[str, Any]:
    await asyncio.sleep(float((payload or {}).get("sleep", 0.05)))
    path = os.environ["SCHEDD_TEST_RECORD"]
    with open(path, "a", encoding="utf-8") as fh:
        stamp = (
            f" {time.time_ns() // 1_000_000}" if os.environ.get("SCHEDD_TEST_RECORD_TIME") else ""
        )
        fh.write(f"{ctx.run_id} {ctx.fence} {ctx.attempt}{stamp}\n")
    if ctx.attempt < int((payload or {}).get("fail_below", 0)):
        raise RuntimeError(f"acc.record fails attempt {ctx.attempt}")
    return {"run_id": ctx.run_id, "attempt": ctx.attempt}


@task("acc.fail")
async def always_fail(ctx: Context, payload: Any) -> None:
    raise RuntimeError(f"acc.fail attempt {ctx.attempt}")
