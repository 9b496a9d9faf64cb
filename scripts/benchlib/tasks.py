"""schedd bench tasks (``schedd-worker --import scripts.benchlib.tasks``).

``bench.lag`` records, at handler start, the worker's ``time.time()``, the job's scheduled time and
the job id (one line ``<start epoch seconds> <scheduled_at> <job id>``) to the file named by
``SCHEDD_BENCH_LAG``.
``bench.failover`` (S5, scripts/benchlib/failover.py) records, at handler start, one line
``<start epoch seconds> <job id> <lease fence> <attempt>`` to the same file.  The lease fence is
the Raft log index of the entry that leased the run, so it tells which leader leased it: every
lease a leader commits lies after its claim's index (its leader fence) in the log.
The lines are buffered and written every 50 ms, so one handler's file write does not delay the
start of the next one (start lag measures the scheduler, not this file).
"""

# Small local file operations (logs, markers) in a benchmark driver: blocking is fine here.

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from schedd.worker import Context, task

_PATH = os.environ.get("SCHEDD_BENCH_LAG", "")
_buffer: list[str] = []


def _flush() -> None:
    lines = "".join(_buffer)
    _buffer.clear()
    with open(_PATH, "a", encoding="utf-8") as fh:
        fh.write(lines)


def _record(line: str) -> None:
    if not _buffer:
        asyncio.get_running_loop().call_later(0.05, _flush)
    _buffer.append(line)


@task("bench.lag")
async def lag(ctx: Context, payload: Any) -> None:
    started = time.time()
    _record(f"{started!r} {ctx.scheduled_at} {ctx.job_id}\n")


@task("bench.failover")
async def failover(ctx: Context, payload: Any) -> None:
    started = time.time()
    _record(f"{started!r} {ctx.job_id} {ctx.fence} {ctx.attempt}\n")


@task("bench.noop")
async def noop(ctx: Context, payload: Any) -> None:
    return None
