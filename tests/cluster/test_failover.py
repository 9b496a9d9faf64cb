"""Three real nodes: leases survive a leader kill (workers resume them), and a killed worker's
lease is lost after its heartbeat timeout and retried elsewhere with a higher fence."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


async def submit(http: aiohttp.ClientSession, cluster: Cluster, body: dict[str, Any]) -> str:
    for attempt in range(50):
        url = cluster.urls[attempt % len(cluster.urls)]
        try:
            async with http.post(
                url + "/api/v1/jobs", data=orjson.dumps(body), headers=cluster.headers()
            ) as r:
                if r.status == 201:
                    return str((await r.json())["id"])
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("could not submit")


async def runs_of(
    http: aiohttp.ClientSession, cluster: Cluster, job_id: str
) -> list[dict[str, Any]]:
    for n in cluster.nodes:
        if not n.alive:
            continue
        try:
            async with http.get(
                f"{n.url}/api/v1/jobs/{job_id}/runs", headers=cluster.headers()
            ) as r:
                if r.status == 200:
                    runs: list[dict[str, Any]] = (await r.json())["runs"]
                    return runs
        except aiohttp.ClientError:
            continue
    return []


async def wait_states(
    http: aiohttp.ClientSession, cluster: Cluster, ids: list[str], states: set[str], timeout: float
) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + timeout
    out: dict[str, list[dict[str, Any]]] = {}
    while time.monotonic() < deadline:
        out = {j: await runs_of(http, cluster, j) for j in ids}
        if all(r and r[0]["state"] in states for r in out.values()):
            return out
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"not all in {states}: { {j: r[0]['state'] if r else None for j, r in out.items()} }"
        f"\n{cluster.logs()}"
    )


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "executions.txt"
    path.touch()
    monkeypatch.setenv("SCHEDD_TEST_RECORD", str(path))
    return path


async def test_running_leases_are_resumed_after_the_leader_is_killed(
    tmp_path: Path, record: Path
) -> None:
    cluster = Cluster(
        tmp_path / "c", scheduler={"heartbeat_interval": "1s", "heartbeat_timeout": "6s"}
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)  # the others can elect when it dies
            cluster.start_worker("--import", "tests.acceptance.tasks", "--concurrency", "8")
            ids = [
                await submit(http, cluster, {"task": "acc.record", "payload": {"sleep": 4}})
                for _ in range(6)
            ]
            await wait_states(http, cluster, ids, {"running"}, timeout=30)
            cluster.kill(leader)
            await cluster.wait_leader(http, exclude=leader)
            done = await wait_states(http, cluster, ids, {"succeeded"}, timeout=60)
        for runs in done.values():
            [run] = runs
            # Resumed on the new leader: one attempt, never leased twice.
            assert len(run["attempts"]) == 1, run
        lines = record.read_text().splitlines()
        assert len(lines) == len(ids) and len({ln.split()[0] for ln in lines}) == len(ids)
    finally:
        cluster.stop()


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
async def test_killed_worker_loses_its_lease_and_the_run_is_retried(
    tmp_path: Path, record: Path
) -> None:
    cluster = Cluster(
        tmp_path / "c", scheduler={"heartbeat_interval": "0.5s", "heartbeat_timeout": "2s"}
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            doomed = cluster.start_worker("--import", "tests.acceptance.tasks", name="doomed")
            job = await submit(
                http,
                cluster,
                {
                    "task": "acc.record",
                    "payload": {"sleep": 60},
                    "heartbeat_timeout": "2s",
                    "retry": {"initial": "0.1s", "jitter": False},
                },
            )
            await wait_states(http, cluster, [job], {"running"}, timeout=30)
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(10)
            await wait_states(http, cluster, [job], {"retrying", "queued"}, timeout=15)
            # A healthy worker picks the retry up (it sleeps too: we only need it leased).
            cluster.start_worker("--import", "tests.acceptance.tasks", name="healthy")
            runs = await wait_states(http, cluster, [job], {"running"}, timeout=30)
        attempts = runs[job][0]["attempts"]
        assert [a["outcome"] for a in attempts] == ["lost", None]
        assert attempts[0]["worker_id"] == "doomed" and attempts[1]["worker_id"] == "healthy"
        assert attempts[1]["fence"] > attempts[0]["fence"]
        assert "no heartbeat" in attempts[0]["error"]
    finally:
        cluster.stop()


async def test_sigterm_of_the_leader_hands_over_without_losing_or_duplicating(
    tmp_path: Path, record: Path
) -> None:
    cluster = Cluster(
        tmp_path / "c", scheduler={"heartbeat_interval": "0.5s", "heartbeat_timeout": "3s"}
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)  # a voter to hand over to
            cluster.start_worker("--import", "tests.acceptance.tasks", "--concurrency", "16")
            ids = [
                await submit(http, cluster, {"task": "acc.record", "payload": {"sleep": 0.2}})
                for _ in range(40)
            ]
            leader = await cluster.wait_leader(http)  # (it may have changed under load)
            cluster.kill(leader, signal.SIGTERM)
            ids += [
                await submit(http, cluster, {"task": "acc.record", "payload": {"sleep": 0.05}})
                for _ in range(40)
            ]
            proc = cluster.nodes[leader].proc
            assert proc is not None and proc.wait(30) == 0  # a clean exit within the drain time
            new = await cluster.wait_leader(http, exclude=leader)
            assert new != leader
            await wait_states(http, cluster, ids, {"succeeded"}, timeout=90)
        log = cluster.nodes[leader].log.read_text()
        assert "leader.handed_over" in log
        lines = record.read_text().splitlines()
        runs = [ln.split()[0] for ln in lines]
        twice = [ln for ln in lines if runs.count(ln.split()[0]) > 1]
        assert not twice, f"executed twice: {twice}\n{cluster.logs()}"
        assert len(set(runs)) == len(ids)
    finally:
        cluster.stop()
