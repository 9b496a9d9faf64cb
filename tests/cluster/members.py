"""Membership changes on the harness's real clusters: a node added beside a running cluster,
the membership as a node reports it, a steady load of submits with what it acknowledged and
how long each took, and the checks that every member holds every acknowledged job."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from tests.cluster.harness import BIN, Cluster, NodeProc, _toml
from tests.conftest import free_port, wait_for

NODES = "/api/v1/cluster/nodes"


def new_node(
    cluster: Cluster,
    node_id: str,
    raft: dict[str, Any],
    host: str = "127.0.0.1",
    launch: list[str] | None = None,
    port: int | None = None,
    scheduler: dict[str, Any] | None = None,
    shards: int = 1,
) -> int:
    """A node config beside the cluster's (not started); its index in ``cluster.nodes``.
    ``host`` is the address it listens on, ``launch`` the command prefix it starts with (a
    network namespace's, tests/cluster/netns.py) and ``port`` its HTTP port (its Raft port is
    the next one; a free one below 32768 by default); ``scheduler``, its [scheduler] keys (the
    cluster's, for a node that may lead it); ``shards``, its ``cluster.shards`` (shard k's
    Raft port is the Raft port + k)."""
    if port is None:
        port = free_port(1 + shards)
        while port + shards >= 32768:
            port = free_port(1 + shards)
    cfg = cluster.root / f"{node_id}.toml"
    extra = "".join(f"{k} = {_toml(v)}\n" for k, v in raft.items())
    sched = "".join(f"{k} = {_toml(v)}\n" for k, v in (scheduler or {}).items())
    cfg.write_text(
        f'[node]\nid = "{node_id}"\ndata_dir = "{cluster.root / node_id}"\n'
        f'[http]\nlisten = "{host}:{port}"\n'
        f'[raft]\nlisten = "{host}:{port + 1}"\n{extra}'
        f'[auth]\ntokens_file = "{cluster.root / "tokens.toml"}"\n'
        + (f"[scheduler]\n{sched}" if sched else "")
        + (f"[cluster]\nshards = {shards}\n" if shards > 1 else "")
    )
    if cluster.hosts:
        cluster.hosts.append(host)
    if cluster.launch:
        cluster.launch.append(list(launch or []))
    node = NodeProc(node_id, port, port + 1, cfg, cluster.root / f"{node_id}.log", host=host)
    cluster.nodes.append(node)
    return len(cluster.nodes) - 1


def raft_addr(cluster: Cluster, i: int) -> str:
    return f"{cluster.nodes[i].host}:{cluster.nodes[i].raft_port}"


async def call(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    i: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.request(
        method,
        cluster.nodes[i].url + path,
        data=None if body is None else orjson.dumps(body),
        headers=cluster.headers() if headers is None else headers,
        timeout=aiohttp.ClientTimeout(total=30),
    ) as r:
        return r.status, await r.json()


async def members(
    http: aiohttp.ClientSession, cluster: Cluster, i: int, shard: int | None = None
) -> dict[str, Any] | None:
    """Node i's ``GET /cluster/nodes`` (of shard ``shard``'s group: its Raft addresses are the
    nodes' Raft ports + ``shard``; None: the node's first shard)."""
    headers = None if shard is None else {**cluster.headers(), "X-Schedd-Shard": str(shard)}
    try:
        status, body = await call(http, cluster, i, "GET", NODES, headers=headers)
    except (aiohttp.ClientError, TimeoutError):
        return None
    return body if status == 200 else None


async def voters(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> set[str] | None:
    view = await members(http, cluster, i)
    if view is None:
        return None
    return {n["raft"] for n in view["nodes"] if n["role"] == "voter"}


async def leader_of(http: aiohttp.ClientSession, cluster: Cluster, among: list[int]) -> int:
    async def find() -> int | None:
        for i in among:
            view = await cluster.view(http, i)
            if view and view["role"] == "leader" and view["leader"] == cluster.nodes[i].node_id:
                return i + 1  # (truthy)
        return None

    return int(await wait_for(find, timeout=30, interval=0.1)) - 1


class Load:
    """Clients submitting one job at a time to the live members, round robin; acknowledged
    ids and each submit's latency are kept."""

    def __init__(self, http: aiohttp.ClientSession, cluster: Cluster, targets: list[int]):
        self.http, self.cluster, self.targets = http, cluster, targets
        self.acked: list[str] = []
        self.latency: list[tuple[float, float]] = []  # (when, seconds)

    async def client(self, stop: asyncio.Event, k: int) -> None:
        i = k
        while not stop.is_set():
            target = self.targets[i % len(self.targets)]
            body = {"task": "acc.record", "schedule": {"in": "1h"}, "payload": {"k": k}}
            started = time.monotonic()
            try:
                async with self.http.post(
                    self.cluster.nodes[target].url + "/api/v1/jobs",
                    data=orjson.dumps(body),
                    headers=self.cluster.headers(),
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    if r.status == 201:
                        self.acked.append(str((await r.json())["id"]))
                        self.latency.append((started, time.monotonic() - started))
                        continue
            except (aiohttp.ClientError, TimeoutError):
                pass
            i += 1
            await asyncio.sleep(0.05)

    @contextlib.asynccontextmanager
    async def running(self, clients: int = 4) -> AsyncIterator[None]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(self.client(stop, k)) for k in range(clients)]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def more(self, n: int, timeout: float = 60) -> None:
        target = len(self.acked) + n
        await wait_for(lambda: len(self.acked) >= target, timeout=timeout)


