"""Real multi-process clusters for cluster and acceptance tests.

Every process is started with its PID recorded and is stopped by that PID (SIGTERM, then
SIGKILL) when the test ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from schedd.auth import ensure_admin_token
from tests.conftest import free_port

_T = TypeVar("_T")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _toml(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + "}"
    return (
        f'"{value}"'
        if isinstance(value, str)
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
    )


# ``Cluster(clock_skew=True)`` starts each node through this launcher: the node's Python wall clock
# (time.time / time.time_ns, which schedd.clock and logging read) is shifted by the number of
# seconds in its clock file, re-read every 50 ms, so a test can step one node's clock while it
# runs.  The kernel clock and time.monotonic (Raft and lease timers) are untouched, as with an
# NTP step.  (libfaketime cannot do this here: with monotonic time left alone, Python 3.11's
# time.sleep fails with EINVAL under it, and with it faked, Event.wait(timeout) hangs.)
SKEW_LAUNCHER = r"""
import os, sys, time
_path = os.environ["SCHEDD_TEST_CLOCK_FILE"]
_real_ns, _mono = time.time_ns, time.monotonic
_cache = [0, -1.0]
def _offset_ns():
    now = _mono()
    if now - _cache[1] > 0.05:
        _cache[1] = now
        try:
            with open(_path) as f:
                _cache[0] = int(float(f.read().strip() or 0) * 1e9)
        except (OSError, ValueError):
            pass
    return _cache[0]
