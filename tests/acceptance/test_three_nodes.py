"""Three real ``schedd`` processes, a real ``schedd-worker``, jobs from ``schedctl`` and the API,
and the leader SIGKILLed in the middle.  Every acknowledged job must run to success, no run may be
completed twice, and every run's history must show its attempts and fences."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster.harness import BIN, Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]

API_JOBS = 300
CLI_JOBS = 12


async def submit_api(
    http: aiohttp.ClientSession, cluster: Cluster, body: dict[str, Any], start: int
) -> str | None:
    """Submit through any live node, trying the others on failure; the job id once acknowledged."""
    for attempt in range(40):
        url = cluster.urls[(start + attempt) % len(cluster.urls)]
        try:
            async with http.post(
                url + "/api/v1/jobs",
                data=orjson.dumps(body),
                headers=cluster.headers(),
                timeout=aiohttp.ClientTimeout(total=12),
            ) as r:
                if r.status in (200, 201):
                    return str((await r.json())["id"])
                assert r.status in (503, 429), await r.text()  # never a 4xx/5xx for a good body
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    return None


def submit_cli(cluster: Cluster, i: int) -> str:
    args = [str(BIN / "schedctl"), f"--token={cluster.token}", "-o", "json"]
    for url in cluster.urls:
        args += ["--server", url]
    args += [
        "submit",
        "acc.record",
        "--payload",
        orjson.dumps({"n": i, "via": "cli"}).decode(),
        "--heartbeat-timeout",
        "3s",
    ]
    out = subprocess.run(args, capture_output=True, timeout=60, check=True)
    return str(orjson.loads(out.stdout)["id"])


async def job_state(
    http: aiohttp.ClientSession, cluster: Cluster, job_id: str
) -> dict[str, Any] | None:
    for n in cluster.nodes:
        if not n.alive:
            continue
        try:
            async with http.get(
                f"{n.url}/api/v1/jobs/{job_id}/runs",
                headers=cluster.headers(),
                timeout=aiohttp.ClientTimeout(total=3),
            ) as r:
                if r.status == 200:
                    data: dict[str, Any] = await r.json()
                    return data
        except (aiohttp.ClientError, TimeoutError):
            continue
    return None


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
@pytest.mark.parametrize("shards", [1, 3], ids=["one-shard", "shards3"])
async def test_leader_killed_mid_load_loses_nothing_and_completes_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shards: int
) -> None:
    """With three shards, the node killed leads shard 0 (and maybe more): jobs of every shard
    are in flight, and the worker is served from all of them through one node."""
    record = tmp_path / "executions.txt"
    record.touch()
    monkeypatch.setenv("SCHEDD_TEST_RECORD", str(record))
    cluster = Cluster(
        tmp_path / "cluster",
        scheduler={"heartbeat_interval": "1s", "heartbeat_timeout": "3s"},
        shards=shards,
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)  # the others can elect when it dies
            cluster.start_worker("--import", "tests.acceptance.tasks", "--concurrency", "32")

            acked: list[str] = []
            loop = asyncio.get_running_loop()
            cli_jobs = loop.run_in_executor(
                None, lambda: [submit_cli(cluster, i) for i in range(CLI_JOBS)]
            )

            body = {"task": "acc.record", "heartbeat_timeout": "3s", "payload": {"sleep": 0.05}}
            sem = asyncio.Semaphore(16)

            async def one(i: int) -> None:
                async with sem:
                    job_id = await submit_api(http, cluster, dict(body, payload={"n": i}), i)
                    if job_id is not None:
                        acked.append(job_id)

            first = [asyncio.create_task(one(i)) for i in range(API_JOBS // 2)]
            await asyncio.gather(*first)

            killed_at = time.monotonic()
            cluster.kill(leader)
            second = [asyncio.create_task(one(i)) for i in range(API_JOBS // 2, API_JOBS)]
            new_leader = await cluster.wait_leader(http, exclude=leader)
            failover_s = time.monotonic() - killed_at
            await asyncio.gather(*second)
            acked += await cli_jobs
            assert new_leader != leader
            assert len(acked) >= API_JOBS + CLI_JOBS - 5, (
                "nearly every submission must be acknowledged"
            )
            assert len(set(acked)) == len(acked), "no job id may be acknowledged twice"

            # Every acknowledged job runs to success.
            pending = set(acked)
            histories: dict[str, list[dict[str, Any]]] = {}
            deadline = time.monotonic() + 120
            while pending and time.monotonic() < deadline:
                for job_id in list(pending)[:50]:
                    runs = await job_state(http, cluster, job_id)
                    if runs and runs["runs"] and runs["runs"][0]["state"] == "succeeded":
                        histories[job_id] = runs["runs"]
                        pending.discard(job_id)
                await asyncio.sleep(0.2)
            assert not pending, (
                f"{len(pending)} acknowledged jobs never succeeded\n{cluster.logs()}"
            )

        executions = collections.Counter()
        for line in record.read_text().splitlines():
            run_id, fence, _ = line.split()
            executions[(run_id, int(fence))] += 1
        for runs in histories.values():
            assert len(runs) == 1
            run = runs[0]
            attempts = run["attempts"]
            assert attempts, f"{run['id']} has no attempts"
            fences = [a["fence"] for a in attempts]
            assert fences == sorted(set(fences)) and all(f > 0 for f in fences)
            assert all(a["worker_id"] and a["started_at"] for a in attempts)
            succeeded = [a for a in attempts if a["outcome"] == "succeeded"]
            assert len(succeeded) == 1, f"{run['id']} completed {len(succeeded)} times"
            assert attempts[-1]["outcome"] == "succeeded"
            # The worker executed each fence at most once, and only fences the history knows.
            ran = {f: n for (r, f), n in executions.items() if r == run["id"]}
            assert all(n == 1 for n in ran.values()), f"{run['id']} executed twice: {ran}"
            assert set(ran) <= set(fences)
            assert succeeded[0]["fence"] in ran
        print(f"\nacknowledged {len(acked)} jobs; failover {failover_s:.2f}s")
    finally:
        cluster.stop()