async def wait_voter(
    http: aiohttp.ClientSession, cluster: Cluster, leader: int, new: int, timeout: float = 90
) -> float:
    """Seconds until node ``new`` is a voter in the leader's membership."""
    started = time.monotonic()
    addr = raft_addr(cluster, new)

    async def promoted() -> bool:
        vs = await voters(http, cluster, leader)
        return vs is not None and addr in vs

    try:
        await wait_for(promoted, timeout=timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(f"{addr} not promoted in {timeout}s\n{cluster.logs()}") from None
    return time.monotonic() - started


async def check_members_hold(
    http: aiohttp.ClientSession, cluster: Cluster, live: list[int], acked: list[str]
) -> None:
    """Every acknowledged job on every live member, and the same jobs everywhere."""
    want = set(acked)
    sets = []
    for i in live:
        url = cluster.nodes[i].url

        async def complete(u: str = url) -> set[str] | None:
            ids = await cluster.job_ids(http, u)
            return ids if ids is not None and want <= ids else None

        try:
            sets.append(await wait_for(complete, timeout=60, interval=0.2))
        except AssertionError:
            ids = await cluster.job_ids(http, url) or set()
            raise AssertionError(
                f"{url} lacks {len(want - ids)} of {len(want)} acknowledged jobs\n{cluster.logs()}"
            ) from None
    assert len(acked) == len(want), "a job id was acknowledged twice"

    async def same() -> bool:
        now = [await cluster.job_ids(http, cluster.nodes[i].url) for i in live]
        return all(s is not None and s == now[0] for s in now)

    await wait_for(same, timeout=30, interval=0.2)


async def run(
    program: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """One of this installation's programs (``schedd``, ``schedctl``): its exit status and its
    output (stdout and stderr); ``env``: more environment variables."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / program),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    return int(proc.returncode or 0), out.decode()


async def schedctl(cluster: Cluster, i: int, *args: str, json: bool = True) -> tuple[int, str]:
    """``schedctl`` against node i: its exit status and output."""
    server = ("--server", cluster.nodes[i].url, "--token", cluster.token)
    return await run("schedctl", *server, *args, *(("-o", "json") if json else ()), timeout=30)


def exit_status(cluster: Cluster, i: int, timeout: float = 30) -> int:
    proc = cluster.nodes[i].proc
    assert proc is not None
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    code = proc.poll()
    assert code is not None, f"{cluster.nodes[i].node_id} did not stop\n{cluster.logs()}"
    return code
