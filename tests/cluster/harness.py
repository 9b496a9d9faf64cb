"""Real multi-process clusters for cluster and acceptance tests.

Every process is started with its PID recorded and is stopped by that PID (SIGTERM, then
SIGKILL) when the test ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from schedd.auth import ensure_admin_token
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _toml(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["SCHEDD_LOG_FORMAT"] = "text"
    env.pop("SCHEDD_SERVER", None)
    env.pop("SCHEDD_TOKEN", None)
    return env


@dataclass
class NodeProc:
    node_id: str
    http_port: int
    raft_port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    root: Path
    size: int = 3
    scheduler: dict[str, Any] = field(default_factory=dict)
    raft: dict[str, Any] = field(default_factory=dict)
    nodes: list[NodeProc] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    token: str = ""

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tokens = self.root / "tokens.toml"
        self.token, _ = ensure_admin_token(tokens)
        ports = [free_port() for _ in range(self.size)]
        for i, port in enumerate(ports):
            node_id = f"n{i + 1}"
            peers = [f'"127.0.0.1:{p + 1}"' for p in ports if p != port]
            sched = "".join(f"{k} = {_toml(v)}\n" for k, v in self.scheduler.items())
            raft = "".join(f"{k} = {_toml(v)}\n" for k, v in self.raft.items())
            cfg = self.root / f"{node_id}.toml"
            cfg.write_text(
                f'[node]\nid = "{node_id}"\ndata_dir = "{self.root / node_id}"\n'
                f'[http]\nlisten = "127.0.0.1:{port}"\n'
                f'[raft]\nlisten = "127.0.0.1:{port + 1}"\npeers = [{", ".join(peers)}]\n{raft}'
                f'[auth]\ntokens_file = "{tokens}"\n'
                f"[scheduler]\n{sched}"
            )
            self.nodes.append(NodeProc(node_id, port, port + 1, cfg, self.root / f"{node_id}.log"))

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    # -- processes -----------------------------------------------------------------------------
    def start(self, i: int | None = None) -> None:
        for n in self.nodes if i is None else [self.nodes[i]]:
            if n.alive:
                continue
            out = open(n.log, "ab")  # noqa: SIM115 - owned by the child
            n.proc = subprocess.Popen(
                [str(BIN / "schedd"), "--config", str(n.config)],
                stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=self.root,
            )
            out.close()

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.nodes[i].proc
        assert proc is not None
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(10)

    def spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=REPO)
        out.close()
        self.others.append(proc)
        return proc

    def start_worker(self, *extra: str, name: str = "worker") -> subprocess.Popen[bytes]:
        args = [str(BIN / "schedd-worker"), f"--token={self.token}", "--worker-id", name]
        for url in self.urls:
            args += ["--server", url]
        return self.spawn(args + list(extra), self.root / f"{name}.log")

    def stop(self) -> None:
        procs = [n.proc for n in self.nodes if n.proc is not None] + self.others
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def logs(self) -> str:
        out = []
        for path in sorted(self.root.glob("*.log")):
            out.append(f"==== {path.name}\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(out)

    # -- API helpers -----------------------------------------------------------------------------
    async def view(self, http: aiohttp.ClientSession, i: int) -> dict[str, Any] | None:
        try:
            async with http.get(self.nodes[i].url + "/api/v1/cluster", headers=self.headers(),
                                timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    data: dict[str, Any] = await r.json()
                    return data
        except (aiohttp.ClientError, TimeoutError):
            pass
        return None

    async def wait_leader(self, http: aiohttp.ClientSession, timeout: float = 30.0,
                          exclude: int | None = None) -> int:
        """Index of the node that reports itself leader with a committed claim."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, n in enumerate(self.nodes):
                if i == exclude or not n.alive:
                    continue
                v = await self.view(http, i)
                if v and v["role"] == "leader" and v["leader"] == n.node_id:
                    return i
            await asyncio.sleep(0.1)
        raise AssertionError(f"no leader within {timeout}s\n{self.logs()}")
