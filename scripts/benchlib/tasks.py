"""schedd bench tasks (``schedd-worker --import scripts.benchlib.tasks``).

``bench.lag`` records, at handler start, the worker's ``time.time()`` and the job's scheduled time
(one line ``<start epoch seconds> <scheduled_at>``) to the file named by ``SCHEDD_BENCH_LAG``.
"""

# Small local file operations (logs, markers) in a benchmark driver: blocking is fine here.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import os
import time
from typing import Any

from schedd.worker import Context, task

_PATH = os.environ.get("SCHEDD_BENCH_LAG", "")


@task("bench.lag")
async def lag(ctx: Context, payload: Any) -> None:
    started = time.time()
    with open(_PATH, "a", encoding="utf-8") as fh:
        fh.write(f"{started!r} {ctx.scheduled_at}\n")


@task("bench.noop")
async def noop(ctx: Context, payload: Any) -> None:
    return None
