"""Where a node's front door sends each request, among its shards."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request

from schedd.config import Config
from schedd.errors import InvalidArgument
from schedd.ids import new_job_id, shard_of_key
from schedd.shard.frontdoor import SHARD_HEADER, BadShard, FrontDoor

SHARDS = 4
T0 = 1_700_000_000_000


def route(method: str, path: str, body: object = None, **headers: str) -> int:
    door = FrontDoor(Config(), [f"/s{k}" for k in range(SHARDS)])
    raw = b"" if body is None else orjson.dumps(body)
    return door.route(make_mocked_request(method, path, headers=headers), raw)


def test_a_job_or_run_in_the_path_goes_to_the_shard_its_id_says() -> None:
    job = new_job_id(T0, 2)
    assert route("GET", f"/api/v1/jobs/{job}") == 2
    assert route("POST", f"/api/v1/jobs/{job}/cancel") == 2
    assert route("GET", f"/api/v1/runs/{job}@{T0}") == 2
    assert route("GET", "/api/v1/jobs/nonsense") == 0  # shard 0 answers the 404


def test_a_submit_goes_with_its_upstreams_then_its_key_then_its_request_id() -> None:
    upstream = new_job_id(T0, 3)
    body = {"task": "t", "depends_on": [upstream], "idempotency_key": "k"}
    assert route("POST", "/api/v1/jobs", body, **{"X-Request-Id": "request-1"}) == 3
    key = {"task": "t", "namespace": "billing", "idempotency_key": "invoice-7"}
    assert route("POST", "/api/v1/jobs", key) == shard_of_key("billing\0invoice-7", SHARDS)
    plain = {"task": "t"}
    assert route("POST", "/api/v1/jobs", plain, **{"X-Request-Id": "request-1"}) == (
        shard_of_key("request-1", SHARDS)
    )
    batch = {"jobs": [{"task": "t", "idempotency_key": "a"}, {"task": "u"}]}
    assert route("POST", "/api/v1/jobs/batch", batch) == shard_of_key("default\0a", SHARDS)


def test_a_batch_goes_to_its_upstreams_shard_whichever_job_names_them() -> None:
    upstream = new_job_id(T0, 1)
    batch = {
        "jobs": [
            {"task": "t", "ref": "a", "idempotency_key": "k"},
            {"task": "u", "depends_on": ["a", upstream.lower()]},  # a ref, and an id
        ]
    }
    assert route("POST", "/api/v1/jobs/batch", batch) == 1


def test_upstreams_in_two_shards_or_named_by_name_are_refused_naming_them() -> None:
    one, two = new_job_id(T0, 1), new_job_id(T0, 3)
    with pytest.raises(InvalidArgument) as err:
        route("POST", "/api/v1/jobs", {"task": "t", "depends_on": [one, two]})
    assert "shards 1 and 3" in str(err.value) and one in str(err.value)
    assert err.value.field == "depends_on"
    batch = {"jobs": [{"task": "t", "depends_on": [one]}, {"task": "u", "depends_on": [two]}]}
    with pytest.raises(InvalidArgument, match="shards 1 and 3"):
        route("POST", "/api/v1/jobs/batch", batch)
    with pytest.raises(InvalidArgument) as err:
        route("POST", "/api/v1/jobs", {"task": "t", "depends_on": [one, "nightly-report"]})
    assert err.value.field == "depends_on[1]" and "'nightly-report'" in str(err.value)
    # what the shard checks itself is left to it
    assert route("POST", "/api/v1/jobs", {"task": "t", "depends_on": [5]}) in range(SHARDS)


def test_a_submit_with_nothing_to_go_by_takes_each_shard_in_turn() -> None:
    door = FrontDoor(Config(), [f"/s{k}" for k in range(SHARDS)])
    got = [
        door.route(make_mocked_request("POST", "/api/v1/jobs"), b'{"task": "t"}')
        for _ in range(2 * SHARDS)
    ]
    assert sorted(got) == sorted(list(range(SHARDS)) * 2)


def test_a_named_shard_is_taken_and_a_wrong_one_refused() -> None:
    assert route("GET", "/api/v1/workers", **{SHARD_HEADER: "3"}) == 3
    for bad in ("4", "-1", "x"):
        with pytest.raises(BadShard):
            route("GET", "/api/v1/workers", **{SHARD_HEADER: bad})
    assert route("GET", "/api/v1/cluster") == 0


def test_the_shards_metrics_are_one_exposition_labelled_by_shard() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from schedd.shard.frontdoor import merge_metrics

    def shard_text(term: int, requests: int) -> str:
        return (
            "# HELP schedd_raft_term Current Raft term.\n# TYPE schedd_raft_term gauge\n"
            f"schedd_raft_term {term}.0\n"
            "# HELP schedd_requests_total Requests.\n# TYPE schedd_requests_total counter\n"
            f'schedd_requests_total{{route="/jobs"}} {requests}.0\n'
        )

    text = merge_metrics([shard_text(3, 10), shard_text(5, 20)]).decode()
    assert text.count("# TYPE schedd_raft_term gauge") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    terms = {s.labels["shard"]: s.value for s in families["schedd_raft_term"].samples}
    assert terms == {"0": 3.0, "1": 5.0}
    counts = {
        (s.labels["shard"], s.labels["route"]): s.value for s in families["schedd_requests"].samples
    }
    assert counts == {("0", "/jobs"): 10.0, ("1", "/jobs"): 20.0}


def test_a_job_views_place_follows_its_shards_order() -> None:
    """As a shard orders them (schedd.core.model.JobSort): no next fire after every time, not
    run yet before every time."""
    from schedd.core.model import JobSort
    from schedd.shard.frontdoor import job_key

    ran = {
        "id": "B",
        "next_run_at": "2026-01-01T00:00:00.000Z",
        "latest_run": {"scheduled_at": "2026-01-01T00:00:00.000Z"},
    }
    idle = {"id": "A", "next_run_at": None, "latest_run": None}
    by_fire, by_run = job_key(JobSort.NEXT_FIRE), job_key(JobSort.LATEST_RUN)
    assert sorted([idle, ran], key=by_fire) == [ran, idle]
    assert sorted([ran, idle], key=by_run) == [idle, ran]


def test_a_membership_change_made_before_in_a_shard_is_told_from_a_refusal() -> None:
    """The front door asks every shard for a membership change; asked again after one that
    stopped half-way, a shard that made it already says so in words the front door knows
    (schedd.core.members' own refusals), and any other refusal stops it."""
    from schedd.core import members
    from schedd.errors import SchedError
    from schedd.shard.frontdoor import _added_before, _removed_before

    def refusal(plan: object, *args: object) -> tuple[int, bytes]:
        try:
            plan(*args)  # type: ignore[operator]
        except SchedError as err:
            return err.http_status, orjson.dumps(err.to_dict())
        raise AssertionError("not refused")

    a, b = members.Member("10.0.0.1:7701", "n1"), members.Member("10.0.0.2:7701", "n2")
    both = members.Membership((a, b), index=5, cluster="c")
    assert _added_before(*refusal(members.plan_add, both, "10.0.0.2:7701"))
    gone = members.plan_remove(both, "n2")
    assert _removed_before(*refusal(members.plan_remove, gone, "10.0.0.2:7701"))
    # refusals of another kind are not taken for a change made before
    busy = members.plan_add(both, "10.0.0.3:7701")
    assert not _added_before(*refusal(members.plan_add, busy, "10.0.0.4:7701"))
    assert not _removed_before(*refusal(members.plan_remove, both, "10.0.0.9:7701"))


async def test_a_namespaces_submission_rate_holds_for_the_node_whatever_the_shard() -> None:
    """The node's front door keeps each namespace's bucket (its shards keep none): the
    submits over the rate are refused there, whichever shard each would have gone to."""
    from aiohttp.test_utils import TestClient, TestServer

    from schedd.config import load_config
    from schedd.shard.layout import shard_config

    cfg = load_config(
        None,
        env={},
        overrides={"limits.submit_rate": {"billing": 0.001}, "limits.submit_burst": 2},
    )
    assert shard_config(cfg, 1).limits.submit_rate == ()  # the shard's own: off
    door = FrontDoor(cfg, [f"/nonexistent/s{k}" for k in range(SHARDS)])
    await door.start()
    try:
        async with TestClient(TestServer(door.app())) as client:
            statuses = []
            for k in range(3):  # three request ids: three shards' worth
                resp = await client.post(
                    "/api/v1/jobs",
                    json={"task": "t", "namespace": "billing"},
                    headers={"X-Request-Id": f"rate-request-{k}"},
                )
                statuses.append(resp.status)
                body = await resp.json()
            assert statuses == [503, 503, 429], statuses  # (no shard runs here: 503)
            assert "billing is over its submission rate" in body["error"]["message"]
            resp = await client.post(
                "/api/v1/jobs/batch", json={"jobs": [{"task": "t", "namespace": "billing"}] * 3}
            )
            assert resp.status == 400 and "more than its burst (2)" in await resp.text()
            resp = await client.post("/api/v1/jobs", json={"task": "t"})  # not limited
            assert resp.status == 503
    finally:
        await door.close()


def test_a_read_asking_for_a_position_passes_it_on_to_each_shard_as_it_is() -> None:
    """A position is a stamp, which compares across shards: the front door passes a
    client's min_index on to each shard it reads (which waits for it, or commits a barrier
    above it), and makes no read a consistent one."""
    door = FrontDoor(Config(), [f"/s{k}" for k in range(SHARDS)])
    asked = make_mocked_request(
        "GET", "/api/v1/jobs?limit=5&min_index=912", headers={"X-Schedd-Min-Index": "900"}
    )
    headers = door._headers(asked)
    assert headers["X-Schedd-Min-Index"] == "900"
    assert "X-Schedd-Consistency" not in headers


def test_a_shard_takes_the_peer_the_front_door_saw_and_a_lone_node_its_own() -> None:
    """A shard's process hears every request from its node's front door, which names the
    caller in X-Forwarded-For; a node of one shard never believes that header (a caller could
    name any address in it, and the join rule of a cluster without a Raft secret rests on the
    peer)."""
    from aiohttp import web

    from schedd.api.ports import CONFIG, peer
    from schedd.config import load_config

    def asked(shards: int) -> str | None:
        app = web.Application()
        overrides = {"cluster.shards": shards} if shards > 1 else {}
        app[CONFIG] = load_config(None, env={}, overrides=overrides)
        request = make_mocked_request(
            "POST", "/api/v1/cluster/join", headers={"X-Forwarded-For": "10.9.9.9"}, app=app
        )
        return peer(request)

    assert asked(3) == "10.9.9.9"
    assert asked(1) != "10.9.9.9"


@pytest.mark.parametrize(("scope", "nodes"), [("node", 1), ("cluster", 3)])
def test_a_namespaces_submission_rate_is_shared_among_the_nodes_when_it_holds_for_the_cluster(
    tmp_path: Path, scope: str, nodes: int
) -> None:
    """``limits.submit_rate_scope = "cluster"``: each node's bucket (the front door's with
    several shards, the node's own with one) refills at the rate divided by the cluster's
    nodes, so the nodes together admit the rate; each keeps the whole burst."""
    from schedd.auth import ensure_admin_token
    from schedd.config import load_config
    from schedd.runtime import Runtime

    cfg = load_config(
        None,
        env={},
        overrides={
            "node.data_dir": str(tmp_path),
            "raft.peers": ["127.0.0.1:7702", "127.0.0.1:7704"],
            "limits.submit_rate": {"billing": 3.0},
            "limits.submit_burst": 2,
            "limits.submit_rate_scope": scope,
        },
    )
    assert cfg.node_submit_rates() == (("billing", 3.0 / nodes),)
    ensure_admin_token(cfg.tokens_path)
    door = FrontDoor(cfg, [f"/nonexistent/s{k}" for k in range(SHARDS)])
    buckets = {
        "front door": door._buckets["billing"],
        "one shard": Runtime(cfg).rate_limits["billing"],
    }
    for where, bucket in buckets.items():
        assert bucket.take(0, 2) == 0.0, where  # the whole burst, on each node
        # the next job once a token has come back: 1/3 s at the whole rate, 1 s at a third
        assert bucket.take(0, 1) == pytest.approx(nodes / 3.0), where
