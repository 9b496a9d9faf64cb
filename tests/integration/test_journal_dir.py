"""raft.journal_dir: a node keeps its Raft journal (the log, its term and vote) in the directory
it names instead of ``<node.data_dir>/raft``, and comes back from it after a restart."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.conftest import start_node
from tests.integration.test_api import get, post

#: no compaction while the test runs: the log at the restart is all the node wrote
NO_COMPACTION = {"log_compaction_min_entries": 1_000_000, "log_compaction_min_time": "1h"}


async def test_the_journal_lives_in_journal_dir_and_survives_a_restart(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    data, journal_dir = tmp_path / "n1", tmp_path / "disk2" / "journal"
    raft = {**NO_COMPACTION, "journal_dir": str(journal_dir)}
    node = await start_node(data, raft=raft)
    try:
        assert node.rt.node.journal.path == str(journal_dir / "raft.journal")
        ids = []
        for _ in range(5):
            status, body = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
            assert status == 201
            ids.append(body["id"])
        term = node.rt.node.term
        last = node.rt.node.journal[-1][1]
    finally:
        await node.rt.stop()
    assert sorted(p.name for p in journal_dir.iterdir()) == ["raft.journal", "raft.journal.state"]
    assert not list((data / "raft").glob("raft.journal*"))  # nothing of it beside the state
    assert (data / "raft" / "state.db").exists()

    node = await start_node(data, raft=raft)
    try:
        journal = node.rt.node.journal
        # the log read back from journal_dir, from its first entry to the last one written
        assert journal.path == str(journal_dir / "raft.journal")
        assert journal[0][1] <= 2 and journal[-1][1] >= last
        # the term came back from raft.journal.state there: the node was elected in a later one
        assert node.rt.node.term > term
        for job_id in ids:
            status, _ = await get(http, node, f"/jobs/{job_id}")
            assert status == 200
    finally:
        await node.rt.stop()
    assert not list((data / "raft").glob("raft.journal*"))
