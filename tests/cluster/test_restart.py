"""Kill -9 of every node at once, then a restart from snapshot + journal: every acknowledged job
is still there on every node, pending ones still fire, and the cluster takes new work."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.test_failover import record as record  # fixture
from tests.cluster.test_failover import runs_of, submit, wait_states
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


async def all_visible(
    http: aiohttp.ClientSession, cluster: Cluster, url: str, ids: list[str]
) -> bool:
    have = await cluster.job_ids(http, url)
    return have is not None and set(ids) <= have


async def test_all_nodes_killed_and_restarted_lose_nothing(tmp_path: Path, record: Path) -> None:
    # Tiny compaction threshold: the restart goes through a snapshot (dump) plus the journal.
    cluster = Cluster(
        tmp_path / "c", raft={"log_compaction_min_entries": 20, "log_compaction_min_time": "1s"}
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            later = [
                await submit(http, cluster, {"task": "acc.record", "schedule": {"in": "6s"}})
                for _ in range(30)
            ]
            far = [
                await submit(http, cluster, {"task": "acc.record", "schedule": {"in": "1h"}})
                for _ in range(30)
            ]
            # the restart must go through a snapshot: wait until one is written (in the background)
            await wait_for(
                lambda: any(
                    (tmp_path / "c" / f"n{i}" / "raft" / "raft.dump").exists() for i in (1, 2, 3)
                ),
                timeout=30,
            )
            for i in range(3):
                cluster.kill(i, signal.SIGKILL)
            cluster.start()
            await cluster.wait_leader(http)
            for url in cluster.urls:  # every node, once it has caught up, has every job
                await wait_for(lambda u=url: all_visible(http, cluster, u, later + far), timeout=20)
            cluster.start_worker("--import", "tests.acceptance.tasks")
            await wait_states(http, cluster, later, {"succeeded"}, timeout=60)
            fresh = await submit(http, cluster, {"task": "acc.record"})
            await wait_states(http, cluster, [fresh], {"succeeded"}, timeout=30)
            for j in far:
                assert (await runs_of(http, cluster, j))[0]["state"] == "scheduled"
        assert len(record.read_text().splitlines()) == len(later) + 1
    finally:
        cluster.stop()
