"""The client library through a leader's death: 10,000 jobs submitted through
``schedd.client.AsyncClient`` (batching on) from 64 coroutines on a real three-node cluster whose
leader is SIGKILLed in the middle.  Every submit that returned a job id names a job that exists,
exactly once (no job is created twice, none acknowledged is lost); every one that raised says
why."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from schedd.client import AsyncClient, Job, SchedError
from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

N = 10_000
CLIENTS = 64


@pytest.mark.parametrize(
    "shards",
    [1, pytest.param(3, marks=pytest.mark.long)],  # three shards: the fault-injection tier
    ids=["one-shard", "shards3"],
)
async def test_a_leader_killed_during_10000_client_submits_loses_and_duplicates_nothing(
    tmp_path: Path, shards: int
) -> None:
    cluster = Cluster(tmp_path, size=3, shards=shards)
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)  # the others can elect when it dies
        acked: dict[int, str] = {}
        refused: dict[int, BaseException] = {}
        killed = asyncio.Event()
        async with AsyncClient(cluster.urls, token=cluster.token, retry_budget=30) as client:
            left = iter(range(N))

            async def one_client() -> None:
                for k in left:
                    try:
                        job: Job = await client.submit("acc.noop", {"k": k}, in_="1h")
                    except (SchedError, TimeoutError) as exc:
                        refused[k] = exc
                        continue
                    acked[k] = job.id
                    if len(acked) == N // 4 and not killed.is_set():
                        killed.set()
                        cluster.kill(leader)  # a quarter in: the leader dies mid-stream

            await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
            assert killed.is_set()
            # what the surviving cluster holds: every job of the task, by payload
            held: Counter[int] = Counter()
            ids: dict[int, str] = {}
            async for job in client.jobs(task="acc.noop", page_size=1000):
                held[job.payload["k"]] += 1
                ids[job.payload["k"]] = job.id
        assert len(acked) + len(refused) == N
        duplicated = {k: n for k, n in held.items() if n > 1}
        assert not duplicated, f"{len(duplicated)} payloads submitted once exist twice"
        lost = [k for k in acked if k not in held]
        assert not lost, f"{len(lost)} acknowledged jobs are missing, e.g. {lost[:5]}"
        assert all(ids[k] == job_id for k, job_id in acked.items())
        for k, exc in refused.items():
            assert str(exc).strip(), f"job {k} failed without saying why: {exc!r}"
        # with a 30 s retry budget the failover (a few seconds) is ridden out: nearly all acked
        assert len(acked) >= N * 0.99, (
            len(acked),
            Counter(type(e).__name__ for e in refused.values()),
        )
    finally:
        cluster.stop()
