"""A rolling upgrade from the previous release, under load, with the real binaries.

Three ``schedd`` nodes of the previous release (:data:`PREVIOUS_RELEASE`, built into a
virtualenv of its own by ``tests/acceptance/upgrade.py``) compact into format-1 snapshots (a
whole SQLite copy as ``raft/raft.dump``); a ``schedd-worker`` runs a recurring job every
second; a client submits one-off jobs at a steady rate throughout, each submit timed and its
job id recorded once acknowledged.  The nodes are upgraded one at a time to this tree, the
followers first and the leader last: SIGTERM (the leader hands over), the same data directory
started with this tree's ``schedd``, and the next only once the node has caught up (its applied
index at the leader's commit index).

Rollback, on the first follower upgraded: once it has compacted (``raft.dump`` is a marker) the
previous release refuses its data directory, naming the file, and leaves it as it was; emptied,
the node is rebuilt by the previous release from the leader (still on the previous release),
and then upgraded again.

At the end every acknowledged job is on every node exactly once (one job per submit, none
twice), every one-off job succeeded, the recurring job went on firing after the last upgrade,
once per fire, each fire executed once per fence, and no submit waited longer than
:data:`MAX_SUBMIT_S`."""

from __future__ import annotations

import asyncio
import collections
import itertools
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.client import AsyncClient, Job, SchedError
from tests.acceptance.upgrade import PREVIOUS_RELEASE, release_bin
from tests.cluster.harness import REPO, Cluster
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.long,  # an upgrade under load, a minute: the fault-injection tier
    pytest.mark.timeout(480),  # the previous release's virtualenv is built on the first run
    pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the repository's history"),
]

RATE = 15.0  # one-off submits a second
MAX_SUBMITS = 5_000
MAX_SUBMIT_S = 10.0  # the longest a submit may take, its retries included
SETTLE_S = 5.0  # load between one upgrade and the next
# Compaction every 2 s (or 200 entries): a node down for a restart usually misses a compaction
# of the leader's and is sent a whole copy, and an upgraded node writes its marker soon.
RAFT = {"log_compaction_min_entries": 200, "log_compaction_min_time": "2s"}
SCHEDULER = {"heartbeat_interval": "0.5s", "heartbeat_timeout": "3s"}
SQLITE = b"SQLite format 3\x00"  # a format-1 raft.dump: a whole copy of the state database
MARKER = b"SCHDMARK"


@dataclass
class Load:
    """One-off submits at :data:`RATE` a second, open loop, each timed; submit k to
    ``queues[k % len(queues)]``."""

    client: AsyncClient
    queues: tuple[str, ...] = ("default",)
    acked: dict[int, str] = field(default_factory=dict)  # submit number -> job id
    failed: dict[int, BaseException] = field(default_factory=dict)
    #: (monotonic start, seconds until acknowledged) of every acknowledged submit
    timings: list[tuple[float, float]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def one(self, k: int) -> None:
        started = time.monotonic()
        try:
            job: Job = await self.client.submit(
                "acc.record",
                {"k": k, "sleep": 0},
                queue=self.queues[k % len(self.queues)],
                heartbeat_timeout="3s",
            )
        except (SchedError, TimeoutError, aiohttp.ClientError) as exc:
            self.failed[k] = exc
            return
        self.acked[k] = job.id
        self.timings.append((started, time.monotonic() - started))

    async def run(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        began = time.monotonic()
        for k in range(MAX_SUBMITS):
            if self.stop.is_set():
                break
            task = asyncio.create_task(self.one(k))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, began + (k + 1) / RATE - time.monotonic()))
        await asyncio.gather(*pending)

    def latencies(self, since: float, until: float) -> list[float]:
        return sorted(s for at, s in self.timings if since <= at <= until)


async def start_load(cluster: Cluster, client: AsyncClient) -> tuple[Job, Load, asyncio.Task[None]]:
    """A worker running ``acc.record`` 16 at once, a job recurring every second (``tick``)
    and the steady one-off submits of :class:`Load`, started."""
    cluster.start_worker(
        "--import", "tests.acceptance.tasks", "--concurrency", "16", "--drain-timeout", "1"
    )
    tick = await client.submit(
        "acc.record", {"sleep": 0}, every="1s", name="tick", heartbeat_timeout="3s"
    )
    load = Load(client)
    return tick, load, asyncio.create_task(load.run())


