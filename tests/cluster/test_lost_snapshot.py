"""A node whose compaction marker (raft.dump) and state database were moved away, its compacted
journal left behind: it used to start, apply nothing and stay behind for good without a word.
It must refuse to start, naming the file and what to do."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.members import Load, exit_status
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


async def test_a_compacted_journal_without_its_snapshot_is_refused(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path / "c",
        size=1,
        raft={"log_compaction_min_entries": 20, "log_compaction_min_time": "1s"},
    )
    try:
        cluster.start()
        raft = cluster.data_dir(0) / "raft"
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            load = Load(http, cluster, [0])
            async with load.running(clients=2):
                await load.more(100)
                await wait_for(lambda: (raft / "raft.dump").exists(), timeout=30)
        cluster.kill(0, signal.SIGTERM)
        assert exit_status(cluster, 0) == 0
        moved = tmp_path / "moved"
        moved.mkdir()
        for path in raft.iterdir():
            if path.name == "raft.dump" or path.name.startswith("state.db"):
                path.rename(moved / path.name)
        cluster.start(0)
        assert exit_status(cluster, 0) == 2
        log = cluster.nodes[0].log.read_text()
        assert "raft.dump: missing, and the Raft journal beside it starts at index" in log, log
        assert "the journal included" in log
    finally:
        cluster.stop()
