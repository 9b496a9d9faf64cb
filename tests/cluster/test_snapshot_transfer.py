"""Whole copies of the state, sent only to a follower that needs one (an empty one here), paced
slowly enough (``raft.snapshot_rate`` = 2 MiB/s, or 1 MiB/s, a database of about 10 MB) that
things can happen while one is in flight:

* the follower is killed in the middle of receiving it, or the leader is (and restarted: the
  empty follower does not vote until it has caught up), and the copy starts again cleanly,
  sent by whichever node leads then;
* the leader does not compact its log while it sends (its compaction index stands still
  although entries pile up past the thresholds), and compacts again once the copy is in;
* the log reaches its cap (``raft.log_keep_max``) while a copy is sent: the leader compacts
  anyway, and the copy starts again with the new start of the log, so the follower installs a
  copy that matches the log the leader goes on with (pysyncobj's own transfers went on
  streaming the old file and then pointed the follower past it).

Each time, every job acknowledged before and during the transfer ends up on every node, and the
follower installed exactly one copy."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.test_power_loss import check_every_node, submitting
from tests.cluster.test_stalled_follower import _metric
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300), pytest.mark.long]

RAFT = {
    "log_compaction_min_entries": 50,
    "log_compaction_min_time": "1s",
    "snapshot_rate": "2MiB",
}
FILL_BATCHES = 5  # batches of 1,000 jobs before the follower is emptied: about 10 MB to send
INSTALL = ("raft.snapshot_install",)


async def fill(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    leader: int,
    acked: list[str],
    batches: int,
    size: int,
) -> None:
    job = {"task": "acc.record", "schedule": {"in": "1h"}, "payload": {"pad": "x" * 300}}
    for _ in range(batches):
        async with http.post(
            cluster.urls[leader] + "/api/v1/jobs/batch",
            data=orjson.dumps({"jobs": [job] * size}),
            headers=cluster.headers(),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as r:
            assert r.status == 201, await r.text()
            acked.extend(str(j["id"]) for j in (await r.json())["jobs"])


def incoming(cluster: Cluster, i: int) -> int:
    """Bytes of the copy node i is receiving (0: none)."""
    path = cluster.data_dir(i) / "raft" / "state.db.incoming"
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass
class Setup:
    cluster: Cluster
    http: aiohttp.ClientSession
    leader: int
    follower: int  # emptied, and started again: it is being sent a whole copy
    since: int  # where its log stood when it started again
    acked: list[str]


@contextlib.asynccontextmanager
async def an_empty_follower(tmp_path: Path, **raft: str) -> AsyncIterator[Setup]:
    """A cluster with FILL_BATCHES thousand jobs in it, one follower of which is killed,
    wiped and started again: the leader begins sending it a whole copy."""
    cluster = Cluster(tmp_path / "c", raft={**RAFT, **raft})
    try:
        cluster.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            leader = await cluster.wait_serving(http)
            acked: list[str] = []
            await fill(http, cluster, leader, acked, FILL_BATCHES, 1000)
            f = (leader + 1) % cluster.size
            cluster.kill(f)
            cluster.wipe(f)
            since = cluster.log_size(f)
            cluster.start(f)
            yield Setup(cluster, http, leader, f, since, acked)
    finally:
        cluster.stop()


def install_indexes(line: str) -> tuple[int, int]:
    """(the Raft index a copy carries, the applied index it held) from its install line."""
    found = dict(re.findall(r"(snapshot_index|applied_index)=(\d+)", line))
    return int(found["snapshot_index"]), int(found["applied_index"])


@pytest.mark.parametrize("side", ["follower", "leader"])
async def test_a_copy_interrupted_by_a_kill_on_either_side_starts_again_cleanly(
    tmp_path: Path, side: str
) -> None:
    async with an_empty_follower(tmp_path) as s:
        cluster, http, f = s.cluster, s.http, s.follower
        async with submitting(http, cluster, s.acked):
            # in the middle of receiving the copy: a megabyte of it written
            await wait_for(lambda: incoming(cluster, f) > 1 << 20, timeout=60)
            if side == "follower":
                cluster.kill(f)
                cluster.start(f)
            else:
                # (the empty follower abstains until it has caught up: with the leader down
                # there is no majority to elect another until it is back)
                cluster.kill(s.leader)
                cluster.start(s.leader)
                await cluster.wait_leader(http, timeout=30)
            await wait_for(lambda: len(s.acked) >= FILL_BATCHES * 1000 + 50, timeout=60)
        await check_every_node(http, cluster, s.acked, timeout=120)
        installs = cluster.log_events(f, INSTALL, s.since)
        assert len(installs) == 1, installs  # the interrupted copy was never installed
        # a copy newer than the Raft data it carries (the leader went on applying while its
        # log start stood still): the entries the copy holds are skipped when they come
        carried, held = install_indexes(installs[0])
        assert held > carried, installs[0]


async def test_compaction_is_held_while_a_copy_is_sent_and_resumes_once_it_is_in(
    tmp_path: Path,
) -> None:
    async with an_empty_follower(tmp_path) as s:
        cluster, http, leader, f = s.cluster, s.http, s.leader, s.follower

        async def sending() -> float:
            return await _metric(http, cluster, leader, "schedd_raft_snapshot_sending")

        async def index() -> float:
            return await _metric(http, cluster, leader, "schedd_raft_snapshot_index")

        async with submitting(http, cluster, s.acked):
            await wait_for(sending, timeout=60)
            held = await index()
            applied_then = (await cluster.view(http, leader) or {}).get("commit_index", 0)
            # entries pile up past the thresholds (50 entries, 1 s) while the copy goes
            await wait_for(
                lambda: _commit_past(http, cluster, leader, applied_then + 200), timeout=60
            )
            assert await sending() == 1, "the copy ended too soon to see anything held"
            assert await index() == held  # no compaction while it is in flight
            await wait_for(lambda: incoming(cluster, f) == 0 and _not(sending), timeout=120)
            # and it compacts again once the copy is in
            await wait_for(lambda: _moved(index, held), timeout=30)
        await check_every_node(http, cluster, s.acked, timeout=120)
        assert len(cluster.log_events(f, INSTALL, s.since)) == 1


async def test_a_copy_whose_log_start_moves_starts_again_with_the_new_one(tmp_path: Path) -> None:
    async with an_empty_follower(tmp_path, log_keep_max="1MiB", snapshot_rate="1MiB") as s:
        cluster, leader, f = s.cluster, s.leader, s.follower
        lead_since = cluster.log_size(leader)
        await wait_for(lambda: incoming(cluster, f) > 0, timeout=60)
        # more than the cap of log while the copy goes: the leader compacts anyway
        while not cluster.log_events(leader, ("raft.snapshot_send_stopped",), lead_since):
            assert len(s.acked) < 40_000, "the leader never compacted past its cap"
            await fill(s.http, cluster, leader, s.acked, 1, 200)
        stopped = cluster.log_events(leader, ("raft.snapshot_send_stopped",), lead_since)
        assert "outcome=restarted" in stopped[0], stopped
        await check_every_node(s.http, cluster, s.acked, timeout=120)
        assert len(cluster.log_events(f, INSTALL, s.since)) == 1
        sent = cluster.log_events(leader, ("raft.snapshot_sent",), lead_since)
        assert sent and "outcome=completed" in sent[-1]


async def _commit_past(http: aiohttp.ClientSession, cluster: Cluster, i: int, index: int) -> bool:
    view = await cluster.view(http, i)
    return view is not None and view["commit_index"] >= index


async def _not(probe: object) -> bool:
    value = await probe()  # type: ignore[operator]
    return not value


async def _moved(probe: object, was: float) -> bool:
    return bool(await probe() != was)  # type: ignore[operator]
