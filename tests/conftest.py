"""Shared fixtures: free ports below 32768, in-process one-node clusters, HTTP clients."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.auth import ensure_admin_token
from schedd.config import load_config

_used: set[int] = set()


def free_port(count: int = 2) -> int:
    """A free TCP port below the ephemeral range (docs/pysyncobj.md #14), with the ``count``
    - 1 ports after it free too (a node's HTTP port, then its Raft port for each shard)."""
    for _ in range(200):
        port = random.randrange(20000, 32000 - count)
        block = range(port, port + count)
        if any(p in _used for p in block):
            continue
        try:
            with contextlib.ExitStack() as stack:
                for p in block:
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", p))
        except OSError:
            continue
        _used.update(block)
        return port
    raise RuntimeError(f"no {count} free ports in a row found")


@dataclass
class Node:
    rt: Any
    url: str
    token: str
    data_dir: Path

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


async def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy; fail on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def start_node(
    tmp: Path,
    limits: dict[str, Any] | None = None,
    raft: dict[str, Any] | None = None,
    history: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
    **scheduler: Any,
) -> Node:
    from schedd.runtime import Runtime

    port = free_port()
    overrides: dict[str, object] = {
        "node.data_dir": str(tmp),
        "http.listen": f"127.0.0.1:{port}",
        "raft.listen": f"127.0.0.1:{port + 1}",
    }
    overrides.update({f"scheduler.{k}": v for k, v in scheduler.items()})
    overrides.update({f"limits.{k}": v for k, v in (limits or {}).items()})
    overrides.update({f"raft.{k}": v for k, v in (raft or {}).items()})
    overrides.update({f"history.{k}": v for k, v in (history or {}).items()})
    overrides.update({f"http.{k}": v for k, v in (api or {}).items()})
    cfg = load_config(None, env={}, overrides=overrides)
    token, _ = ensure_admin_token(cfg.tokens_path)
    rt = Runtime(cfg)
    await rt.start()
    try:
        await wait_for(lambda: rt.leader is not None and rt.leader.ready.is_set(), timeout=15)
    except BaseException:  # stopped here: its threads must not outlive the failed test
        await rt.stop()
        raise
    return Node(rt, f"http://127.0.0.1:{port}", token, tmp)


@asynccontextmanager
async def running_node(tmp: Path, **settings: Any) -> AsyncIterator[Node]:
    """A node started as :func:`start_node` starts it, stopped on the way out."""
    n = await start_node(tmp, **settings)
    try:
        yield n
    finally:
        await n.rt.stop()


@pytest.fixture
async def lazy_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Node]:
    """A node whose own commands (fires, leases, a worker's result) stay invisible to its API's
    reads for the whole test: LAZY_COMMIT_S longer than the test, so only a client's command
    (or a read that asks for an index, or a snapshot, or the end) commits them."""
    from schedd.raft import node as raft_node

    monkeypatch.setattr(raft_node, "LAZY_COMMIT_S", 3600.0)
    async with running_node(tmp_path / "n1", dispatch_ahead="0s") as n:
        yield n


async def restart_leader_in_new_term(rt: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make a single node's role watcher see it still leading but in a later term (what a
    leader -> follower -> leader flap, or a failover, looks like from there) and wait until it
    has started a new leader with a new claim; returns the old leader."""
    from schedd.raft.node import RaftNode

    old_leader = rt.leader
    real_term = RaftNode.term.fget  # type: ignore[attr-defined]
    monkeypatch.setattr(RaftNode, "term", property(lambda self: real_term(self) + 5))
    rt._role_changed.set()
    await wait_for(
        lambda: rt.leader is not None and rt.leader is not old_leader and rt.leader.ready.is_set(),
        timeout=10,
    )
    return old_leader


@pytest.fixture
def timed_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the worker processes a test starts append each execution of ``acc.record``
    to (tests/acceptance/tasks.py: run id, fence, attempt and the wall-clock ms)."""
    path = tmp_path / "executions.txt"
    path.touch()
    monkeypatch.setenv("SCHEDD_TEST_RECORD", str(path))
    monkeypatch.setenv("SCHEDD_TEST_RECORD_TIME", "1")
    return path


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path / "n1") as n:
        yield n


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(autouse=True)
def own_entries_decode_alike(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A node applies the entries it encoded itself from the commands it held, not decoding
    them again (``_StateMachine.own``): that is right only while those commands equal what
    decoding gives (what every other node applies).  Every in-process node checks it for
    every entry; a test fails on any difference."""
    from schedd.core import commands
    from schedd.raft import node as raft_node

    real = raft_node.apply_entry
    differ: list[str] = []

    def checked(state: Any, blob: object, index: int, **kw: Any) -> Any:
        held = kw.get("decoded")
        if held is not None and (decoded := commands.decode_entry(blob)) != held:
            differ.append(f"entry {index}: held {held!r}, decoded {decoded!r}")
        return real(state, blob, index, **kw)

    monkeypatch.setattr(raft_node, "apply_entry", checked)
    yield
    assert not differ, differ[:3]
