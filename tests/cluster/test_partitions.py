"""Real network partitions (tests/cluster/netns.py): each node and each worker in a network
namespace of its own, the test process the client on the bridge, and nftables rules that drop
the packets between two hosts - so connections hang, as across a real partition, instead of
being refused as the Raft proxy's cuts are.

- A worker cut off from the leader keeps running its lease; the lease expires, another worker
  runs the run with a higher fence, and the cut-off worker's result, sent once the partition
  heals, is refused by its fence.
- A client cut off from the leader (its requests hang) submits through the other nodes: every
  submit answered, each job once.
- The leader cut off from everyone while clients submit: the others elect a new leader, and
  when the partition heals - its connections hung all along - the old leader follows the new
  one; every acknowledged job on every node, every replica the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.client import AsyncClient
from schedd.errors import SchedError
from tests.acceptance.test_three_nodes import job_state
from tests.cluster.harness import Cluster
from tests.cluster.netns import CLIENT, NetLab, available
from tests.cluster.test_power_loss import check_every_node
from tests.cluster.test_raft_secret import new_secret
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(240),
    pytest.mark.skipif(available() is not None, reason=str(available())),
    pytest.mark.long,  # the fault-injection tier (scripts/test --long)
]

NODES = ["n1", "n2", "n3"]
HTTP_PORT = 17700  # in each namespace (the Raft port is the next one)


@contextlib.contextmanager
def partitioned(
    tmp_path: Path, workers: tuple[str, ...] = (), raft: dict[str, Any] | None = None
) -> Iterator[tuple[NetLab, Cluster]]:
    """Three nodes (and ``workers``' namespaces) in a NetLab, started; ``raft``: more [raft]
    keys for every node (the Raft secret is always set: the addresses are not loopback)."""
    with NetLab([*NODES, *workers]) as lab:
        cluster = Cluster(
            tmp_path / "c",
            hosts=[lab.ip[n] for n in NODES],
            launch=[lab.prefix(n) for n in NODES],
            http_ports=[HTTP_PORT] * len(NODES),
            raft={"secret_file": str(new_secret(tmp_path / "raft.key")), **(raft or {})},
            scheduler={"heartbeat_interval": "0.5s", "heartbeat_timeout": "3s"},
        )
        try:
            cluster.start()
            yield lab, cluster
        finally:
            cluster.stop()


def start_worker(cluster: Cluster, lab: NetLab, name: str) -> Path:
    record = cluster.root / f"exec-{name}.txt"
    cluster.start_worker(
        "--import",
        "tests.acceptance.tasks",
        name=name,
        env={"SCHEDD_TEST_RECORD": str(record)},
        prefix=lab.prefix(name),
    )
    return record


async def run_of(http: aiohttp.ClientSession, cluster: Cluster, job_id: str) -> dict[str, Any]:
    """The job's one run, from the first node that answers (an empty dict when none does)."""
    page = await job_state(http, cluster, job_id)
    return dict(page["runs"][0]) if page and page["runs"] else {}


async def test_a_worker_cut_off_from_the_leader_runs_on_and_its_late_result_is_refused(
    tmp_path: Path,
) -> None:
    with partitioned(tmp_path, workers=("w1", "w2")) as (lab, cluster):
        async with aiohttp.ClientSession() as http:
            leader = NODES[await cluster.wait_serving(http)]
            w1 = start_worker(cluster, lab, "w1")
            async with AsyncClient(cluster.urls, token=cluster.token) as client:
                job = await client.submit("acc.record", payload={"sleep": 8})

            async def leased_by_w1() -> dict[str, Any] | None:
                run = await run_of(http, cluster, job.id)
                attempts = run.get("attempts") or []
                return (
                    run
                    if run.get("state") == "running" and attempts[-1]["worker_id"] == "w1"
                    else None
                )

            run = await wait_for(leased_by_w1, timeout=30)
            fence1 = run["attempts"][-1]["fence"]
            lab.cut("w1", leader)  # its packets to and from the leader are dropped
            start_worker(cluster, lab, "w2")

            # Its lease expires (no heartbeats for 3 s); w2 runs the run, with a higher fence.
            async def done() -> dict[str, Any] | None:
                run = await run_of(http, cluster, job.id)
                return run if run.get("state") == "succeeded" else None

            run = await wait_for(done, timeout=40)
            last = run["attempts"][-1]
            assert last["worker_id"] == "w2" and last["fence"] > fence1, run
            # w1 ran on all along, cut off: it finished its execution of the old lease ...
            await wait_for(lambda: w1.exists() and f" {fence1} " in w1.read_text(), timeout=30)
            lab.heal()

            # ... and once the partition heals, its result reaches the leader and is refused.
            async def refused() -> dict[str, Any] | None:
                run = await run_of(http, cluster, job.id)
                fences = [r["fence"] for r in run.get("refused") or []]
                return run if fence1 in fences else None

            run = await wait_for(refused, timeout=60)
            assert run["state"] == "succeeded" and run["attempts"][-1]["fence"] == last["fence"]
            assert run["result"]["attempt"] == last["attempt"]  # w2's result stands


async def test_a_client_cut_off_from_the_leader_submits_through_the_other_nodes(
    tmp_path: Path,
) -> None:
    with partitioned(tmp_path) as (lab, cluster):
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)
            lab.cut(CLIENT, NODES[leader])  # the client's requests to the leader hang
            async with AsyncClient(cluster.urls, token=cluster.token, timeout=2) as client:
                jobs = await asyncio.wait_for(
                    asyncio.gather(*(client.submit("acc.record", payload={"i": i}) for i in range(30))),
                    timeout=120,
                )  # fmt: skip
            lab.heal()
            ids = [j.id for j in jobs]
            assert len(set(ids)) == 30
            held_ids = await cluster.job_ids(http, cluster.urls[leader])
            assert held_ids == set(ids)  # each job once, nothing else


