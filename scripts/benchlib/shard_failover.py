"""A node that leads shards SIGKILLed under load, in a cluster of N shards on three nodes: the
first dispatch of every affected shard after the kill.  Target: p99 ≤ 1 s per affected shard,
and nothing acknowledged lost.

Load: one ``schedd-worker`` (``bench.failover``, scripts/benchlib/tasks.py: it records each
handler start with its job id and lease fence) given every node's URL, and an open-loop
generator of run-now jobs at RATE a second, round robin over the nodes that are up.  Kill n
SIGKILLs the node leading shard n mod N, once the leaders are spread (no node leads two
shards; with one shard, the worker is on another node than its leader at the start).  For each shard it led, the **first dispatch**
is the time from the kill to the first handler start of a run of that shard leased by the
shard's next leader: its lease fence above that leader's claim (``leader.ready ... fence=F``
logged by the node that leads the shard next).  The node is started again and the leaders
spread again before the next kill.  At the end every acknowledged job must have started.

    .venv/bin/python -m scripts.benchlib.shard_failover [KILLS] [N]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from schedd.ids import shard_of_id
from tests.cluster.harness import BIN, Cluster

RATE = 40.0  # jobs a second
_READY = re.compile(r"^(\S+) INFO \S+ leader\.ready (?:shard=(\d+) )?fence=(\d+)")


async def shard_leaders(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    try:
        async with http.get(f"{url}/api/v1/cluster", headers=headers) as r:
            view = await r.json()
        if "shards" not in view:  # one shard
            return [view["leader"]] if view.get("role") else None
        return [s["leader"] for s in view["shards"]]
    except (aiohttp.ClientError, KeyError, ValueError, TypeError):
        return None


async def spread(http: aiohttp.ClientSession, cluster: Cluster, up: list[int]) -> list[str]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for i in up:
            named = await shard_leaders(http, cluster.urls[i], cluster.headers())
            if named and None not in named and len(set(named)) == len(named):
                return list(named)
        await asyncio.sleep(0.3)
    raise RuntimeError("the leaders did not spread")


def starts(path: Path) -> list[tuple[float, str, int]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((float(parts[0]), parts[1], int(parts[2])))
    return out


def ready_after(cluster: Cluster, shard: int, since: float) -> int | None:
    """The claim fence of the first node to log ``leader.ready`` of ``shard`` after ``since``
    (an epoch time)."""
    found: list[tuple[float, int]] = []
    for node in cluster.nodes:
        if not node.log.exists():
            continue
        for line in node.log.read_text(errors="replace").splitlines():
            m = _READY.match(line)
            if m and int(m[2] or 0) == shard:
                stamp = datetime.fromisoformat(m[1]).timestamp()
                if stamp >= since - 0.001:
                    found.append((stamp, int(m[3])))
    return min(found)[1] if found else None


async def load(
    cluster: Cluster, up: list[int], acked: list[str], stop: asyncio.Event, shards: int
) -> None:
    body = orjson.dumps({"task": "bench.failover", "heartbeat_timeout": "10s"})
    turn = itertools.count()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def one(k: int) -> None:
            rid = f"shard-failover-{os.getpid()}-{k:08d}"
            for _ in range(40):
                i = up[next(turn) % len(up)]
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.post(
                        cluster.urls[i] + "/api/v1/jobs",
                        data=body,
                        headers={**cluster.headers(), "X-Request-Id": rid},
                    ) as r:
                        if r.status in (200, 201):
                            acked.append((await r.json())["id"])
                            return
                await asyncio.sleep(0.25)

        tasks: set[asyncio.Task[None]] = set()
        for k in itertools.count():
            if stop.is_set():
                break
            task = asyncio.create_task(one(k))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / RATE)
        await asyncio.gather(*tasks, return_exceptions=True)


async def main() -> None:
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    shards = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    keep = os.environ.get("SCHEDD_BENCH_KEEP")  # a directory to keep the cluster's files in
    with (
        contextlib.nullcontext(keep)
        if keep
        else tempfile.TemporaryDirectory(prefix="shard-failover-") as tmp
    ):
        cluster = Cluster(Path(tmp) / "c", shards=shards)
        record = Path(tmp) / "starts.txt"
        cluster.start()
        dispatch: list[float] = []
        acked: list[str] = []
        try:
            async with aiohttp.ClientSession() as http:
                named = await spread(http, cluster, [0, 1, 2])
                home = next(i for i in range(3) if f"n{i + 1}" != named[0])
                cluster.spawn(
                    [
                        str(BIN / "schedd-worker"),
                        f"--token={cluster.token}",
                        *(f"--server={cluster.urls[(home + j) % 3]}" for j in range(3)),
                        "--concurrency=64",
                        "--import=scripts.benchlib.tasks",
                        "--log-level=warning",
                        "--worker-id=bench-shard-failover",
                    ],
                    cluster.root / "worker.log",
                    env={"SCHEDD_BENCH_LAG": str(record)},
                )
                up = [0, 1, 2]
                stop = asyncio.Event()
                gen = asyncio.create_task(load(cluster, up, acked, stop, shards))
                await asyncio.sleep(5)
                for n in range(kills):
                    while True:  # the leaders spread, and still so 2 s later (balance done)
                        named = await spread(http, cluster, [0, 1, 2])
                        await asyncio.sleep(2)
                        if await spread(http, cluster, [0, 1, 2]) == named:
                            break
                    victim = int(str(named[n % shards])[1:]) - 1
                    led = [k for k, who in enumerate(named) if who == f"n{victim + 1}"]
                    up[:] = [i for i in (0, 1, 2) if i != victim]
                    t_kill = time.time()
                    cluster.kill(victim)
                    for shard in led:
                        deadline = time.monotonic() + 30
                        first = None
                        while time.monotonic() < deadline and first is None:
                            await asyncio.sleep(0.2)
                            claim = ready_after(cluster, shard, t_kill)
                            if claim is None:
                                continue
                            later = [
                                t
                                for t, job, fence in starts(record)
                                if fence > claim and shard_of_id(job, shards) == shard
                            ]
                            first = min(later) if later else None
                        if first is None:
                            raise RuntimeError(f"shard {shard}: no dispatch within 30 s")
                        dispatch.append(first - t_kill)
                        print(
                            f"kill {n + 1}: n{victim + 1} led shard {shard}: first dispatch "
                            f"{first - t_kill:.2f}s",
                            flush=True,
                        )
                    cluster.start(victim)
                    up[:] = [0, 1, 2]
                    await asyncio.sleep(3)
                stop.set()
                await gen
                deadline = time.monotonic() + 60
                started = set()
                while time.monotonic() < deadline:
                    started = {job for _, job, _ in starts(record)}
                    if set(acked) <= started:
                        break
                    await asyncio.sleep(1)
                lost = sorted(set(acked) - started)
        finally:
            cluster.stop()
    dispatch.sort()
    p99 = dispatch[min(len(dispatch) - 1, int(len(dispatch) * 0.99))]
    print(
        orjson.dumps(
            {
                "shards": shards,
                "kills": kills,
                "affected_shards": len(dispatch),
                "first_dispatch_p50_s": round(statistics.median(dispatch), 3),
                "first_dispatch_p99_s": round(p99, 3),
                "first_dispatch_max_s": round(dispatch[-1], 3),
                "acked": len(acked),
                "lost": len(lost),
            }
        ).decode()
    )


if __name__ == "__main__":
    asyncio.run(main())
