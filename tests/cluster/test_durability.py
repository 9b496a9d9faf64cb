"""Journal damage on one node after all three are killed: the damaged node cuts its journal at
the damage, says so in its log, starts, abstains from elections until it has re-synced from the
leader, and no acknowledged job is lost on any node (durability)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import pytest

from schedd.raft.journal import scan
from tests.cluster.harness import Cluster
from tests.cluster.test_failover import submit
from tests.cluster.test_restart import all_visible
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def damage(journal: Path) -> int:
    """Flip a byte in a record two thirds in and tear the last record; returns the offset of
    the damaged record."""
    data = bytearray(journal.read_bytes())
    with memoryview(bytes(data)) as buf:
        entries, ends, found = scan(buf)
    assert found is None and len(entries) > 20, "expected a clean journal with the jobs in it"
    victim = len(ends) * 2 // 3
    start = ends[victim - 1]
    data[start + 20] ^= 0x01  # inside the record's index/term/command
    del data[ends[-1] - 7 :]  # torn tail: the last record loses its end
    journal.write_bytes(bytes(data))
    return start


async def test_damaged_journal_is_cut_and_resynced_without_losing_acknowledged_jobs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "c"
    cluster = Cluster(root)
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            acked = [
                await submit(http, cluster, {"task": "acc.record", "schedule": {"in": "1h"}})
                for _ in range(40)
            ]
            # Cutting synced records is only survivable while the other nodes hold them: wait
            # until every node has every job (a node can lag for seconds after the start).
            for url in cluster.urls:
                await wait_for(lambda u=url: all_visible(http, cluster, u, acked), timeout=20)
            await asyncio.sleep(2)  # and each node has stored its commit index (1 s timer)
            for i in range(3):
                cluster.kill(i, signal.SIGKILL)
            journal = root / "n1" / "raft" / "raft.journal"
            offset = damage(journal)
            cluster.start()
            await cluster.wait_leader(http)
            for url in cluster.urls:  # every node, the damaged one included, has every job
                await wait_for(lambda u=url: all_visible(http, cluster, u, acked), timeout=20)
            fresh = await submit(http, cluster, {"task": "acc.record", "schedule": {"in": "1h"}})
            await wait_for(lambda: all_visible(http, cluster, cluster.urls[0], [fresh]), timeout=10)
        log = (root / "n1.log").read_text(errors="replace")
        [line] = [ln for ln in log.splitlines() if "raft.journal_truncated" in ln]
        assert f"offset={offset}" in line and "checksum mismatch" in line, line
        # It had acknowledged what it lost: no votes from it until it had them back.
        assert "lost_acknowledged=true" in line, line
        assert "raft.journal_caught_up" in log.split(line, 1)[1]
        assert list((root / "n1" / "raft").glob("raft.journal.dropped.*"))
        with memoryview(journal.read_bytes()) as buf:
            assert scan(buf)[2] is None  # clean again after the re-sync
    finally:
        cluster.stop()
