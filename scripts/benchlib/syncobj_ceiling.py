"""Ceiling: a bare three-process pysyncobj cluster on loopback committing batched no-op entries."""

# Small local file operations (logs, markers) in a benchmark driver: blocking is fine here.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from .common import stop_pid

NODE = Path(__file__).with_name("syncobj_node.py")


async def syncobj_ceiling(root: Path, n: int, free_port) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """entries/s (one op per entry) and ops/s (100 ops per entry); processes stopped by PID."""
    root.mkdir(parents=True, exist_ok=True)
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    result = root / f"syncobj-{time.monotonic_ns()}.json"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, me in enumerate(addrs):
            others = ",".join(a for j, a in enumerate(addrs) if j != i)
            log = open(root / f"syncobj-node{i}.log", "ab")
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(NODE), me, others, str(result), str(n)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()
        while not result.exists():
            if all(p.poll() is not None for p in procs):
                raise RuntimeError(
                    "pysyncobj nodes exited without a result: see "
                    + str(root / "syncobj-node*.log")
                )
            await asyncio.sleep(0.05)
        data = json.loads(result.read_text())
        return {"syncobj_entries": data["entries_per_s"], "syncobj_ops": data["ops_per_s"]}
    finally:
        for p in procs:
            stop_pid(p, grace=5)