time.time_ns = lambda: _real_ns() + _offset_ns()
time.time = lambda: time.time_ns() / 1e9
from schedd.cli.daemon import main
sys.exit(main())
"""


#: What a node logs when it replaces its state with a whole copy of the leader's (a Raft
#: snapshot it was sent): the name it has today, and the names it might be given.
SNAPSHOT_INSTALL_EVENTS = ("raft.snapshot_install", "raft.snapshot_installed")


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
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    root: Path
    size: int = 3
    scheduler: dict[str, Any] = field(default_factory=dict)
    raft: dict[str, Any] = field(default_factory=dict)
    #: [history] keys (retention, max_runs_per_job)
    history: dict[str, Any] = field(default_factory=dict)
    #: [limits] keys (concurrency, submit_rate)
    limits: dict[str, Any] = field(default_factory=dict)
    #: per node index, [raft] keys that replace the shared ones (``peers`` included)
    node_raft: dict[int, dict[str, Any]] = field(default_factory=dict)
    nodes: list[NodeProc] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    token: str = ""
    #: Raft traffic between nodes goes through ``self.net`` (tests/cluster/proxy.py), one proxy
    #: port per node, so tests can cut, delay and drop links.
    proxied: bool = False
    #: nodes start through SKEW_LAUNCHER; :meth:`set_clock_offset` shifts one node's wall clock
    clock_skew: bool = False
    #: node i's HTTP port (its Raft port is the next one); free ports when empty
    http_ports: list[int] = field(default_factory=list)
    #: extra environment of the nodes' processes
    env: dict[str, str] = field(default_factory=dict)
    #: per node, the address it listens on (default loopback) and a command prefix it is
    #: started with (tests/cluster/netns.py: ``ip netns exec NS``)
    hosts: list[str] = field(default_factory=list)
    launch: list[list[str]] = field(default_factory=list)
    #: per node index, the ``bin`` directory of another installation of schedd that the node is
    #: started from (an earlier release: tests/acceptance/upgrade.py), without this tree on its
    #: PYTHONPATH; changed between a node's stop and start, it upgrades the node in place
    bins: dict[int, Path] = field(default_factory=dict)
    #: ``cluster.shards``: each node a supervisor with a process per shard, shard k's Raft port
    #: the node's Raft port + k
    shards: int = 1
    net: Any = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tokens = self.root / "tokens.toml"
        self.token, _ = ensure_admin_token(tokens)
        assert self.shards == 1 or not self.proxied, "one proxy port per node: one shard"
        ports = list(self.http_ports) or [
            free_port(1 + self.shards) for _ in range(self.size * (2 if self.proxied else 1))
        ]
        if self.proxied:
            # Node i gets (http, raft) from one pair and its proxy port from the next, every
            # port of node i below every port of node j > i (see tests/cluster/proxy.py).
            ports.sort()
            proxy_ports = ports[1::2]
            ports = ports[0::2]
        hosts = list(self.hosts) or ["127.0.0.1"] * self.size
        peer_addr = [
            f"{hosts[i]}:{proxy_ports[i] if self.proxied else p + 1}" for i, p in enumerate(ports)
        ]
        for i, port in enumerate(ports):
            node_id = f"n{i + 1}"
            others = [j for j in range(self.size) if j != i]
            raft_extra = {**self.raft, **self.node_raft.get(i, {})}
            peers = [_toml(a) for a in raft_extra.pop("peers", [peer_addr[j] for j in others])]
            if self.proxied:
                raft_extra.setdefault("peer_http", [f"http://127.0.0.1:{ports[j]}" for j in others])
            sched = "".join(f"{k} = {_toml(v)}\n" for k, v in self.scheduler.items())
            raft = "".join(f"{k} = {_toml(v)}\n" for k, v in raft_extra.items())
            history = "".join(f"{k} = {_toml(v)}\n" for k, v in self.history.items())
            history = f"[history]\n{history}" if history else ""
            limits = "".join(f"{k} = {_toml(v)}\n" for k, v in self.limits.items())
            history += f"[limits]\n{limits}" if limits else ""
            cfg = self.root / f"{node_id}.toml"
            cfg.write_text(
                (f"[cluster]\nshards = {self.shards}\n" if self.shards > 1 else "")
                + f'[node]\nid = "{node_id}"\ndata_dir = "{self.root / node_id}"\n'
                f'[http]\nlisten = "{hosts[i]}:{port}"\n'
                f'[raft]\nlisten = "{hosts[i]}:{port + 1}"\npeers = [{", ".join(peers)}]\n{raft}'
                f'[auth]\ntokens_file = "{tokens}"\n'
                f"[scheduler]\n{sched}{history}"
            )
            self.nodes.append(
                NodeProc(node_id, port, port + 1, cfg, self.root / f"{node_id}.log", host=hosts[i])
            )
            if self.clock_skew:
                self.clock_file(i).write_text("0\n")
        if self.proxied:
            from tests.cluster.proxy import ProxyNet

            self.net = ProxyNet([n.raft_port for n in self.nodes], proxy_ports)

    def clock_file(self, i: int) -> Path:
        return self.root / f"{self.nodes[i].node_id}.clock"

    def set_clock_offset(self, i: int, seconds: float) -> None:
        """Step node i's wall clock to real time + ``seconds`` (``clock_skew=True`` only)."""
        assert self.clock_skew, "Cluster(clock_skew=True) is needed to shift a node's clock"
        tmp = self.clock_file(i).with_suffix(".tmp")
        tmp.write_text(f"{seconds}\n")
        tmp.replace(self.clock_file(i))

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    # -- processes -----------------------------------------------------------------------------
    def start(self, i: int | None = None) -> None:
        if self.net is not None:
            self.net.start()
        for k, n in enumerate(self.nodes):
            if (i is not None and k != i) or n.alive:
                continue
            env = {**_env(), **self.env}
            prefix = self.launch[k] if self.launch else []
            bin_dir = self.bins.get(k, BIN)
            if bin_dir != BIN:
                env.pop("PYTHONPATH", None)  # this tree's schedd would shadow the release's
            args = [*prefix, str(bin_dir / "schedd"), "--config", str(n.config)]
            if self.clock_skew:
                env["SCHEDD_TEST_CLOCK_FILE"] = str(self.clock_file(k))
                args = [*prefix, sys.executable, "-c", SKEW_LAUNCHER, "--config", str(n.config)]
            out = open(n.log, "ab")  # owned by the child
            n.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root
            )
            out.close()

    def data_dir(self, i: int) -> Path:
        """Node i's ``node.data_dir`` (a lossy mount's mount point, in tests that use one)."""
        return self.root / self.nodes[i].node_id

    def wipe(self, i: int) -> list[str]:
        """Delete everything node i wrote in its data directory (the Raft journal and its state
        file, the snapshot, the state database with its ``-wal``/``-shm``, temporary files),
        and in its ``raft.journal_dir`` if it has one, as a disk replaced under a stopped node.
        The directories themselves stay (one may be a mount point), and so would any file the
        harness put there (its config, the tokens and its log live in :attr:`root`).  Returns
        the paths deleted, relative to the data directory (or absolute)."""
        assert not self.nodes[i].alive, f"{self.nodes[i].node_id} is running: stop it first"
        ours = {self.nodes[i].config, self.nodes[i].log, self.root / "tokens.toml"}
        if self.clock_skew:
            ours.add(self.clock_file(i))
        top = self.data_dir(i)
        tops = [top]
        journal_dir = {**self.raft, **self.node_raft.get(i, {})}.get("journal_dir")
        if journal_dir is not None:
            tops.append(Path(journal_dir))
        gone: list[str] = []
        for where in tops:
            for path in sorted(where.rglob("*"), reverse=True):  # a directory's files first
                if path in ours or any(p.is_relative_to(path) for p in ours):
                    continue
                gone.append(str(path.relative_to(top) if path.is_relative_to(top) else path))
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()
        return sorted(gone)

    def log_size(self, i: int) -> int:
        """How many bytes node i's log holds so far (where to read its later lines from)."""
        try:
            return self.nodes[i].log.stat().st_size
        except FileNotFoundError:
            return 0

    def log_events(self, i: int, events: tuple[str, ...], since: int = 0) -> list[str]:
        """Node i's log lines from byte ``since`` on that record one of ``events``."""
        try:
            with open(self.nodes[i].log, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return []
        names = set(events)
        return [line for line in text.splitlines() if names.intersection(line.split())]

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.nodes[i].proc
        assert proc is not None
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(10)

    def spawn(
        self, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = open(log, "ab")
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**_env(), **(env or {})}, cwd=REPO
        )
        out.close()
        self.others.append(proc)
        return proc

    def start_worker(
        self,
        *extra: str,
        name: str = "worker",
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        args = [*(prefix or []), str(BIN / "schedd-worker"), f"--token={self.token}"]
        args += ["--worker-id", name]
        for url in self.urls:
            args += ["--server", url]
        return self.spawn(args + list(extra), self.root / f"{name}.log", env)

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
        if self.net is not None:
            self.net.stop()

    def logs(self) -> str:
        out = []
        for path in sorted(self.root.glob("*.log")):
            out.append(f"==== {path.name}\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(out)

    # -- API helpers -----------------------------------------------------------------------------
    async def view(self, http: aiohttp.ClientSession, i: int) -> dict[str, Any] | None:
        return await cluster_view(http, self.nodes[i].url, self.headers())

    async def job_ids(self, http: aiohttp.ClientSession, url: str) -> set[str] | None:
        """The ids of every job the node at ``url`` holds (all pages); None while it does not
        answer."""
        ids: set[str] = set()
        cursor = None
        while True:
            q = f"{url}/api/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            try:
                async with http.get(q, headers=self.headers()) as r:
                    if r.status != 200:
                        return None
                    page = await r.json()
            except aiohttp.ClientError:
                return None
            ids |= {j["id"] for j in page["jobs"]}
            cursor = page.get("next_cursor")
            if not cursor:
                return ids

    async def wait_leader(
        self,
        http: aiohttp.ClientSession,
        timeout: float = 30.0,
        exclude: int | None = None,
        shard: int = 0,
    ) -> int:
        """Index of the node that reports itself leader (of ``shard``) with a committed
        claim."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, n in enumerate(self.nodes):
                if i == exclude or not n.alive:
                    continue
                v = await self.view(http, i)
                if v and shard:
                    v = next((s for s in v.get("shards", ()) if s["shard"] == shard), None)
                if v and v["role"] == "leader" and v["leader"] == n.node_id:
                    return i
            await asyncio.sleep(0.1)
        raise AssertionError(f"no leader within {timeout}s\n{self.logs()}")

    async def wait_serving(self, http: aiohttp.ClientSession, timeout: float = 30.0) -> int:
        """Index of the leader, once every live node serves its API, names that leader and
        votes.  A leader can be elected by two nodes before the third's HTTP site is up, or
        before the third even heard from it (it then abstains from elections for a moment,
        seeing a peer with data): a test that then talks to any node, or cuts the leader off,
        waits for this, not only for a leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = await self.wait_leader(http, max(0.1, deadline - time.monotonic()))
            lead_id = self.nodes[leader].node_id
            views = [await self.view(http, i) for i, n in enumerate(self.nodes) if n.alive]
            if all(v is not None and v["leader"] == lead_id and _votes(v) for v in views):
                return leader
            await asyncio.sleep(0.1)
        raise AssertionError(f"not every node served within {timeout}s\n{self.logs()}")

    def view_now(self, i: int, timeout: float = 2.0) -> dict[str, Any] | None:
        """:meth:`view` without an event loop."""
        req = urllib.request.Request(self.nodes[i].url + "/api/v1/cluster", headers=self.headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data: dict[str, Any] = json.load(r)
                return data
        except (OSError, ValueError):
            return None

    def wait_formed(self, timeout: float = 30.0) -> int:
        """:meth:`wait_serving` without an event loop: the leader's index, once every live node
        serves its API, names that leader and votes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = [self.view_now(i) for i, n in enumerate(self.nodes) if n.alive]
            for v in views:
                if v is None or v["role"] != "leader" or v["leader"] != v["node_id"]:
                    continue
                if all(w is not None and w["leader"] == v["leader"] and _votes(w) for w in views):
                    return next(i for i, n in enumerate(self.nodes) if n.node_id == v["leader"])
            time.sleep(0.1)
        raise AssertionError(f"not every node served within {timeout}s\n{self.logs()}")


def _votes(view: dict[str, Any]) -> bool:
    """The node whose view this is takes part in elections (it abstains, started empty
    beside peers with data, until it has caught up with a leader)."""
    return all(n.get("voting", True) for n in view["nodes"] if n["self"])


async def cluster_view(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], timeout: float = 2.0
) -> dict[str, Any] | None:
    """``GET /api/v1/cluster`` of the node at ``url``, or None when it does not answer."""
    try:
        async with http.get(
            url + "/api/v1/cluster", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as r:
            if r.status == 200:
                data: dict[str, Any] = await r.json()
                return data
    except (aiohttp.ClientError, TimeoutError):
        pass
    return None


def run_stoppable(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)``, with SIGTERM and SIGINT cancelling it instead of killing the
    process: its ``finally`` blocks stop every node and worker it started (by PID), and then
    the process exits with 128 + the signal's number."""
    got: list[int] = []

    async def guarded() -> _T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def stop(sig: int) -> None:
            got.append(sig)
            task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig)
        return await main

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        if not got:
            raise
        print(f"stopped by {signal.Signals(got[0]).name}: every process it started is stopped")
        raise SystemExit(128 + got[0]) from None