def dump_kind(cluster: Cluster, i: int) -> str:
    """What node i's ``raft/raft.dump`` is: "copy" (format 1, the previous release's), "marker"
    (this tree's), "" when it has none yet."""
    try:
        with open(cluster.data_dir(i) / "raft" / "raft.dump", "rb") as f:
            head = f.read(len(SQLITE))
    except FileNotFoundError:
        return ""
    return "copy" if head == SQLITE else "marker" if head.startswith(MARKER) else repr(head)


async def until(what: str, check: Any, timeout: float, cluster: Cluster) -> Any:
    """:func:`tests.conftest.wait_for`, failing with what was awaited and the nodes' logs."""
    try:
        return await wait_for(check, timeout, interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}\n{cluster.logs()}") from None


async def stop_node(cluster: Cluster, i: int, timeout: float = 30.0) -> int:
    """SIGTERM node i and wait (without blocking the load) until it has exited; its status."""
    proc = cluster.nodes[i].proc
    assert proc is not None
    cluster.kill(i, signal.SIGTERM)
    await until(
        f"{cluster.nodes[i].node_id} stops", lambda: proc.poll() is not None, timeout, cluster
    )
    return int(proc.returncode)


async def caught_up(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> None:
    """Node i serves, follows the leader, and has applied what the leader had committed once
    node i answered."""
    node_id = cluster.nodes[i].node_id

    async def answers() -> dict[str, Any] | None:
        assert cluster.nodes[i].alive, f"{node_id} exited\n{cluster.logs()}"
        return await cluster.view(http, i)

    await until(f"{node_id} answers", answers, 30, cluster)
    leader = await cluster.wait_leader(http)
    if leader == i:
        return
    lead = await cluster.view(http, leader)
    assert lead is not None
    target, lead_id = lead["commit_index"], cluster.nodes[leader].node_id

    async def applied() -> bool:
        view = await answers()
        return bool(view and view["leader"] == lead_id and view["applied_index"] >= target)

    await until(f"{node_id} applies the leader's index {target}", applied, 30, cluster)


async def upgrade(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    i: int,
    release: Path | None = None,
    caught: Callable[[aiohttp.ClientSession, Cluster, int], Awaitable[None]] | None = None,
) -> tuple[float, float]:
    """Stop node i with SIGTERM and start its data directory again with ``release`` (this
    tree when None); (seconds to stop, seconds from the start until ``caught`` up, by default
    :func:`caught_up`)."""
    started = time.monotonic()
    code = await stop_node(cluster, i)
    assert code == 0, f"{cluster.nodes[i].node_id} exited {code}\n{cluster.logs()}"
    stopped = time.monotonic()
    if release is None:
        cluster.bins.pop(i, None)
    else:
        cluster.bins[i] = release
    cluster.start(i)
    await (caught or caught_up)(http, cluster, i)
    return stopped - started, time.monotonic() - stopped


async def node_jobs(cluster: Cluster, i: int) -> list[Job]:
    async with AsyncClient(cluster.urls[i], token=cluster.token, retry_budget=5) as one:
        return [job async for job in one.jobs(page_size=1000)]


def executions(record: Path) -> list[tuple[str, int, int]]:
    """The worker's executions: (run id, fence, wall-clock ms)."""
    out = []
    for line in record.read_text().splitlines():
        run_id, fence, _, ms = line.split()
        out.append((run_id, int(fence), int(ms)))
    return out


def ran_since(record: Path, job_id: str, since_ms: int) -> int:
    """How many times the worker ran ``job_id``'s runs from wall-clock ``since_ms`` on."""
    return sum(r.startswith(f"{job_id}@") and ms >= since_ms for r, _, ms in executions(record))


def p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(len(values) * 0.99))] if values else 0.0


