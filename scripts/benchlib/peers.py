"""The peers, each in its own virtualenv under bench-results/envs/, doing schedd's S1/S2 work."""

# Small local file operations (logs, markers) in a benchmark driver: blocking is fine here.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import run_json, stop_pid, wait_port

HERE = Path(__file__).resolve().parent
PEERS: dict[str, list[str]] = {
    "huey": ["huey>=2.5,<3"],
    "celery": ["celery[redis]>=5.3,<6"],
}


def base_python() -> str:
    """The interpreter the venvs are made from (the one behind .venv)."""
    return getattr(sys, "_base_executable", None) or sys.executable


async def ensure_env(envs: Path, name: str, timeout: float = 600) -> Path:
    """bench-results/envs/<name> with the peer installed (re-installed when the spec changes)."""
    env = envs / name
    py = env / "bin" / "python"
    stamp = env / ".bench-installed"
    want = " ".join(PEERS[name])
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    envs.mkdir(parents=True, exist_ok=True)
    log = envs / f"{name}-install.log"
    for args in (
        [base_python(), "-m", "venv", "--clear", str(env)],
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PEERS[name]],
    ):
        with open(log, "ab") as out:
            proc = await asyncio.create_subprocess_exec(*args, stdout=out, stderr=subprocess.STDOUT)
        try:
            async with asyncio.timeout(timeout):
                rc = await proc.wait()
        except BaseException:
            stop_pid(proc)
            raise
        if rc != 0:
            raise RuntimeError(f"installing {name} failed ({' '.join(args[:4])}...): see {log}")
    stamp.write_text(want)
    return py


async def ensure_redis_server() -> str:
    """Path of Debian's redis-server, installed with apt-get when missing and running as root."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("redis-server is missing (apt-get install -y redis-server, as root)")
    proc = await asyncio.create_subprocess_exec(
        "apt-get",
        "install",
        "-y",
        "-q",
        "redis-server",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    try:
        async with asyncio.timeout(600):
            await proc.wait()
    except BaseException:
        stop_pid(proc)
        raise
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("apt-get install -y redis-server did not provide redis-server")
    return found


async def huey(envs: Path, work: Path, n: int, timeout: float) -> dict[str, Any]:
    py = await ensure_env(envs, "huey")
    work.mkdir(parents=True, exist_ok=True)
    return await run_json(
        [str(py), str(HERE / "huey_bench.py"), str(work), str(n)],
        timeout,
        log=work / "huey-bench.log",
    )


async def celery(envs: Path, work: Path, n: int, timeout: float, free_port) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    py = await ensure_env(envs, "celery")
    server = await ensure_redis_server()
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(work / "redis.log", "ab")
    redis = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(work),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        await asyncio.to_thread(wait_port, port, 15)
        return await run_json(
            [
                str(py),
                str(HERE / "celery_bench.py"),
                str(work),
                f"redis://127.0.0.1:{port}/0",
                str(n),
            ],
            timeout,
            log=work / "celery-bench.log",
        )
    finally:
        stop_pid(redis, grace=5)
        _ = time
