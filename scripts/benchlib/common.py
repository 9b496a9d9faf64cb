"""Shared helpers: percentiles, summaries, and child processes that are always stopped by PID."""

# Small local file operations (logs, markers) in a benchmark driver: blocking is fine here.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def stop_pid(
    proc: subprocess.Popen[bytes] | asyncio.subprocess.Process | None, grace: float = 10.0
) -> None:
    """SIGTERM the process by its PID, then SIGKILL after ``grace`` seconds (blocking)."""
    if proc is None:
        return
    pid = proc.pid
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return
    if proc.returncode is not None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


async def run_json(
    args: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
) -> dict[str, Any]:
    """Run a child that prints one JSON object as its last stdout line; stopped by PID on
    timeout or cancellation (it gets SIGTERM first, so its own ``finally`` blocks run)."""
    err = open(log, "ab") if log else subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd
    )
    if log:
        err.close()
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except BaseException:
        stop_pid(proc, grace=15)
        raise
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log else ""
        raise RuntimeError(
            f"{Path(args[1]).name if len(args) > 1 else args[0]} exited {proc.returncode}\n{tail}"
        )
    lines = [ln for ln in out.decode().splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError(f"{args[:2]} printed no result")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def sigterm_exits() -> None:
    """In a child script: SIGTERM raises SystemExit so ``finally`` blocks stop grandchildren."""

    def _exit(*_: Any) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _exit)
