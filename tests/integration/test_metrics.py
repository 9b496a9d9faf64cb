"""/metrics moves as work flows: lag histogram, outcomes, skipped reasons, Raft gauges."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from schedd.protocol.messages import Ack, Complete, Lease
from tests.conftest import Node, start_node, wait_for
from tests.integration.test_api import post
from tests.integration.test_worker_protocol import connect


async def scrape(
    http: aiohttp.ClientSession, node: Node
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http.get(node.url + "/metrics", headers=node.headers()) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_follow_a_run_and_a_skip(node: Node, http: aiohttp.ClientSession) -> None:
    before = await scrape(http, node)
    assert before[("schedd_raft_role", (("role", "leader"),))] == 1.0
    assert before.get(("schedd_lease_lag_seconds_count", ()), 0.0) == 0.0
    w = await connect(http, node, "w1")
    _, _job = await post(http, node, "/jobs", {"task": "t"})
    lease = await w.expect(Lease)
    await w.send(Complete(run_id=lease.run_id, fence=lease.fence))
    await w.expect(Ack)
    _, rec = await post(
        http, node, "/jobs", {"task": "t", "schedule": {"every": "1h", "overlap": "skip"}}
    )
    _status, _run = await post(http, node, f"/jobs/{rec['id']}/trigger", {"overlap": "override"})
    await w.expect(Lease)  # the triggered run is running now
    await post(http, node, f"/jobs/{rec['id']}/trigger", {"overlap": "respect"})  # skipped: overlap
    after = await scrape(http, node)
    assert after[("schedd_lease_lag_seconds_count", ())] >= 2
    assert after[("schedd_runs", (("state", "succeeded"),))] == 1.0
    assert after[("schedd_attempts_total", (("outcome", "succeeded"),))] == 1.0
    assert after[("schedd_runs_skipped_total", (("reason", "overlap"),))] == 1.0
    assert after[("schedd_worker_results_total", (("accepted", "true"),))] == 1.0
    assert after[("schedd_workers_connected", ())] == 1.0
    assert after[("schedd_leases_in_flight", ())] == 1.0
    assert after[("schedd_raft_applied_index", ())] > before[("schedd_raft_applied_index", ())]
    key = (
        "schedd_api_request_duration_seconds_count",
        (("method", "POST"), ("route", "/api/v1/jobs"), ("status", "201")),
    )
    assert after[key] >= 2
    await w.ws.close()


async def test_metrics_need_a_token(node: Node, http: aiohttp.ClientSession) -> None:
    async with http.get(node.url + "/metrics") as r:
        assert r.status == 401


async def test_snapshot_age_and_duration_are_exported(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    node = await start_node(
        tmp_path / "n1", raft={"log_compaction_min_entries": 20, "log_compaction_min_time": "1s"}
    )
    try:
        for _ in range(40):
            await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})

        async def exported() -> bool:
            m = await scrape(http, node)
            return ("schedd_raft_snapshot_duration_seconds", ()) in m and (
                "schedd_raft_snapshot_age_seconds",
                (),
            ) in m

        await wait_for(exported, timeout=20)
        m = await scrape(http, node)
        assert 0 <= m[("schedd_raft_snapshot_duration_seconds", ())] < 10
    finally:
        await node.rt.stop()


async def test_the_journal_syncs_are_timed(node: Node, http: aiohttp.ClientSession) -> None:
    before = await scrape(http, node)
    count = ("schedd_raft_journal_fsync_seconds_count", ())
    syncs = node.rt.node.journal.syncs
    status, _ = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
    assert status == 201  # committed, so the leader synced its journal first
    after = await scrape(http, node)
    assert after[count] > before.get(count, 0.0)
    assert node.rt.node.journal.syncs > syncs
    # every sync of the journal is one observation, in a bucket
    inf = ("schedd_raft_journal_fsync_seconds_bucket", (("le", "+Inf"),))
    assert after[inf] == after[count]
    assert after[("schedd_raft_journal_fsync_seconds_sum", ())] > 0
