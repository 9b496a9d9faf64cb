"""A follower cut off from its leader for 30 s rejoins without an election: the leader stays,
the term does not move on any node.  The Raft proxy cuts only the leader's link to it, so it
still reaches the other follower - the classic disruptive node: without pre-vote its election
timer fires again and again, each time with a higher term, and the other follower, taking the
higher term, stops following the healthy leader: an election, and another when it comes back.
With pre-vote it asks first, the other follower refuses (it hears from the leader), and nothing
changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.test_stalled_follower import _metric
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240), pytest.mark.long]

ISOLATED_S = 30.0
#: ``raft.raft_min_timeout``'s default: a follower that went this long without its leader's
#: appends may grant a pre-vote, and the election that follows is Raft doing its job
MIN_TIMEOUT_S = 1.0
ATTEMPTS = 2


async def test_a_follower_isolated_for_30_s_rejoins_without_an_election(tmp_path: Path) -> None:
    """One attempt may meet a stall of the machine itself: the leader silent to the other
    follower too for an election timeout (its fsync held up by the disk, say).  An election
    then is no fault of the isolated follower; the attempt is told apart by the other
    follower's gap histogram and run again.  An election without such a gap fails at once."""
    stalls = []
    for attempt in range(ATTEMPTS):
        stall = await _isolate_and_heal(tmp_path / f"c{attempt}")
        if stall is None:
            return
        stalls.append(stall)
    raise AssertionError(f"every attempt met a stall of the leader: {stalls}")


async def _isolate_and_heal(root: Path) -> str | None:
    """Run the scenario; None when it passed, or why it could not judge (a stall)."""
    cluster = Cluster(root, proxied=True)
    contact = 'schedd_raft_gap_max_seconds{kind="leader_contact"}'
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)
            view = await cluster.view(http, leader)
            assert view is not None
            term = view["term"]
            follower = next(i for i in range(cluster.size) if i != leader)
            other = next(i for i in range(cluster.size) if i not in (leader, follower))
            await wait_for(
                lambda: _leader_named(cluster, http, follower, cluster.nodes[leader].node_id),
                timeout=10,
            )
            started = [
                await _metric(http, cluster, i, "schedd_raft_elections_started_total")
                for i in range(cluster.size)
            ]
            base = await _metric(http, cluster, other, contact)
            try:
                await _judge(cluster, http, leader, follower, other, term, started)
            except AssertionError as failure:
                stalled = await _metric(http, cluster, other, contact)
                if stalled > base and stalled >= MIN_TIMEOUT_S:
                    return f"the other follower went {stalled:.2f} s without the leader"
                raise AssertionError(
                    f"{failure} (the other follower's longest wait for the leader "
                    f"{stalled:.2f} s)\n{cluster.logs()}"
                ) from None
            return None
    finally:
        cluster.stop()


async def _judge(
    cluster: Cluster,
    http: aiohttp.ClientSession,
    leader: int,
    follower: int,
    other: int,
    term: int,
    started: list[float],
) -> None:
    cluster.net.cut(leader, follower)  # it still reaches the other follower
    await asyncio.sleep(ISOLATED_S)
    during = await cluster.view(http, leader)
    cluster.net.heal()
    await wait_for(
        lambda: _leader_named(cluster, http, follower, cluster.nodes[leader].node_id),
        timeout=10,
    )
    await asyncio.sleep(2)  # a few election timeouts after the heal: nothing happens
    views = [await cluster.view(http, i) for i in range(cluster.size)]
    assert all(v is not None and v["term"] == term for v in views), views
    assert all(v is not None and v["leader"] == cluster.nodes[leader].node_id for v in views)
    after = [
        await _metric(http, cluster, i, "schedd_raft_elections_started_total")
        for i in range(cluster.size)
    ]
    assert after == started  # no election anywhere
    assert during is not None and (during["role"], during["term"]) == ("leader", term)
    # it kept asking while cut off, and the other follower kept saying no
    refused = await _metric(http, cluster, other, "schedd_raft_prevotes_refused_total")
    assert refused >= 10, refused
    # and the gap it went without its leader is what its histogram shows, as is the leader's
    # wait for its answers (the same leader and term on both sides of it)
    contact = 'schedd_raft_gap_max_seconds{kind="leader_contact"}'
    answer = 'schedd_raft_gap_max_seconds{kind="follower_answer"}'

    async def back() -> bool:
        return await _metric(http, cluster, follower, contact) >= ISOLATED_S - 1

    await wait_for(back, timeout=15)
    assert await _metric(http, cluster, leader, answer) >= ISOLATED_S - 1
    assert await _metric(http, cluster, other, contact) < ISOLATED_S / 3


async def _leader_named(cluster: Cluster, http: aiohttp.ClientSession, i: int, leader: str) -> bool:
    v = await cluster.view(http, i)
    return v is not None and v["leader"] == leader
