"""A cluster of three shards over three nodes: each node a supervisor with one process per
shard and a front door. Jobs are spread over the shards, each job is read on every node from
its shard, listings merge every shard page after page, an idempotency key holds across the
shards, positions (X-Schedd-Index, event ids) are stamps that compare across shards, a
crashed shard process is started again, and the node's stop and death take its shards with
it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from schedd.core.events import stamp_of_ms
from schedd.ids import SHARD_CHAR, shard_of_id, shard_of_key
from schedd.protocol.headers import SHARD_HEADER
from tests.cluster.harness import BIN, Cluster, _env
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SHARDS = 3


def shard_pids(cluster: Cluster, i: int) -> dict[int, int]:
    """Node i's shard processes: {shard: pid}."""
    proc = cluster.nodes[i].proc
    assert proc is not None
    out: dict[int, int] = {}
    for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"schedd.shard.main" in argv:
            out[int(argv[argv.index(b"--shard") + 1])] = int(child)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def call(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    try:
        async with http.request(
            method,
            url,
            json=body,
            headers={**cluster.headers(), **(headers or {})},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as r:
            return r.status, await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError):
        return 0, None


async def submit(
    http: aiohttp.ClientSession, cluster: Cluster, i: int, body: dict[str, Any], rid: str
) -> dict[str, Any]:
    """Submit through node i, retried (with the same request id) until a shard's leader took
    it."""

    async def once() -> Any:
        status, doc = await call(
            http, cluster, "POST", f"{cluster.urls[i]}/api/v1/jobs", body, {"X-Request-Id": rid}
        )
        return doc if status in (200, 201) else None

    job: dict[str, Any] = await wait_for(once, 60, interval=0.2)  # a submit through node i + 1
    return job


def feed_events(text: str) -> list[tuple[str, Any, str | None]]:
    """(kind, data, id) of each event of a ``text/event-stream`` body."""
    out = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            out.append((fields["event"], orjson.loads(fields["data"]), fields.get("id")))
    return out


async def ids_keep_up(http: aiohttp.ClientSession, cluster: Cluster) -> None:
    """The merged id keeps up with the clock while one shard alone has entries: the front
    door asks the idle ones for barriers, so a client that resumes gets again only the last
    moments' events, not everything since their last entry."""
    async with http.get(
        f"{cluster.urls[0]}/api/v1/events?types=job",
        headers=cluster.headers(),
        timeout=aiohttp.ClientTimeout(total=60),
    ) as r:
        assert r.status == 200
        began = time.time()
        one = [f"busy-req-{n}" for n in range(400) if shard_of_key(f"busy-req-{n}", SHARDS) == 0]
        ids: list[int] = []

        async def read() -> None:
            async for raw in r.content:
                line = raw.decode()
                if line.startswith("id: "):
                    ids.append(int(line[4:]))

        reader = asyncio.create_task(read())
        try:
            for rid in one[:20]:  # about 5 s of submits, into shard 0 only
                job = await submit(http, cluster, 0, {"task": "t.x", "schedule": {"in": "1h"}}, rid)
                assert shard_of_id(job["id"], SHARDS) == 0
                await asyncio.sleep(0.25)  # spread over time: what the test is about
            ended = time.time()

            def kept_up() -> bool:
                return bool(ids) and ids[-1] >= stamp_of_ms(int((ended - 3) * 1000))

            await wait_for(kept_up, 10, interval=0.1)
        finally:
            reader.cancel()
        assert ended - began > 4.5, "the submits were not spread over time"


async def read_at(
    http: aiohttp.ClientSession, cluster: Cluster, url: str, job_id: str, index: str
) -> int:
    """The status of a read of ``job_id`` on ``url`` that asks for position ``index``."""
    status, _ = await call(
        http, cluster, "GET", f"{url}/api/v1/jobs/{job_id}", headers={"X-Schedd-Min-Index": index}
    )
    return status


async def commit_index(http: aiohttp.ClientSession, cluster: Cluster, shard: int) -> int:
    """Shard ``shard``'s commit index as node 0 sees it."""
    status, view = await call(
        http,
        cluster,
        "GET",
        f"{cluster.urls[0]}/api/v1/cluster",
        headers={SHARD_HEADER: str(shard)},
    )
    assert status == 200, view
    return int(view["commit_index"])


async def positions_are_stamps(
    http: aiohttp.ClientSession, cluster: Cluster, written: str, index: str
) -> None:
    """A write's X-Schedd-Index is a stamp, near the clock; a read of its own shard on the
    node that took it is answered with no entry written (no barrier: the reads are there);
    a stamp far ahead of the clock is refused at once; a merged listing carries a position."""
    now_ms = int(time.time() * 1000)
    assert stamp_of_ms(now_ms - 60_000) < int(index) <= stamp_of_ms(now_ms + 1_000), index
    shard = shard_of_id(written, SHARDS)
    before = await commit_index(http, cluster, shard)
    for _ in range(5):
        assert await read_at(http, cluster, cluster.urls[0], written, index) == 200
    assert await commit_index(http, cluster, shard) == before  # nothing written for them
    started = time.monotonic()
    ahead = stamp_of_ms(now_ms + 3_600_000)
    status, body = await call(
        http, cluster, "GET", f"{cluster.urls[1]}/api/v1/jobs/{written}?min_index={ahead}"
    )
    assert status == 503 and body["error"]["field"] == "min_index", body
    assert time.monotonic() - started < 3  # at once, not after the 5 s wait
    async with http.get(
        f"{cluster.urls[2]}/api/v1/jobs?limit=5&min_index={index}", headers=cluster.headers()
    ) as r:
        assert r.status == 200 and int(r.headers["X-Schedd-Index"]) >= int(index)


async def listing(http: aiohttp.ClientSession, cluster: Cluster, url: str, limit: int) -> list[str]:
    ids: list[str] = []
    cursor = None
    for _ in range(100):
        q = f"{url}/api/v1/jobs?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        status, page = await call(http, cluster, "GET", q)
        assert status == 200, page
        assert len(page["jobs"]) <= limit
        ids += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids
    raise AssertionError("the listing did not end")


async def test_three_shards_spread_read_list_and_dedupe_across_nodes(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", shards=SHARDS)
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            jobs = [
                await submit(
                    http,
                    cluster,
                    k % 3,
                    {"task": "t.x", "payload": {"k": k}, "schedule": {"in": "1h"}},
                    rid=f"spread-request-{k}",
                )
                for k in range(30)
            ]
            ids = [j["id"] for j in jobs]
            shards = {shard_of_id(job_id, SHARDS) for job_id in ids}
            assert shards == {0, 1, 2}, [i[SHARD_CHAR] for i in ids]
            # each job's view says its shard, as its id does
            assert all(j["shard"] == shard_of_id(j["id"], SHARDS) for j in jobs), jobs[:2]
            # a retry with the same request id, through another node, is the same job
            again = await submit(
                http,
                cluster,
                2,
                {"task": "t.x", "payload": {"k": 0}, "schedule": {"in": "1h"}},
                "spread-request-0",
            )
            assert again["id"] == ids[0]

            # every job, on every node, from its own shard there
            for url in cluster.urls:

                async def all_found(url: str = url) -> bool:
                    for job_id in ids:
                        status, _ = await call(http, cluster, "GET", f"{url}/api/v1/jobs/{job_id}")
                        if status != 200:
                            return False
                    return True

                await wait_for(all_found, 30, interval=0.2)  # every job read on url

            # the listing of every node merges the shards, page after page: each job once,
            # newest first
            for url, limit in zip(cluster.urls, (7, 4, 30), strict=True):
                listed = await listing(http, cluster, url, limit)
                assert sorted(listed) == sorted(ids), url
                assert listed == sorted(ids, reverse=True), url

            # an idempotency key is one job, whichever node each submit goes through
            keyed = [
                await submit(
                    http,
                    cluster,
                    i,
                    {"task": "t.x", "idempotency_key": "invoice-7", "schedule": {"in": "1h"}},
                    rid=f"keyed-request-{i}",
                )
                for i in range(3)
            ]
            assert len({j["id"] for j in keyed}) == 1, keyed

            # a client that carries the index of its last write (one shard's) into reads of
            # every shard, on other nodes, reads its own writes and is never kept waiting
            async with http.post(
                f"{cluster.urls[0]}/api/v1/jobs",
                json={"task": "t.x", "schedule": {"in": "1h"}},
                headers={**cluster.headers(), "X-Request-Id": "positioned-write-1"},
            ) as r:
                assert r.status == 201, await r.text()
                written = (await r.json())["id"]
                index = r.headers["X-Schedd-Index"]
            for url in cluster.urls[1:]:
                for job_id in [written, *ids[:6]]:  # jobs of every shard
                    started = time.monotonic()
                    status = await read_at(http, cluster, url, job_id, index)
                    assert status == 200 and time.monotonic() - started < 3, (status, job_id)
                listed = await call(
                    http, cluster, "GET", f"{url}/api/v1/jobs?limit=100&min_index={index}"
                )
                assert listed[0] == 200 and written in {j["id"] for j in listed[1]["jobs"]}
            await positions_are_stamps(http, cluster, written, index)

            # the change feed of every node merges every shard's: from a position taken
            # before, the jobs submitted since in every shard, once each
            async with http.get(
                f"{cluster.urls[1]}/api/v1/events?follow=false", headers=cluster.headers()
            ) as r:
                assert r.status == 200
                start = feed_events(await r.text())
            # its id is an integer, as with one shard (a stamp, which compares across shards)
            assert start[0][0] == "hello" and start[0][2].isdigit(), start
            assert start[0][1]["after"] == int(start[0][2])
            fresh = [
                (
                    await submit(
                        http,
                        cluster,
                        k % 3,
                        {"task": "t.x", "schedule": {"in": "1h"}},
                        f"feed-request-{k}",
                    )
                )["id"]
                for k in range(9)
            ]
            assert {shard_of_id(j, SHARDS) for j in fresh} == {0, 1, 2}

            async def fed() -> set[str] | None:
                async with http.get(
                    f"{cluster.urls[2]}/api/v1/events?follow=false&types=job",
                    headers={**cluster.headers(), "Last-Event-ID": start[0][2]},
                ) as r:
                    assert r.status == 200, await r.text()
                    events = feed_events(await r.text())
                seen = [j["id"] for kind, data, _ in events if kind == "job" for j in data]
                assert len(seen) == len(set(seen)), seen  # each once
                return set(seen) if set(fresh) <= set(seen) else None

            await wait_for(fed, 30, interval=0.3)  # every new job in the merged feed

            await ids_keep_up(http, cluster)

            # a cursor from another listing is refused, naming it
            status, body = await call(
                http, cluster, "GET", f"{cluster.urls[0]}/api/v1/jobs?cursor=12"
            )
            assert status == 400 and body["error"]["field"] == "cursor", body

            # /readyz names each shard's leader; /metrics holds every shard's, labelled
            status, ready = await call(http, cluster, "GET", f"{cluster.urls[1]}/readyz")
            assert status == 200 and [s["shard"] for s in ready["shards"]] == [0, 1, 2], ready
            async with http.get(f"{cluster.urls[1]}/metrics", headers=cluster.headers()) as r:
                text = await r.text()
            terms = [ln for ln in text.splitlines() if ln.startswith("schedd_raft_term{")]
            assert sorted(ln.split('"')[1] for ln in terms) == ["0", "1", "2"], terms

            # the cluster view names each shard's leader and term, in the API and schedctl
            async def led() -> Any:
                _, view = await call(http, cluster, "GET", f"{cluster.urls[2]}/api/v1/cluster")
                shards = (view or {}).get("shards") or []
                return view if len(shards) == SHARDS and all(s["leader"] for s in shards) else None

            view = await wait_for(led, 30, interval=0.2)  # every shard's leader in the cluster view
            assert [s["shard"] for s in view["shards"]] == [0, 1, 2]
            assert {s["leader"] for s in view["shards"]} <= {"n1", "n2", "n3"}, view["shards"]
            shown = await asyncio.to_thread(
                subprocess.run,
                [str(BIN / "schedctl"), "--server", cluster.urls[0], "cluster"],
                capture_output=True,
                text=True,
                env={**_env(), "SCHEDD_TOKEN": cluster.token},
                timeout=30,
            )
            assert shown.returncode == 0, shown.stderr
            table = shown.stdout.split("SHARD", 1)[1].splitlines()
            assert table[0].split() == [
                "LEADER",
                "TERM",
                "COMMIT",
                "INDEX",
                "APPLIED",
                "INDEX",
                "LAG",
            ]
            assert [row.split()[0] for row in table[1:4]] == ["0", "1", "2"], shown.stdout

            # a shard process killed is started again, and serves its jobs on that node
            pids = shard_pids(cluster, 0)
            assert sorted(pids) == [0, 1, 2]
            os.kill(pids[1], signal.SIGKILL)
            in_shard_1 = [j for j in ids if shard_of_id(j, SHARDS) == 1]

            async def restarted() -> bool:
                now = shard_pids(cluster, 0)
                if now.get(1) in (None, pids[1]):
                    return False
                status, _ = await call(
                    http, cluster, "GET", f"{cluster.urls[0]}/api/v1/jobs/{in_shard_1[0]}"
                )
                return status == 200

            await wait_for(restarted, 60, interval=0.2)  # shard 1 of node 1 started again
            assert shard_pids(cluster, 0)[0] == pids[0]  # the others ran on

            # SIGTERM: the node stops with its shards, and says so with 0
            pids = shard_pids(cluster, 1)
            cluster.kill(1, signal.SIGTERM)
            proc = cluster.nodes[1].proc
            assert proc is not None
            assert await asyncio.to_thread(proc.wait, 60) == 0
            assert not any(alive(pid) for pid in pids.values())

            # SIGKILL of the supervisor: its shards die with it (a crashed node)
            pids = shard_pids(cluster, 2)
            cluster.kill(2)

            async def gone() -> bool:
                return not any(alive(pid) for pid in pids.values())

            await wait_for(gone, 10, interval=0.2)  # node 3's shards gone with it
    finally:
        cluster.stop()
        print(cluster.logs())


async def shard_leaders(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> list[Any]:
    """Each shard's leader (a node id, or None) as node i sees them."""
    _, view = await call(http, cluster, "GET", f"{cluster.urls[i]}/api/v1/cluster")
    shards = (view or {}).get("shards") or []
    return [s["leader"] for s in shards] if len(shards) == SHARDS else [None] * SHARDS


async def one_each(http: aiohttp.ClientSession, cluster: Cluster, i: int = 0) -> list[Any] | None:
    """Each shard's leader as node i sees them, once each of the three nodes leads one (the
    leaders' balance settled); else None."""
    leaders = await shard_leaders(http, cluster, i)
    return leaders if sorted(map(str, leaders)) == ["n1", "n2", "n3"] else None


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
async def test_the_leaders_spread_over_the_nodes_and_come_back_after_a_failover(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c", shards=SHARDS)
    cluster.start()
    try:
        async with aiohttp.ClientSession() as http:
            spread = await wait_for(
                lambda: one_each(http, cluster), 60, interval=0.2
            )  # one shard led by each node
            # kill the node leading shard 0: that shard goes to another node at once ...
            victim = int(spread[0][1:]) - 1
            witness = (victim + 1) % 3
            cluster.kill(victim)

            async def moved() -> list[Any] | None:
                leaders = await shard_leaders(http, cluster, witness)
                alive_ids = {f"n{k + 1}" for k in range(3) if k != victim}
                return leaders if all(x in alive_ids for x in leaders) else None

            await wait_for(moved, 30, interval=0.2)  # every shard led by a live node
            # ... and once the node is back and caught up, it leads one shard again
            since = {k: cluster.log_size(k) for k in range(3)}
            cluster.start(victim)
            await wait_for(
                lambda: one_each(http, cluster, witness), 60, interval=0.2
            )  # one shard led by each node again
            await asyncio.sleep(8)  # more than the settle time: nothing moves any more
            assert await one_each(http, cluster, witness)
            moves = sum(
                len(cluster.log_events(k, ("leader.balancing",), since[k])) for k in range(3)
            )
            assert 1 <= moves <= 2, moves  # the shard handed back, no ping-pong
    finally:
        cluster.stop()
        print(cluster.logs())
