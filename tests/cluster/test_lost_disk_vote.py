"""A node that lost its disk must not help elect a leader that lacks what it had acknowledged.

Raft's safety rests on each voter remembering its vote and its log.  A node whose data
directory is lost comes back remembering nothing: in the textbook case its vote elects a stale
candidate.  Here: a follower B is stopped while the leader A and the other follower C commit
jobs (acknowledged on A and C only); C loses its disk and comes back empty; A dies; B resumes.
B and C form a majority, and B's log lacks every job acknowledged while it was stopped.
Granting B its vote, the empty C would make it leader and those jobs would be gone when A
returns (its log is overwritten by the new leader's).

The empty C abstains instead (``DurableJournal.abstain_as_new``: it started empty, and its
peers' hellos say they hold data): no leader while only B and C are up; once A is back, A is elected (B and A), C is rebuilt from a copy, and every
acknowledged job is on every node.  The same run with the guard removed (a sitecustomize in
the node processes) elects B within the same window: the hazard is real, and the test sees it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import REPO, Cluster
from tests.cluster.test_power_loss import check_every_node, submitting
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240), pytest.mark.long]

RAFT = {"log_compaction_min_entries": 50, "log_compaction_min_time": "1s"}
#: raft_max_timeout is 2 s by default: a candidate would have won within a few of them
NO_LEADER_WINDOW_S = 8.0

SITE_NO_GUARD = """\
import schedd.raft.journal as journal
journal.DurableJournal.abstain_as_new = lambda self, peer="": None  # the guard removed
"""


async def leaders(http: aiohttp.ClientSession, cluster: Cluster, among: list[int]) -> list[int]:
    out = []
    for i in among:
        view = await cluster.view(http, i)
        if view is not None and view.get("role") == "leader":
            out.append(i)
    return out


@pytest.mark.parametrize(
    "guard",
    [True, pytest.param(False, marks=pytest.mark.long)],  # the control: the hazard, unguarded
    ids=["guarded", "unguarded"],
)
async def test_a_node_back_from_a_lost_disk_does_not_elect_a_stale_leader(
    tmp_path: Path, guard: bool
) -> None:
    env = {}
    if not guard:
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITE_NO_GUARD)
        env["PYTHONPATH"] = f"{site}{os.pathsep}{REPO}"
    cluster = Cluster(tmp_path / "c", raft=dict(RAFT), env=env)
    try:
        cluster.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            a = await cluster.wait_serving(http)
            b, c = (a + 1) % 3, (a + 2) % 3
            acked: list[str] = []
            async with submitting(http, cluster, acked):
                await wait_for(lambda: len(acked) >= 50, timeout=60)
                cluster.kill(b, signal.SIGSTOP)  # B falls behind
                stopped_at = len(acked)
                await wait_for(lambda: len(acked) >= stopped_at + 100, timeout=60)
                cluster.kill(c)  # C loses its disk ...
            only_on_a_and_c = acked[stopped_at:]
            cluster.wipe(c)
            cluster.kill(a)  # ... and A dies
            since = cluster.log_size(c)
            cluster.kill(b, signal.SIGCONT)
            cluster.start(c)  # C comes back empty
            await wait_for(lambda: cluster.view(http, c), timeout=30)
            deadline = time.monotonic() + NO_LEADER_WINDOW_S
            elected: list[int] = []
            while time.monotonic() < deadline and not elected:
                elected = await leaders(http, cluster, [b, c])
                await asyncio.sleep(0.2)
            if not guard:
                # the hazard: B, which lacks the jobs acknowledged while it was stopped, leads
                assert elected == [b], f"expected B elected without the guard\n{cluster.logs()}"
                return
            assert elected == [], f"a leader without A: {elected}\n{cluster.logs()}"
            assert cluster.log_events(c, ("raft.journal_abstains",), since), cluster.logs()
            view = await cluster.view(http, c)  # the operator sees it abstain
            assert view is not None and [n["voting"] for n in view["nodes"] if n["self"]] == [False]
            cluster.start(a)  # A returns: A (with B's vote) leads, C is rebuilt
            assert await cluster.wait_leader(http, timeout=60) == a
            await check_every_node(http, cluster, acked, timeout=90)
            assert only_on_a_and_c  # (not vacuous)
            # and C, caught up, votes again: it logged that it caught up
            await wait_for(
                lambda: cluster.log_events(c, ("raft.journal_caught_up",), since), timeout=30
            )
            view = await cluster.view(http, c)
            assert view is not None and [n["voting"] for n in view["nodes"] if n["self"]] == [True]
    finally:
        cluster.stop()
