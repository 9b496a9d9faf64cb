"""Runs go only to workers that run their task: on a real three-node cluster, a worker without
a task never takes (and dead-letters) its runs; they wait until a worker that runs it connects."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]


async def api(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    method: str,
    path: str,
    body: Any = None,
    base: str | None = None,
) -> Any:
    async with http.request(
        method,
        (base or cluster.urls[0]) + "/api/v1" + path,
        data=None if body is None else orjson.dumps(body),
        headers=cluster.headers(),
    ) as r:
        assert r.status < 300, await r.text()
        return await r.json()


async def states(http: aiohttp.ClientSession, cluster: Cluster, ids: list[str]) -> list[str]:
    out = []
    for job_id in ids:
        job = await api(http, cluster, "GET", f"/jobs/{job_id}")
        out.append(job["latest_run"]["state"])
    return out


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout}s: {what}")


async def test_a_task_no_worker_runs_waits_for_one_instead_of_being_dead_lettered(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, size=3)
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            await cluster.wait_serving(http)  # the test reads and writes through node 0
            record_file = tmp_path / "record.txt"
            cluster.start_worker(
                "--import",
                "tests.acceptance.tasks",
                name="early",
                env={"SCHEDD_TEST_RECORD": str(record_file)},
            )
            await until(lambda: _workers(http, cluster, {"early"}), 30, "the early worker connects")
            [early] = (await api(http, cluster, "GET", "/workers"))["workers"]
            assert "acc.record" in early["tasks"] and "acc.late" not in early["tasks"]
            record = {"task": "acc.record", "payload": {"sleep": 0}}
            late = {"task": "acc.late", "retry": {"max_attempts": 1}}
            # the other task first: without routing the early worker would take these first
            waiting = [(await api(http, cluster, "POST", "/jobs", late))["id"] for _ in range(5)]
            recorded = [(await api(http, cluster, "POST", "/jobs", record))["id"] for _ in range(5)]

            async def recorded_done() -> bool:
                return set(await states(http, cluster, recorded)) == {"succeeded"}

            await until(recorded_done, 60, "the early worker runs its own task")
            assert len(record_file.read_text().splitlines()) == len(recorded)
            # the other task's runs were not taken by the early worker: queued, no attempt

            async def queued() -> bool:
                return set(await states(http, cluster, waiting)) == {"queued"}

            await until(queued, 30, "the other task's runs wait, queued")
            for job_id in waiting:
                runs = (await api(http, cluster, "GET", f"/jobs/{job_id}/runs"))["runs"]
                assert [r["attempts"] for r in runs] == [[]]
            assert (await api(http, cluster, "GET", "/dlq"))["runs"] == []
            # and each says why, on every node (a follower asks the leader for its workers)
            why = "no connected worker serves task 'acc.late' on queue 'default'"
            for url in cluster.urls:
                # a follower applies what the leader committed a little later (more on a busy
                # machine): read there once it has the job
                async def applied(url: str = url) -> bool:
                    async with http.get(
                        f"{url}/api/v1/jobs/{waiting[0]}", headers=cluster.headers()
                    ) as r:
                        return r.status == 200

                await until(applied, 30, f"{url} has applied the jobs")
                job = await api(http, cluster, "GET", f"/jobs/{waiting[0]}", base=url)
                assert job["latest_run"]["waiting"] == why
                run = await api(http, cluster, "GET", f"/runs/{job['latest_run']['id']}", base=url)
                assert run["waiting"] == why
            runs = (await api(http, cluster, "GET", f"/jobs/{waiting[1]}/runs"))["runs"]
            assert [r["waiting"] for r in runs] == [why]

            cluster.start_worker("--import", "tests.acceptance.late_tasks", name="late")

            async def late_done() -> bool:
                return set(await states(http, cluster, waiting)) == {"succeeded"}

            await until(late_done, 60, "the late worker runs the waiting runs")
            for job_id in waiting:
                runs = (await api(http, cluster, "GET", f"/jobs/{job_id}/runs"))["runs"]
                assert [a["worker_id"] for a in runs[0]["attempts"]] == ["late"]
                assert runs[0]["waiting"] is None
            assert (await api(http, cluster, "GET", "/dlq"))["runs"] == []
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


async def _workers(http: aiohttp.ClientSession, cluster: Cluster, ids: set[str]) -> bool:
    try:
        workers = (await api(http, cluster, "GET", "/workers"))["workers"]
    except AssertionError:
        return False  # no leader reachable yet
    return {w["worker_id"] for w in workers} == ids
