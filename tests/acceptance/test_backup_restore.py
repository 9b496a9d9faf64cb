"""A backup an operator can trust, with the real binaries: three ``schedd`` nodes and a
``schedd-worker``; one-off jobs (done, delayed), a recurring job, a job with an idempotency key
and a run in flight; ``schedctl snapshot save``; more jobs after the save; every node stopped
and its data directory wiped; ``schedd restore`` on each node, at new addresses, from the same
file; the three started again.

Then every job acknowledged before the save is there exactly once, on every node, and none of
those acknowledged after it; an idempotency key remembered at the save still returns its job
(one used after the save does not); the recurring job fires again and the worker runs it; and
the run that was in flight at the save is ended as lost and retried with a new fence."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster.harness import BIN, Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]


def ctl(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    argv = [str(BIN / "schedctl"), f"--token={cluster.token}"]
    for url in cluster.urls:
        argv += ["--server", url]
    done = subprocess.run([*argv, *args], capture_output=True, timeout=60, cwd=cluster.root)
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def submit(cluster: Cluster, *args: str) -> dict[str, Any]:
    job: dict[str, Any] = orjson.loads(ctl(cluster, "-o", "json", "submit", *args).stdout)
    return job


def restore_node(config: Path, backup: Path) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "schedd"), "restore", "--from", str(backup), "--config", str(config)]
    return subprocess.run(argv, capture_output=True, timeout=60, text=True)


async def get(http: aiohttp.ClientSession, url: str, path: str, token: str) -> Any:
    async with http.get(
        url + "/api/v1" + path,
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=10),
    ) as r:
        assert r.status == 200, (url, path, r.status, await r.text())
        return await r.json()


async def all_jobs(http: aiohttp.ClientSession, url: str, token: str) -> list[dict[str, Any]]:
    """Every job the node at ``url`` lists, page after page (duplicates kept)."""
    jobs: list[dict[str, Any]] = []
    cursor = ""
    for _ in range(100):
        page = await get(
            http, url, "/jobs?limit=7" + (f"&cursor={cursor}" if cursor else ""), token
        )
        jobs += page["jobs"]
        cursor = page["next_cursor"] or ""
        if not cursor:
            return jobs
    raise AssertionError("more than 100 pages")


async def until(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.2)


def executions(record: Path, job_id: str, since_ms: int = 0) -> list[list[str]]:
    """The worker's executions of the job's runs (run id, fence, attempt, ms) from ``since_ms``."""
    lines = [line.split() for line in record.read_text().splitlines()]
    return [f for f in lines if f[0].startswith(f"{job_id}@") and int(f[3]) >= since_ms]


async def runs_of(http: aiohttp.ClientSession, cluster: Cluster, job_id: str) -> list[Any]:
    page = await get(http, cluster.urls[0], f"/jobs/{job_id}/runs", cluster.token)
    runs: list[Any] = page["runs"]
    return runs


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
async def test_save_lose_every_node_restore_from_the_file(
    tmp_path: Path, timed_record: Path
) -> None:
    settings = {"heartbeat_interval": "0.5s", "heartbeat_timeout": "3s"}
    root = tmp_path / "cluster"
    cluster = Cluster(root, scheduler=settings)
    backup = tmp_path / "backups" / "nightly.snap"
    backup.parent.mkdir()
    worker = ("--import", "tests.acceptance.tasks", "--concurrency", "8", "--drain-timeout", "1")
    restored: Cluster | None = None
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_serving(http)
            cluster.start_worker(*worker)

            # -- before the save ----------------------------------------------------------------
            done = [
                submit(cluster, "acc.record", "--payload", '{"sleep": 0}')["id"] for _ in range(4)
            ]
            later = [submit(cluster, "acc.record", "--in", "1h")["id"] for _ in range(3)]
            tick = submit(
                cluster,
                "acc.record",
                "--every",
                "2s",
                "--payload",
                '{"sleep": 0}',
                "--name",
                "tick",
            )["id"]
            keyed = submit(cluster, "acc.record", "--in", "1h", "--idempotency-key", "invoice-7")
            in_flight = submit(
                cluster, "acc.record", "--payload", '{"sleep": 10}', "--heartbeat-timeout", "3s"
            )["id"]
            before = {*done, *later, tick, keyed["id"], in_flight}

            async def settled() -> bool:
                finished = [(await runs_of(http, cluster, j))[0]["state"] for j in done]
                ticks = await runs_of(http, cluster, tick)
                flight = await runs_of(http, cluster, in_flight)
                return (
                    finished == ["succeeded"] * len(done)
                    and sum(r["state"] == "succeeded" for r in ticks) >= 2
                    and flight[0]["state"] == "running"
                )

            await until("the jobs ran, the tick fired twice, a run is in flight", settled)
            in_flight_fence = (await runs_of(http, cluster, in_flight))[0]["attempts"][0]["fence"]

            # -- the save -----------------------------------------------------------------------
            started = time.monotonic()
            saved = ctl(cluster, "-o", "json", "snapshot", "save", str(backup))
            save_s = time.monotonic() - started
            summary = orjson.loads(saved.stdout)
            assert summary["counts"]["jobs"] == len(before)
            assert summary["bytes"] == backup.stat().st_size
            assert backup.stat().st_mode & 0o777 == 0o600
            inspected = ctl(cluster, "snapshot", "inspect", str(backup)).stdout.decode()
            assert f"applied index: {summary['applied_index']}\n" in inspected
            assert f"jobs:          {len(before)}\n" in inspected

            # -- after the save: acknowledged, and lost with the cluster ------------------------
            after = {submit(cluster, "acc.record", "--in", "1h")["id"] for _ in range(3)}
            after.add(
                submit(cluster, "acc.record", "--in", "1h", "--idempotency-key", "invoice-8")["id"]
            )
            lived = time.monotonic()

        # -- every node lost ------------------------------------------------------------------
        cluster.stop()
        wiped = [cluster.wipe(i) for i in range(3)]
        assert all("raft/state.db" in gone for gone in wiped), wiped
        for i in range(3):
            assert not list(cluster.data_dir(i).rglob("*"))

        # -- three new nodes at new addresses, each restored from the same file ---------------
        restored = Cluster(root, scheduler=settings)  # new ports; the same data directories
        assert set(restored.urls).isdisjoint(cluster.urls)
        restore_s = []
        for node in restored.nodes:
            started = time.monotonic()
            done_ = restore_node(node.config, backup)
            restore_s.append(time.monotonic() - started)
            assert done_.returncode == 0, done_.stderr
            assert f"applied index {summary['applied_index']}" in done_.stdout
            assert done_.stdout.splitlines()[1].startswith("next: restore every other node")
        restored.start()
        back, back_ms = time.monotonic(), time.time_ns() // 1_000_000
        async with aiohttp.ClientSession() as http:
            await restored.wait_serving(http)
            serving_s = time.monotonic() - back
            restored.start_worker(*worker)

            # every job acknowledged before the save, exactly once, on every node; none after
            for url in restored.urls:

                async def applied(url: str = url) -> list[dict[str, Any]] | None:
                    jobs = await all_jobs(http, url, restored.token)
                    return jobs if {j["id"] for j in jobs} >= before else None

                jobs = await until(f"{url} lists the jobs", applied)
                ids = [j["id"] for j in jobs]
                assert len(ids) == len(set(ids)), f"{url} lists a job twice"
                assert set(ids) == before, (url, set(ids) ^ before)
                assert not set(ids) & after

            # an idempotency key remembered at the save returns its job; one used after, not
            again = ctl(
                restored,
                "-o", "json", "submit", "acc.record", "--in", "1h", "--idempotency-key", "invoice-7",
            )  # fmt: skip
            assert orjson.loads(again.stdout)["id"] == keyed["id"]
            assert b"already exists" in again.stderr
            fresh = submit(restored, "acc.record", "--in", "1h", "--idempotency-key", "invoice-8")
            assert fresh["id"] not in after

            # the recurring job fires again, and the worker runs it
            async def ticking() -> bool:
                return len(executions(timed_record, tick, since_ms=back_ms)) >= 2

            await until("the recurring job runs after the restore", ticking)

            # the run in flight at the save: its lease is lost, the run retried with a new fence
            async def retried() -> list[dict[str, Any]] | None:
                run = (await runs_of(http, restored, in_flight))[0]
                attempts = run["attempts"]
                return attempts if len(attempts) >= 2 and attempts[1]["fence"] else None

            attempts = await until("the run in flight at the save is retried", retried)
            assert attempts[0]["fence"] == in_flight_fence
            assert attempts[0]["outcome"] == "lost", attempts[0]
            assert attempts[1]["fence"] > in_flight_fence

            async def rerun() -> bool:
                return any(
                    int(f[1]) == attempts[1]["fence"] for f in executions(timed_record, in_flight)
                )

            await until("the worker runs the retried attempt", rerun)

            async def succeeded() -> bool:
                return bool((await runs_of(http, restored, in_flight))[0]["state"] == "succeeded")

            await until("the retried run succeeds", succeeded)
    finally:
        if restored is not None:
            restored.stop()
        cluster.stop()
    print(
        f"save {save_s:.2f}s ({summary['bytes']} bytes, {len(before)} jobs); restore "
        f"{', '.join(f'{s:.2f}' for s in restore_s)}s; serving {serving_s:.1f}s after start; "
        f"cluster lived {back - lived:.1f}s after the save"
    )
