"""Scheduling on the real cluster: a per-second cron job across a leader kill, a dependency
chain, and a job that always fails ending in the dead-letter queue, then replayed."""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]


class Api:
    def __init__(self, http: aiohttp.ClientSession, cluster: Cluster) -> None:
        self.http, self.cluster = http, cluster

    async def call(self, method: str, path: str, body: Any = None, missing_ok: bool = False) -> Any:
        """The answer of the first node that gives one (None for a 404 when ``missing_ok``)."""
        for attempt in range(60):
            n = self.cluster.nodes[attempt % len(self.cluster.nodes)]
            if not n.alive:
                continue
            try:
                async with self.http.request(
                    method,
                    n.url + "/api/v1" + path,
                    data=None if body is None else orjson.dumps(body),
                    headers=self.cluster.headers(),
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    if r.status == 404 and missing_ok:
                        return None
                    if r.status < 500:
                        assert r.status < 400, (r.status, await r.text())
                        return await r.json() if r.status != 204 else None
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"{method} {path} failed everywhere")

    async def wait(self, job_id: str, pred: Any, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            # A node other than the one that took the submit may not have applied it yet (reads
            # on a follower can lag): not there yet, not an error.
            page = await self.call("GET", f"/jobs/{job_id}/runs", missing_ok=True)
            runs = [] if page is None else page["runs"]
            if page is not None and pred(runs):
                return runs
            await asyncio.sleep(0.2)
        raise AssertionError(f"job {job_id}: condition not met; runs: {runs}")


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture(
    params=[1, pytest.param(3, marks=pytest.mark.long)],  # three shards: the fault tier
    ids=["one-shard", "shards3"],
)
async def env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Cluster, Api, Path]]:
    record = tmp_path / "executions.txt"
    record.touch()
    monkeypatch.setenv("SCHEDD_TEST_RECORD", str(record))
    cluster = Cluster(
        tmp_path / "c",
        scheduler={"heartbeat_interval": "0.5s", "heartbeat_timeout": "3s"},
        shards=request.param,
    )
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            await cluster.wait_serving(http)  # a test kills the leader: the others must elect
            cluster.start_worker("--import", "tests.acceptance.tasks", "--concurrency", "16")
            yield cluster, Api(http, cluster), record
    finally:
        cluster.stop()


async def test_per_second_cron_keeps_its_cadence_across_a_leader_kill(
    env: tuple[Cluster, Api, Path],
) -> None:
    cluster, api, record = env
    job = await api.call(
        "POST",
        "/jobs",
        {
            "task": "acc.record",
            "payload": {"sleep": 0.01},
            "schedule": {"cron": "* * * * * *", "overlap": "allow"},
            "heartbeat_timeout": "3s",
        },
    )
    await api.wait(job["id"], lambda runs: sum(r["state"] == "succeeded" for r in runs) >= 4)
    shard = int(job.get("shard", 0))  # the leader killed is the one of the job's shard
    leader = await cluster.wait_leader(api.http, shard=shard)
    cluster.kill(leader)
    await cluster.wait_leader(api.http, exclude=leader, shard=shard)
    runs = await api.wait(
        job["id"], lambda runs: sum(r["state"] == "succeeded" for r in runs) >= 12, timeout=90
    )
    await api.call("DELETE", f"/jobs/{job['id']}")
    finished = sorted(
        (ts(r["scheduled_at"]), r["state"])
        for r in runs
        if r["state"] != "scheduled" and r["state"] != "cancelled"
    )
    seconds = [t for t, _ in finished]
    assert seconds == [seconds[0] + i for i in range(len(seconds))], "a gap or a duplicate second"
    assert all(state in ("succeeded", "running", "queued") for _, state in finished), finished
    executed = collections.Counter(line.split()[0] for line in record.read_text().splitlines())
    assert all(n == 1 for n in executed.values()), "an occurrence ran twice"


async def test_dependency_chain_runs_in_order(env: tuple[Cluster, Api, Path]) -> None:
    _, api, record = env
    a = await api.call("POST", "/jobs", {"task": "acc.record", "payload": {"sleep": 0.3}})
    b = await api.call("POST", "/jobs", {"task": "acc.record", "depends_on": [a["id"]]})
    c = await api.call("POST", "/jobs", {"task": "acc.record", "depends_on": [b["id"]]})
    await api.wait(c["id"], lambda runs: runs and runs[0]["state"] == "succeeded")
    order = [line.split()[0].split("@")[0] for line in record.read_text().splitlines()]
    assert order == [a["id"], b["id"], c["id"]]
    ends = []
    for j in (a, b, c):
        [run] = (await api.call("GET", f"/jobs/{j['id']}/runs"))["runs"]
        ends.append((ts(run["attempts"][0]["started_at"]), ts(run["attempts"][0]["ended_at"])))
    assert ends[0][1] <= ends[1][0] and ends[1][1] <= ends[2][0]


async def test_always_failing_job_is_dead_lettered_with_backoff_then_replayed(
    env: tuple[Cluster, Api, Path],
) -> None:
    _, api, _ = env
    job = await api.call(
        "POST",
        "/jobs",
        {
            "task": "acc.fail",
            "retry": {"max_attempts": 3, "initial": "0.5s", "multiplier": 2, "jitter": False},
        },
    )
    runs = await api.wait(job["id"], lambda runs: runs and runs[0]["state"] == "failed")
    attempts = runs[0]["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed"] * 3
    gaps = [ts(b["started_at"]) - ts(a["ended_at"]) for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95, gaps  # 0.5 s then 1 s of backoff
    assert attempts[-1]["error"].startswith("RuntimeError: acc.fail attempt 3")
    dlq = await api.call("GET", "/dlq")
    assert runs[0]["id"] in [r["id"] for r in dlq["runs"]]
    replayed = await api.call("POST", f"/dlq/{runs[0]['id']}/replay")
    assert replayed["state"] in ("queued", "running")
    runs = await api.wait(
        job["id"], lambda runs: runs[0]["state"] == "failed" and len(runs[0]["attempts"]) == 6
    )
    assert len(runs[0]["attempts"]) == 6  # a fresh set of attempts after the replay
