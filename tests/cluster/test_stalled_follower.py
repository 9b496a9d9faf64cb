"""docs/pysyncobj.md #6: after a leader pause under load, the paused node comes back as a
follower whose replication live-locks.  The new leader must notice and recover it within
seconds, not at its next log compaction (``log_compaction_min_time``: 300 s here, so that
nothing but the recovery in schedd/raft/node.py can help; 10 s by default).

How the stall arises (pysyncobj 0.3.17): the paused leader holds a tail of ``D`` entries of its
term that it appended but never sent; its log ends at ``F``.  The new leader's ``nextIndex``
for it ran ahead while their connection was dying (the pause is longer than pysyncobj's
3.5 s ``connectionTimeout``), so after SIGCONT the old leader answers "no such prevLogIdx" with
``reset, next = F + 1``.  The probe at ``F`` fails on the term (``reset, next = F``), but the
leader pipelines the rest of its log behind each probe (several 64 KiB append_entries per
round) and each of those is answered ``reset, next = F + 1`` again: the last answer wins, so
``nextIndex`` never gets below ``F``, the match index stays 0, the connection is healthy and
the follower's election timer is fed, until a snapshot is sent.

With the natural tail (the entries appended in the last append period before SIGSTOP, often
``D`` = 2..7) the stall happened in about half of the runs; a lucky interleaving of responses
lets ``D`` = 2 escape.  To make it certain, the leader's outgoing Raft frames are dropped by
the proxy for 0.2 s (less than the followers' election timeout) just before the pause while
submissions keep arriving, one entry each: ``D`` was about 25, and without the recovery every
run stalled (the paused node never applied another entry before the test gave up).
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150), pytest.mark.long]

PAUSE = 5.0  # > pysyncobj's connectionTimeout (3.5 s): the connections die during the pause
UNSENT = 0.2  # the leader's frames are dropped this long before the pause (< raft_min_timeout)
RECOVERY_BOUND = 10.0  # from SIGCONT until the paused node has applied the leader's commit index


async def _post(http: aiohttp.ClientSession, cluster: Cluster, i: int, body: bytes) -> None:
    try:
        async with http.post(
            cluster.nodes[i].url + "/api/v1/jobs",
            data=body,
            headers=cluster.headers(),
            timeout=aiohttp.ClientTimeout(total=3),
        ) as r:
            await r.read()
    except (aiohttp.ClientError, TimeoutError):
        pass


async def _metric(http: aiohttp.ClientSession, cluster: Cluster, i: int, name: str) -> float:
    """Sum of every sample of ``name`` on node i (0 when absent or unreachable)."""
    try:
        async with http.get(
            cluster.nodes[i].url + "/metrics",
            headers=cluster.headers(),
            timeout=aiohttp.ClientTimeout(total=2),
        ) as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


async def test_raft_follower_stalled_by_a_leader_pause_catches_up_within_seconds(
    tmp_path: Path,
) -> None:
    cluster = Cluster(
        tmp_path / "c",
        proxied=True,
        raft={"log_compaction_min_entries": 1_000_000, "log_compaction_min_time": "300s"},
    )
    stop = asyncio.Event()
    submitted = [0, 0]  # accepted, failed
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_serving(http)  # every node votes: the pause leaves a majority
            body = orjson.dumps({"task": "acc.record", "schedule": {"in": "1h"}})

            async def load(k: int) -> None:
                while not stop.is_set():
                    url = cluster.urls[k % len(cluster.urls)]
                    try:
                        async with http.post(
                            url + "/api/v1/jobs",
                            data=body,
                            headers=cluster.headers(),
                            timeout=aiohttp.ClientTimeout(total=3),
                        ) as r:
                            await r.read()
                            submitted[0 if r.status == 201 else 1] += 1
                            if r.status != 201:
                                await asyncio.sleep(0.05)
                    except (aiohttp.ClientError, TimeoutError):
                        submitted[1] += 1
                        await asyncio.sleep(0.05)

            loaders = [asyncio.create_task(load(k)) for k in range(24)]
            await wait_for(lambda: submitted[0] >= 300, timeout=30, interval=0.1)

            # The leader appends what it is sent but its frames go nowhere, then it stops.
            leader = await cluster.wait_leader(http)  # (it may have changed under load)
            before = await cluster.view(http, leader)
            assert before is not None
            for i in range(cluster.size):
                if i != leader:
                    cluster.net.cut_one_way(leader, i)
            # Submissions spread over the window: each becomes an entry of its own, none commits.
            unsent = []
            for _ in range(int(UNSENT / 0.01)):
                unsent.append(asyncio.create_task(_post(http, cluster, leader, body)))
                await asyncio.sleep(0.01)
            cluster.kill(leader, signal.SIGSTOP)
            paused = time.monotonic()
            cluster.net.heal()
            # Paused until the others have elected a leader (on a busy machine that can take
            # longer than usual), and at least PAUSE, so that its connections die meanwhile.
            await cluster.wait_leader(http, timeout=30, exclude=leader)
            await asyncio.sleep(max(0.0, PAUSE - (time.monotonic() - paused)))
            cluster.kill(leader, signal.SIGCONT)
            resumed = time.monotonic()

            # The load goes on for a while after the pause, then stops; the paused node must
            # have applied everything the leader committed well before any compaction.
            await asyncio.sleep(3)
            stop.set()
            await asyncio.gather(*loaders, *unsent)
            new_leader = await cluster.wait_leader(http, timeout=10)
            caught_up = None
            trace: list[tuple[float, int, int, str]] = []
            while time.monotonic() < resumed + RECOVERY_BOUND:
                lv, fv = await asyncio.gather(
                    cluster.view(http, new_leader), cluster.view(http, leader)
                )
                if lv is not None and fv is not None:
                    trace.append(
                        (
                            round(time.monotonic() - resumed, 1),
                            lv["commit_index"],
                            fv["applied_index"],
                            fv["role"],
                        )
                    )
                    if lv["role"] == "leader" and fv["applied_index"] >= lv["commit_index"]:
                        caught_up = time.monotonic() - resumed
                        break
                await asyncio.sleep(0.2)
            recoveries = await _metric(
                http, cluster, new_leader, "schedd_raft_follower_stall_recoveries_total"
            )
            print(
                f"n{leader + 1} (leader, term {before['term']}) paused; new leader "
                f"n{new_leader + 1}; submitted {submitted}; the paused node caught up "
                f"{caught_up} s after SIGCONT; stall recoveries on the new leader: {recoveries}"
            )
            assert new_leader != leader, "the pause did not depose the leader"
            assert caught_up is not None, (
                f"the paused node (n{leader + 1}) did not catch up within {RECOVERY_BOUND} s of "
                f"SIGCONT: (seconds, leader commit, its applied, its role) {trace}\n"
                f"{cluster.logs()}"
            )
    finally:
        stop.set()
        cluster.stop()