async def test_a_leader_cut_off_from_everyone_follows_the_new_leader_once_healed(
    tmp_path: Path,
) -> None:
    with partitioned(tmp_path) as (lab, cluster):
        async with aiohttp.ClientSession() as http:
            old = await cluster.wait_serving(http)
            view = await cluster.view(http, old)
            assert view is not None
            term = view["term"]
            acked: list[str] = []
            failed: list[str] = []
            stop = asyncio.Event()

            async def submitter(client: AsyncClient, k: int) -> None:
                n = 0
                while not stop.is_set():
                    try:
                        job = await client.submit("acc.record", payload={"k": k, "n": n})
                        acked.append(job.id)
                    except SchedError as exc:
                        failed.append(repr(exc))
                    n += 1

            async with AsyncClient(cluster.urls, token=cluster.token, timeout=3) as client:
                tasks = [asyncio.create_task(submitter(client, k)) for k in range(4)]
                try:
                    await wait_for(lambda: len(acked) >= 20, timeout=30)
                    for other in (*[n for n in NODES if n != NODES[old]], CLIENT):
                        lab.cut(NODES[old], other)

                    async def new_leader() -> tuple[int] | None:  # (0,): node 0 is truthy
                        for i in range(len(NODES)):
                            v = await cluster.view(http, i) if i != old else None
                            if v and v["role"] == "leader" and v["term"] > term:
                                return (i,)
                        return None

                    (new,) = await wait_for(new_leader, timeout=30)
                    cut_at = len(acked)
                    await wait_for(lambda: len(acked) >= cut_at + 20, timeout=30)  # it goes on
                    lab.heal()

                    async def follows() -> bool:
                        v = await cluster.view(http, old)
                        return bool(v and v["leader"] == cluster.nodes[new].node_id)

                    await wait_for(follows, timeout=30)
                    healed_at = len(acked)
                    await wait_for(lambda: len(acked) >= healed_at + 20, timeout=30)
                finally:
                    stop.set()
                    await asyncio.gather(*tasks, return_exceptions=True)
            assert not failed, failed[:5]  # every submit answered, through the others
            await check_every_node(http, cluster, acked)
