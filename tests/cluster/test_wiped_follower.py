"""A follower that loses its disk: SIGKILLed under a steady load of submits, everything it wrote
in its data directory deleted (the Raft journal and its state file, the snapshot, the state
database), and started again, empty.  A majority stays, so the cluster keeps its leader and
term and keeps acknowledging jobs while it is down.  The leader's log was compacted past index
1 before (small compaction thresholds), so the only way back is a whole copy of the leader's
state: the node must say that it installed one, answer, and hold every job acknowledged before
and during its absence within a bound; and the empty node, which remembers no term and no
leader, must not disturb the other two (with pre-vote, its requests are refused while they
hear from their leader)."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import SNAPSHOT_INSTALL_EVENTS, Cluster
from tests.cluster.test_power_loss import check_every_node, submitting
from tests.cluster.test_stalled_follower import _metric
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

#: small compaction thresholds: the leader compacts its log every second or 50 entries
RAFT = {"log_compaction_min_entries": 50, "log_compaction_min_time": "1s"}
BEFORE = 200  # jobs acknowledged before the follower is killed
DURING = 100  # more jobs acknowledged while it is down
REBUILD_BOUND_S = 30.0  # from its restart until it holds every job acknowledged until then
ELECTIONS = "schedd_raft_elections_started_total"


async def test_a_wiped_follower_is_rebuilt_from_a_whole_copy_and_the_leader_stays(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c", raft=dict(RAFT))
    try:
        cluster.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            leader = await cluster.wait_serving(http)
            lead_id = cluster.nodes[leader].node_id
            view = await cluster.view(http, leader)
            assert view is not None
            term = view["term"]
            wiped = (leader + 1) % cluster.size
            other = next(i for i in range(cluster.size) if i not in (leader, wiped))
            started = [await _metric(http, cluster, i, ELECTIONS) for i in (leader, other)]
            acked: list[str] = []
            async with submitting(http, cluster, acked):
                # the leader has written a snapshot and dropped the log it holds: its log no
                # longer starts at index 1, where an empty node starts
                await wait_for(lambda: len(acked) >= BEFORE, timeout=60)
                await wait_for(
                    lambda: _metric(http, cluster, leader, "schedd_raft_snapshot_duration_seconds"),
                    timeout=30,
                )
                cluster.kill(wiped)
                at_kill = len(acked)
                since = cluster.log_size(wiped)
                gone = cluster.wipe(wiped)
                assert list(cluster.data_dir(wiped).rglob("*")) == [], gone
                assert any("journal" in g for g in gone), gone
                assert any("state.db" in g for g in gone), gone
                await wait_for(lambda: len(acked) >= at_kill + DURING, timeout=60)
                absent = set(acked)  # acknowledged before and during its absence
                cluster.start(wiped)
                restarted = time.monotonic()
                await wait_for(lambda: cluster.view(http, wiped), timeout=30)  # it answers

                async def holds_all() -> bool:
                    ids = await cluster.job_ids(http, cluster.urls[wiped])
                    return ids is not None and absent <= ids

                try:
                    await wait_for(holds_all, timeout=REBUILD_BOUND_S, interval=0.1)
                except AssertionError:
                    ids = await cluster.job_ids(http, cluster.urls[wiped]) or set()
                    raise AssertionError(
                        f"{lead_id}'s follower {cluster.nodes[wiped].node_id}, wiped, holds "
                        f"{len(absent & ids)} of {len(absent)} acknowledged jobs "
                        f"{REBUILD_BOUND_S}s after its restart\n{cluster.logs()}"
                    ) from None
                rebuilt_s = time.monotonic() - restarted

                async def caught_up() -> bool:
                    theirs = await cluster.view(http, leader)
                    mine = await cluster.view(http, wiped)
                    return bool(theirs and mine and mine["applied_index"] >= theirs["commit_index"])

                await wait_for(caught_up, timeout=REBUILD_BOUND_S)
                after_restart = len(acked)
            # it was sent a whole copy of the state, not the log from index 1
            installs = cluster.log_events(wiped, SNAPSHOT_INSTALL_EVENTS, since)
            assert installs, (
                f"no {'/'.join(SNAPSHOT_INSTALL_EVENTS)} in the wiped node's log since its "
                f"restart (rebuilt in {rebuilt_s:.1f}s)\n{cluster.logs()}"
            )
            assert after_restart > len(absent)  # the cluster kept taking jobs after it came back
            await check_every_node(http, cluster, acked)
            # the other two never lost their leader for it, and it follows that leader again
            for i in range(cluster.size):
                v = await cluster.view(http, i)
                assert v is not None, i
                assert (v["term"], v["leader"]) == (term, lead_id), (i, v, cluster.logs())
            after = [await _metric(http, cluster, i, ELECTIONS) for i in (leader, other)]
            assert after == started  # no election on either of them
            assert await _metric(http, cluster, wiped, ELECTIONS) == 0  # nor on the empty node
    finally:
        cluster.stop()
