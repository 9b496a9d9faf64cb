"""pysyncobj 0.3.17 let a follower "commit" its own divergent entries on a snapshot message (no
log-matching check on that path), so a deposed leader acknowledged client writes that the
snapshot it then loaded did not have (the fault suite's seed 3017).  ``guard_snapshot_commit``
keeps the commit index unless the snapshot is installed.  A real SyncObj, ticked by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf

from schedd.raft.patches import guard_snapshot_commit
from tests.conftest import free_port


def follower_with_own_entries(tmp_path: Path) -> SyncObj:
    """A node in term 3 whose log holds entries 2..10 of its own (term 3), committed up to 1:
    what a leader cut off from its followers is left with after it stepped down."""
    ports = [free_port() for _ in range(3)]
    conf = SyncObjConf(
        autoTick=False, journalFile=str(tmp_path / "j"), fullDumpFile=str(tmp_path / "d")
    )
    obj = SyncObj(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1:]], conf)
    obj._SyncObj__raftCurrentTerm = 3
    for idx in range(2, 11):
        obj._SyncObj__raftLog.add(b"\x01", idx, 3)
    assert obj._SyncObj__raftCommitIndex == 1
    return obj


def snapshot_chunk(term: int, commit_index: int) -> dict[str, Any]:
    # what the leader sends while its snapshot is being written (serialized=None) or in chunks
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit_index,
        "serialized": None,
    }


def deliver(obj: SyncObj, message: dict[str, Any]) -> None:
    node = next(iter(obj._SyncObj__otherNodes))
    obj._SyncObj__transport._onMessageReceivedCallback(node, message)


def test_unguarded_pysyncobj_commits_a_followers_own_entries_on_a_snapshot_chunk(
    tmp_path: Path,
) -> None:
    obj = follower_with_own_entries(tmp_path)
    try:
        deliver(obj, snapshot_chunk(term=3, commit_index=50))
        # the bug this guards against (if pysyncobj fixes it, this test says so)
        assert obj._SyncObj__raftCommitIndex == 10
    finally:
        obj.destroy()


@pytest.mark.parametrize("term", [3, 4])
def test_guard_keeps_the_commit_index_until_the_snapshot_is_installed(
    tmp_path: Path, term: int
) -> None:
    obj = follower_with_own_entries(tmp_path)
    try:
        guard_snapshot_commit(obj)
        deliver(obj, snapshot_chunk(term=term, commit_index=50))
        assert obj._SyncObj__raftCommitIndex == 1
        assert obj._SyncObj__raftLastApplied == 1
        # a regular append from the same leader still moves it, after the log-matching check
        deliver(
            obj,
            {
                "type": "append_entries",
                "term": term,
                "commit_index": 5,
                "entries": [],
                "prevLogIdx": 5,
                "prevLogTerm": 3,
            },
        )
        assert obj._SyncObj__raftCommitIndex == 5
    finally:
        obj.destroy()
