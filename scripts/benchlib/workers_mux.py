"""Many idle workers on a three-node cluster, with 1 and with N shards: what each worker's
connection and heartbeats cost each process, and its memory.

W simulated workers (websockets of this process, speaking the worker protocol: a hello, then
a heartbeat every HB_S seconds, the default heartbeat interval, holding no lease) connect to
the nodes in turn, as workers given every node's URL spread themselves. With one shard they
are redirected to the leader and held there; with N shards the front door of the node a
worker reached holds it and a connection to each shard's leader for it (the leaders spread
over the nodes). The window starts once every worker is welcomed.
Over a window of WINDOW seconds: each process's CPU (``/proc/PID/stat``) per worker heartbeat,
its idle cost (measured before the workers connect) taken out, and its resident memory per
worker (``VmRSS`` with the workers connected, less before).

    .venv/bin/python -m scripts.benchlib.workers_mux [W] [N] [RUNS]
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from scripts.benchlib.shard_cpu import IDLE_S, children, cpu_s, leaders
from tests.cluster.harness import Cluster

HB_S = 5.0
CONNECT_S = 300.0  # the most the workers may take to be welcomed
CONNECTS_PER_S = 500  # new workers a second
WINDOW_S = 20.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def worker(
    http: aiohttp.ClientSession,
    url: str,
    token: str,
    n: int,
    stop: asyncio.Event,
    beats: list[int],
    welcomed: list[int],
    all_in: asyncio.Event,
    count: int,
) -> None:
    hello = {"type": "hello", "worker_id": f"sim-{n}", "queues": ["bench-none"], "capacity": 4}
    target, delay = url, 0.1
    while True:  # as the SDK does: a redirect followed, a failure tried again after a back-off
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            ws = await http.ws_connect(
                target + "/api/v1/workers/connect",
                headers={"Authorization": f"Bearer {token}"},
            )
            await ws.send_str(orjson.dumps(hello).decode())  # text frames, as the protocol says
            frame = await asyncio.wait_for(ws.receive(), 30)
            first = orjson.loads(frame.data) if frame.type is aiohttp.WSMsgType.TEXT else {}
        except (aiohttp.ClientError, TimeoutError, OSError):
            first = {}
        if first.get("type") == "welcome":
            break
        if ws is not None:
            await ws.close()
        target = first.get("leader") or url
        await asyncio.sleep(random.uniform(delay / 2, delay))
        delay = min(delay * 2, 5.0)
    welcomed[0] += 1
    if welcomed[0] == count:
        all_in.set()
    beat = orjson.dumps({"type": "heartbeat", "leases": []}).decode()
    reader = asyncio.create_task(_drain(ws))
    try:
        await asyncio.sleep(HB_S * (n % 1000) / 1000)  # spread over the period
        while not stop.is_set():
            await ws.send_str(beat)
            beats[0] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HB_S)
    finally:
        reader.cancel()
        await ws.close()


async def _drain(ws: aiohttp.ClientWebSocketResponse) -> None:
    async for _ in ws:
        pass


async def one(shards: int, count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="workers-mux-") as tmp:
        cluster = Cluster(Path(tmp) / "c", shards=shards)
        cluster.start()
        try:
            async with aiohttp.ClientSession() as http:
                await leaders(http, cluster, shards)
                await asyncio.sleep(10 if shards > 1 else 2)
                named = await leaders(http, cluster, shards)
            procs: dict[str, int] = {}
            for i, node in enumerate(cluster.nodes):
                assert node.proc is not None
                if shards == 1:
                    procs[f"n{i + 1}/0"] = node.proc.pid
                else:
                    procs[f"n{i + 1}/door"] = node.proc.pid
                    for k, child in children(node.proc.pid).items():
                        procs[f"n{i + 1}/{k}"] = child
            idle0 = {name: cpu_s(pid) for name, pid in procs.items()}
            await asyncio.sleep(IDLE_S)
            idle = {name: (cpu_s(pid) - idle0[name]) / IDLE_S for name, pid in procs.items()}
            rss0 = {name: rss_kib(pid) for name, pid in procs.items()}
            stop = asyncio.Event()
            all_in = asyncio.Event()
            beats, welcomed = [0], [0]
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:
                tasks = []
                for n in range(count):
                    tasks.append(
                        asyncio.create_task(
                            worker(
                                http,
                                cluster.urls[n % len(cluster.urls)],
                                cluster.token,
                                n,
                                stop,
                                beats,
                                welcomed,
                                all_in,
                                count,
                            )
                        )
                    )
                    if n % 50 == 49:
                        await asyncio.sleep(50 / CONNECTS_PER_S)
                began = time.perf_counter()
                await asyncio.wait_for(all_in.wait(), CONNECT_S)
                connect_s = time.perf_counter() - began
                await asyncio.sleep(HB_S)  # every worker beating
                before = {name: cpu_s(pid) for name, pid in procs.items()}
                start_beats, t0 = beats[0], time.perf_counter()
                await asyncio.sleep(WINDOW_S)
                elapsed = time.perf_counter() - t0
                sent = beats[0] - start_beats
                used = {
                    name: max(0.0, cpu_s(pid) - before[name] - idle[name] * elapsed)
                    for name, pid in procs.items()
                }
                rss = {name: rss_kib(pid) - rss0[name] for name, pid in procs.items()}
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            cluster.stop()
    out: dict[str, Any] = {"heartbeats_per_s": sent / elapsed, "connect_s": connect_s}
    lead = [f"{named[k]}/{k}" for k in range(shards)]
    out["leaders_us_per_beat"] = sum(used[n] for n in lead) * 1e6 / sent
    doors = [n for n in used if n.endswith("/door")]
    if doors:
        out["front_door_us_per_beat"] = sum(used[n] for n in doors) * 1e6 / sent
    out["all_us_per_beat"] = sum(used.values()) * 1e6 / sent
    out["leaders_kib_per_worker"] = sum(rss[n] for n in lead) / count
    if doors:
        out["front_door_kib_per_worker"] = sum(rss[n] for n in doors) / count
    out["all_kib_per_worker"] = sum(rss.values()) / count
    return out


async def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    results: dict[int, list[dict[str, float]]] = {1: [], n: []}
    for _ in range(runs):
        for shards in results:
            got = await one(shards, count)
            print(shards, orjson.dumps(got).decode(), flush=True)
            results[shards].append(got)
    for shards, rows in results.items():
        med = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
        print(f"shards={shards} median of {runs}: {orjson.dumps(med).decode()}")


if __name__ == "__main__":
    asyncio.run(main())
