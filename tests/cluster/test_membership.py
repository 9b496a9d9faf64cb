"""Membership through the log, on a real cluster under a steady load of submits.

* 3 -> 5 -> 3: a node joins by itself (``raft.join``), another is added by the operator
  (``POST /cluster/nodes``) and started with ``raft.peers``; each loads the state as a learner
  and is promoted once caught up.  Then a follower and the leader are removed (the leader hands
  over first).  Writes go on throughout; every acknowledged job is on every member at the end,
  once.
* A removed node stops with a message saying so, and is refused (with the same message) when
  started again with its data.
* Bad input changes nothing: a member added again, a second change while one is in flight, the
  last voter removed, an unknown node removed, a join signed with another secret.
"""

from __future__ import annotations

import hashlib
import hmac
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.members import (
    NODES,
    Load,
    call,
    check_members_hold,
    exit_status,
    leader_of,
    members,
    new_node,
    raft_addr,
    run,
    schedctl,
    wait_voter,
)
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

RAFT = {"log_compaction_min_entries": 200, "log_compaction_min_time": "2s"}


async def recorded(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> dict[str, Any]:
    """Node i's membership once the leader has recorded it, with the cluster's id: it does so
    by itself once every voter is connected and can take part in changes."""

    async def done() -> dict[str, Any] | None:
        view = await members(http, cluster, i)
        return view if view and view["source"] == "log" and view["cluster"] else None

    view: dict[str, Any] = await wait_for(done, timeout=30, interval=0.1)
    assert len(view["cluster"]) == 16
    return view


@pytest.mark.long  # the fault-injection tier (scripts/test --long)
async def test_three_to_five_to_three_under_load(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", raft=dict(RAFT))
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)
            before = await recorded(http, cluster, leader)
            assert len(before["nodes"]) == 3 and before["quorum"] == 2
            assert {n["id"] for n in before["nodes"]} == {"n1", "n2", "n3"}
            load = Load(http, cluster, [0, 1, 2])
            async with load.running():
                await load.more(100)
                # n4 asks to join by itself: raft.join names one node's API (a follower's:
                # it forwards to the leader)
                follower = (leader + 1) % 3
                n4 = new_node(cluster, "n4", {"join": [cluster.nodes[follower].url]})
                cluster.start(n4)
                took4 = await wait_voter(http, cluster, leader, n4)
                await load.more(50)
                # n5 is added by the operator, then started with raft.peers
                n5 = new_node(cluster, "n5", {"peers": [raft_addr(cluster, i) for i in range(3)]})
                code, out = await schedctl(cluster, leader, "node", "add", raft_addr(cluster, n5))
                assert code == 0, out
                body = orjson.loads(out)
                learner = [n for n in body["nodes"] if n["role"] == "learner"]
                assert [n["raft"] for n in learner] == [raft_addr(cluster, n5)]
                # one change at a time: another add while n5 is a learner is refused
                status, body = await call(
                    http, cluster, leader, "POST", NODES, {"raft": "127.0.0.1:31999"}
                )
                assert status == 409 and "in flight" in body["error"]["message"], body
                cluster.start(n5)
                took5 = await wait_voter(http, cluster, leader, n5)
                code, out = await schedctl(cluster, follower, "node", "list", json=False)
                assert code == 0 and "5 voters, a majority is 3" in out, out
                view = await members(http, cluster, leader)
                assert view is not None and view["source"] == "log" and view["quorum"] == 3
                assert {n["id"] for n in view["nodes"]} == {"n1", "n2", "n3", "n4", "n5"}
                await load.more(50)
                # shrink: a follower, then the leader itself (it hands over first)
                status, body = await call(http, cluster, follower, "DELETE", f"{NODES}/n4")
                assert status == 200, body
                assert exit_status(cluster, n4) == 2
                assert "was removed from its cluster" in cluster.nodes[n4].log.read_text()
                lead_id = cluster.nodes[leader].node_id
                status, body = await call(http, cluster, leader, "DELETE", f"{NODES}/{lead_id}")
                assert status == 200, body
                assert {n["id"] for n in body["nodes"]} == {"n1", "n2", "n3", "n5"} - {lead_id}
                assert exit_status(cluster, leader) == 2
                live = [i for i in (0, 1, 2, n5) if i != leader]
                load.targets = live
                new_leader = await leader_of(http, cluster, live)
                await load.more(50)
            view = await members(http, cluster, new_leader)
            assert view is not None and view["quorum"] == 2 and len(view["nodes"]) == 3
            assert view["cluster"] == before["cluster"]  # the same cluster throughout
            await check_members_hold(http, cluster, live, load.acked)
            print(
                f"n4 promoted after {took4:.1f}s, n5 after {took5:.1f}s; "
                f"{len(load.acked)} jobs acknowledged; submit p99 "
                f"{sorted(s for _, s in load.latency)[int(len(load.latency) * 0.99)] * 1000:.0f} ms"
            )
            # the removed leader comes back with its data: refused, saying why
            cluster.start(leader)
            assert exit_status(cluster, leader) == 2
            assert "was removed from its cluster" in cluster.nodes[leader].log.read_text()
    finally:
        cluster.stop()


async def test_bad_membership_changes_change_nothing(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", size=1)
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            me = raft_addr(cluster, 0)
            before = await recorded(http, cluster, 0)
            cases: list[tuple[str, str, Any, int, str]] = [
                ("POST", NODES, {"raft": me}, 409, "already a member"),
                ("POST", NODES, {"raft": "nowhere"}, 400, "host:port"),
                ("POST", NODES, {"raft": "10.1.2.3:7701"}, 400, "raft.secret_file"),
                ("POST", NODES, {"id": "n9"}, 400, "raft"),
                ("DELETE", f"{NODES}/n1", None, 400, "last voter"),
                ("DELETE", f"{NODES}/n7", None, 404, "no member"),
            ]
            for method, path, body, want, says in cases:
                status, answer = await call(http, cluster, 0, method, path, body)
                assert status == want, (method, path, body, answer)
                assert says in answer["error"]["message"], answer
            # a join signed with another secret
            join = {
                "raft": "127.0.0.1:31998",
                "id": "n9",
                "http": "http://127.0.0.1:31997",
                "at": int(time.time() * 1000),
                "data": False,
            }
            signed = {k: join[k] for k in ("raft", "id", "http", "at")}
            join["proof"] = hmac.new(
                b"x" * 32, orjson.dumps(signed, option=orjson.OPT_SORT_KEYS), hashlib.sha256
            ).hexdigest()
            status, answer = await call(http, cluster, 0, "POST", "/api/v1/cluster/join", join, {})
            assert status == 403 and "Raft secret" in answer["error"]["message"], answer
            # a join meant for another cluster (no secret here: signed with none)
            join.update(proof="", cluster="0123456789abcdef")
            status, answer = await call(http, cluster, 0, "POST", "/api/v1/cluster/join", join, {})
            assert status == 409 and before["cluster"] in answer["error"]["message"], answer
            assert await members(http, cluster, 0) == before  # nothing changed
            # one learner at a time: a second add while the first is a learner is refused
            status, answer = await call(
                http, cluster, 0, "POST", NODES, {"raft": "127.0.0.1:31996"}
            )
            assert status == 201, answer
            status, answer = await call(
                http, cluster, 0, "POST", NODES, {"raft": "127.0.0.1:31995"}
            )
            assert status == 409 and "in flight" in answer["error"]["message"], answer
            # the learner can be removed (the add called off); the single voter stays
            status, answer = await call(http, cluster, 0, "DELETE", f"{NODES}/127.0.0.1:31996")
            assert status == 200, answer
            assert [n["raft"] for n in answer["nodes"]] == [me]
            assert answer["removed"] == ["127.0.0.1:31996"]
    finally:
        cluster.stop()


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
async def test_a_lost_majority_is_recovered_from_one_survivor(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", raft=dict(RAFT))
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)
            load = Load(http, cluster, [0, 1, 2])
            async with load.running():
                await load.more(150)
            await check_members_hold(http, cluster, [0, 1, 2], load.acked)
            survivor = (leader + 1) % 3
            config = str(cluster.nodes[survivor].config)
            # refused while it runs, and while the others answer: nothing changes
            code, out = await run("schedd", "recover", "--force-new-cluster", "--config", config)
            assert code == 1 and "running schedd" in out, out
            cluster.kill(survivor, signal.SIGTERM)
            assert exit_status(cluster, survivor) == 0
            code, out = await run("schedd", "recover", "--force-new-cluster", "--config", config)
            assert code == 1 and "still answer" in out and "majority" in out, out
            # the majority is lost for good: the two others are gone
            for i in range(3):
                if i != survivor:
                    cluster.kill(i)
            code, out = await run(
                "schedd", "inspect", "--data-dir", str(cluster.data_dir(survivor)), "-o", "json"
            )
            assert code == 0, out
            applied = orjson.loads(out)["applied"]["index"]
            code, out = await run("schedd", "recover", "--force-new-cluster", "--config", config)
            assert code == 0 and "NEW ONE-NODE CLUSTER" in out and str(applied) in out, out
            cluster.start(survivor)
            await leader_of(http, cluster, [survivor])
            # its raft.peers still name the lost nodes: it says so once, and follows the log
            said = cluster.log_events(survivor, ("raft.peers_differ",))
            assert len(said) == 1, said
            await check_members_hold(http, cluster, [survivor], load.acked)
            view = await cluster.view(http, survivor)
            assert view is not None
            assert any("recover --force-new-cluster" in c["node"] for c in view["leaders"])
            # new nodes join the recovered cluster, under load
            load.targets = [survivor]
            async with load.running():
                await load.more(50)
                for name in ("n4", "n5"):
                    new = new_node(cluster, name, {"join": [cluster.nodes[survivor].url]})
                    cluster.start(new)
                    await wait_voter(http, cluster, survivor, new)
                await load.more(50)
            live = [survivor, 3, 4]
            await check_members_hold(http, cluster, live, load.acked)
            view = await members(http, cluster, survivor)
            assert view is not None and view["quorum"] == 2
            assert {n["id"] for n in view["nodes"]} == {cluster.nodes[survivor].node_id, "n4", "n5"}
    finally:
        cluster.stop()


async def test_a_joining_node_killed_early_joins_again_and_never_leads_alone(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c", size=1)
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            await recorded(http, cluster, 0)
            new = new_node(cluster, "n2", {"join": [cluster.nodes[0].url]})
            cluster.start(new)
            log = cluster.nodes[new].log
            await wait_for(lambda: "cluster.joined" in log.read_text(), timeout=30)
            cluster.kill(new)  # before or while it loads the state: a restart must join again
            cluster.start(new)
            await wait_voter(http, cluster, 0, new)
            text = log.read_text()
            assert "leader.elected" not in text, text  # never a cluster of its own
            view = await members(http, cluster, new)
            assert view is not None and view["quorum"] == 2
    finally:
        cluster.stop()
