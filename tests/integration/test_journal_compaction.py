"""A snapshot's compaction of the journal is finished in the background, so a node can stop
after the snapshot is written and before the journal file is rewritten: at the next start the
file still holds the records the snapshot replaces.  pysyncobj takes a journal that does not
begin with the snapshot's last two entries for another log and discards all of it -- with it
the entries after the snapshot this node had acknowledged.  The node must drop only the head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.raft.journal import DurableJournal
from tests.conftest import start_node, wait_for
from tests.integration.test_api import get, post

COMPACT_OFTEN = {"log_compaction_min_entries": 20, "log_compaction_min_time": "1s"}


def journal_of(node: Any) -> DurableJournal:
    journal = node.rt.node._obj._SyncObj__raftLog
    assert isinstance(journal, DurableJournal)
    return journal


async def test_a_restart_after_an_unfinished_compaction_keeps_the_entries_after_the_snapshot(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "n1"
    # The copy never starts: the file keeps its head, as after a stop before the rename.
    monkeypatch.setattr(DurableJournal, "_start_compaction", lambda self: None)
    node = await start_node(data, raft=COMPACT_OFTEN)
    try:
        for _ in range(30):
            await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
        await wait_for(lambda: node.rt.node.snapshots.last_index is not None, timeout=20)
        after = []
        for _ in range(5):
            status, body = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
            assert status == 201
            after.append(body["id"])
    finally:
        await node.rt.stop()
    journal = journal_of(node)
    kept = list(journal[:])  # the log as the node had it: from the snapshot's entries on
    head = DurableJournal(journal.path)
    on_disk = list(head[:])
    head._destroy()
    assert len(on_disk) > len(kept) and on_disk[-len(kept) :] == kept  # the head is still there

    monkeypatch.undo()
    node = await start_node(data)  # compacts rarely: the log at start is what the node kept
    try:
        restarted = list(journal_of(node)[:])
        # The log goes on from the snapshot's entries, as kept: from where kept began, or from
        # a later snapshot, one the node finished writing as it stopped (no entry missing).
        first = restarted[0][1]
        assert kept[0][1] <= first <= kept[-1][1]
        tail = [entry for entry in kept if entry[1] >= first]
        assert restarted[: len(tail)] == tail
        for job_id in after:
            status, _ = await get(http, node, f"/jobs/{job_id}")
            assert status == 200
    finally:
        await node.rt.stop()


async def test_a_clean_stop_leaves_the_journal_closed_with_every_entry_on_disk(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The process may exit as soon as the runtime's stop returns: by then the tick thread has
    closed the journal, and what the node holds in memory is what the file holds."""
    node = await start_node(tmp_path / "n1")
    try:
        for _ in range(10):
            status, _ = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
            assert status == 201
    finally:
        await node.rt.stop()
    assert not node.rt.node._obj.tick_thread_alive()
    journal = journal_of(node)
    again = DurableJournal(journal.path)
    try:
        assert list(again[:]) == list(journal[:])
        assert again.getRaftCommitIndex() == journal.getRaftCommitIndex() > 0
    finally:
        again._destroy()