async def test_rolling_upgrade_from_the_previous_release_under_load(
    tmp_path: Path, timed_record: Path
) -> None:
    built = time.monotonic()
    previous = release_bin(PREVIOUS_RELEASE)
    build_s = time.monotonic() - built
    began = time.monotonic()
    cluster = Cluster(tmp_path / "cluster", raft=RAFT, scheduler=SCHEDULER)
    cluster.bins.update({i: previous for i in range(3)})
    load_task: asyncio.Task[None] | None = None
    try:
        cluster.start()
        async with (
            aiohttp.ClientSession() as http,
            AsyncClient(
                cluster.urls, token=cluster.token, retry_budget=30, timeout=5, batching=False
            ) as client,
        ):
            leader = await cluster.wait_serving(http)
            tick, load, load_task = await start_load(cluster, client)

            # The previous release compacts into whole copies (format 1) on every node.
            await until(
                "every node writes a format-1 raft.dump",
                lambda: all(dump_kind(cluster, i) == "copy" for i in range(3)),
                30,
                cluster,
            )
            followers = [i for i in range(3) if i != leader]
            first = followers[0]
            upgrade_began = time.monotonic()
            rejoin: list[tuple[str, float, float, int]] = []  # node, stop s, rejoin s, copies

            async def upgraded(i: int) -> None:
                since = cluster.log_size(i)
                stop_s, rejoin_s = await upgrade(http, cluster, i)
                installs = cluster.log_events(i, ("raft.snapshot_install",), since)
                rejoin.append((cluster.nodes[i].node_id, stop_s, rejoin_s, len(installs)))
                await asyncio.sleep(SETTLE_S)

            # -- the first follower, and going back from it --------------------------------
            await upgraded(first)
            await until(
                "the upgraded follower writes a marker",
                lambda: dump_kind(cluster, first) == "marker",
                20,
                cluster,
            )
            assert await stop_node(cluster, first) == 0
            going_back = time.monotonic()
            log_from = cluster.log_size(first)
            cluster.bins[first] = previous
            cluster.start(first)
            proc = cluster.nodes[first].proc
            assert proc is not None
            refused = await until(
                "the previous release refuses the upgraded data directory",
                lambda: proc.poll() is not None,
                30,
                cluster,
            )
            assert refused and proc.returncode != 0
            said = cluster.nodes[first].log.read_bytes()[log_from:].decode(errors="replace")
            # its state database was migrated to a schema the release does not know (and its
            # compaction marker is not a whole copy): refused, naming why, changing nothing
            assert "it was written by a newer schedd" in said, said
            assert dump_kind(cluster, first) == "marker"  # left as it was
            # Emptied, the node is rebuilt by the previous release from the leader.
            cluster.wipe(first)
            cluster.start(first)
            await caught_up(http, cluster, first)
            await until(
                "the rebuilt node compacts in format 1",
                lambda: dump_kind(cluster, first) == "copy",
                20,
                cluster,
            )
            back_s = time.monotonic() - going_back

            # -- the followers, then the leader ----------------------------------------------
            await upgraded(first)
            await upgraded(followers[1])
            await upgraded(leader)
            last_upgraded, last_ms = time.monotonic(), time.time_ns() // 1_000_000
            assert cluster.log_events(leader, ("leader.handed_over",)), cluster.logs()
            await cluster.wait_serving(http)

            # The recurring job fires on after the last upgrade, and the worker runs it.
            await until(
                "the recurring job runs after the last upgrade",
                lambda: ran_since(timed_record, tick.id, last_ms) >= 3,
                20,
                cluster,
            )
            load.stop.set()
            await asyncio.wait_for(load_task, 60)
            upgrade_s = last_upgraded - upgrade_began

            # -- every node holds every acknowledged job exactly once ------------------------
            assert not load.failed, {k: repr(e) for k, e in list(load.failed.items())[:5]}
            acked = load.acked
            acked_ids = set(acked.values())
            assert len(acked_ids) == len(acked), "a job id acknowledged twice"
            for i in range(3):
                assert dump_kind(cluster, i) == "marker", cluster.nodes[i].node_id

                async def holds_all(i: int = i) -> list[Job] | None:
                    jobs = await node_jobs(cluster, i)
                    ids = {j.id for j in jobs}
                    return jobs if ids >= {*acked_ids, tick.id} else None

                jobs = await until(f"node {i} holds every job", holds_all, 30, cluster)
                ids = [j.id for j in jobs]
                assert len(ids) == len(set(ids)), f"node {i} lists a job twice"
                per_submit = collections.Counter(
                    j.payload["k"] for j in jobs if isinstance(j.payload, dict) and "k" in j.payload
                )
                twice = {k: n for k, n in per_submit.items() if n > 1}
                assert not twice, f"node {i}: submits that made more than one job: {twice}"
                held = {j.id: j.payload["k"] for j in jobs if j.id in acked_ids}
                assert held == {v: k for k, v in acked.items()}, f"node {i}: a job not as acked"

            # -- every one-off job ran to success, each fence executed once -----------------
            leader_now = await cluster.wait_leader(http)

            async def all_succeeded() -> bool:
                jobs = await node_jobs(cluster, leader_now)
                done = {j.id for j in jobs if j.latest_run and j.latest_run.state == "succeeded"}
                return acked_ids <= done

            await until("every one-off job succeeds", all_succeeded, 60, cluster)
            ran = executions(timed_record)
            fences = collections.Counter((r, f) for r, f, _ in ran)
            again = {key: n for key, n in fences.items() if n > 1}
            assert not again, f"a run's fence executed more than once: {again}"

            # -- the recurring job: one run per fire, each run's fences executed once --------
            async def ticked_after() -> bool:  # it went on firing after the last upgrade
                done = [
                    r
                    async for r in client.runs(tick.id, page_size=500)
                    if r.state == "succeeded"
                    and r.scheduled_at
                    and r.scheduled_at.timestamp() * 1000 >= last_ms
                ]
                return len(done) >= 3

            await until(
                "three runs of the recurring job after the upgrades", ticked_after, 30, cluster
            )
            runs = [run async for run in client.runs(tick.id, page_size=500)]
            scheduled = sorted(r.scheduled_at for r in runs if r.scheduled_at is not None)
            assert len(scheduled) == len(runs) == len(set(scheduled)), "a fire made two runs"
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(scheduled)]
            assert min(gaps) >= 0.99, f"two fires less than the interval apart: {min(gaps)}s"
            for run in runs:
                fenced = [a.fence for a in run.attempts]
                assert fenced == sorted(set(fenced)), run
                assert sum(a.outcome == "succeeded" for a in run.attempts) <= 1, run
            tick_runs = {r for r, _, _ in ran if r.startswith(f"{tick.id}@")}
            assert tick_runs <= {r.id for r in runs}
            after = [
                r for r in runs if r.scheduled_at and r.scheduled_at.timestamp() * 1000 >= last_ms
            ]
            assert sum(r.state == "succeeded" for r in after) >= 3

            # -- the load saw a bounded unavailability ---------------------------------------
            during = load.latencies(upgrade_began, last_upgraded)
            worst = max(s for _, s in load.timings)
            assert worst < MAX_SUBMIT_S, f"a submit took {worst:.1f}s"
        total_s = time.monotonic() - began
        print(
            f"\nprevious release {PREVIOUS_RELEASE[:7]} (virtualenv {build_s:.1f}s); "
            f"{len(acked)} jobs acknowledged, {len(runs)} runs of the recurring job; "
            f"stop, then rejoin: "
            + ", ".join(f"{n} {a:.1f}+{b:.1f}s ({c} copies)" for n, a, b, c in rejoin)
            + f"; the first follower back on the previous release {back_s:.1f}s; "
            f"upgrade {upgrade_s:.1f}s; submits during it p50 {during[len(during) // 2]:.3f}s "
            f"p99 {p99(during):.3f}s max {worst:.3f}s; total {total_s:.1f}s"
        )
    finally:
        if load_task is not None and not load_task.done():
            load_task.cancel()
        cluster.stop()
