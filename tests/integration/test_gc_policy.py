"""A running node freezes its long-lived objects on schedule (node.gc_freeze_interval) and
exports its collections: the wiring of schedd/gcpolicy.py into the runtime, on a real node."""

from __future__ import annotations

import gc
from pathlib import Path

import aiohttp

from schedd.auth import ensure_admin_token
from schedd.config import load_config
from schedd.runtime import Runtime
from tests.conftest import Node, free_port, wait_for
from tests.integration.test_metrics import scrape


async def start(tmp: Path, freeze: str) -> Node:
    port = free_port()
    cfg = load_config(
        None,
        env={},
        overrides={
            "node.data_dir": str(tmp),
            "node.gc_freeze_interval": freeze,
            "http.listen": f"127.0.0.1:{port}",
            "raft.listen": f"127.0.0.1:{port + 1}",
        },
    )
    token, _ = ensure_admin_token(cfg.tokens_path)
    rt = Runtime(cfg)
    await rt.start()
    await wait_for(lambda: rt.leader is not None and rt.leader.ready.is_set(), timeout=15)
    return Node(rt, f"http://127.0.0.1:{port}", token, tmp)


async def test_a_node_freezes_on_schedule_and_exports_its_collections(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    gc.unfreeze()
    node = await start(tmp_path / "n1", "100ms")
    try:

        async def frozen() -> bool:
            m = await scrape(http, node)
            return m[("schedd_gc_frozen_objects", ())] > 0

        await wait_for(frozen, timeout=10)
        gc.collect()  # timed by the node's hook like any other collection
        m = await scrape(http, node)
        assert m[("schedd_gc_pause_seconds_count", (("generation", "2"),))] >= 1
    finally:
        await node.rt.stop()
        gc.unfreeze()
    assert node.rt.gc is not None and node.rt.gc._callback not in gc.callbacks


async def test_freezing_can_be_turned_off(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    gc.unfreeze()
    node = await start(tmp_path / "n1", "0s")
    try:
        await wait_for(lambda: node.rt._gc_task is not None and node.rt._gc_task.done(), timeout=5)
        m = await scrape(http, node)
        assert m[("schedd_gc_frozen_objects", ())] == 0
    finally:
        await node.rt.stop()
