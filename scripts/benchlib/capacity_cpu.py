"""What one ``capacity`` frame costs a leader: the CPU of a single node (one shard, its own
leader) per frame while one worker connection sends it FRAMES ``capacity`` messages,
alternating between two values so that each changes what the leader may lease, against
the same count of heartbeats (holding no lease) on another connection: the frame that every
worker sends anyway.

With several shards, a front door sends a worker's ``capacity`` to every other shard's leader
each time one of its slots is taken or freed (schedd/shard/mux.py): 2 * (N - 1) frames per
run across the leaders, about 4 per run per leader with three shards.  This prices them.

    .venv/bin/python -m scripts.benchlib.capacity_cpu [FRAMES] [RUNS]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from scripts.benchlib.shard_cpu import IDLE_S, cpu_s
from tests.cluster.harness import Cluster

BATCH = 50  # frames sent before waiting for the leader to have read them (a ping)


async def connect(
    http: aiohttp.ClientSession, url: str, token: str, n: int
) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(
        url + "/api/v1/workers/connect", headers={"Authorization": f"Bearer {token}"}
    )
    hello = {"type": "hello", "worker_id": f"cap-{n}", "queues": ["bench-none"], "capacity": 64}
    await ws.send_str(orjson.dumps(hello).decode())
    first = orjson.loads((await asyncio.wait_for(ws.receive(), 30)).data)
    assert first.get("type") == "welcome", first
    return ws


async def send(ws: aiohttp.ClientWebSocketResponse, frames: list[str]) -> None:
    for start in range(0, len(frames), BATCH):
        for text in frames[start : start + BATCH]:
            await ws.send_str(text)
        await ws.ping()  # (the server answers pings after reading what came before)
        await asyncio.sleep(0)


async def one_run(frames: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="capcpu-") as tmp:
        cluster = Cluster(Path(tmp), size=1)
        cluster.start()
        try:
            async with aiohttp.ClientSession() as http:
                await cluster.wait_serving(http)
                pid = cluster.nodes[0].proc.pid  # type: ignore[union-attr]
                ws = await connect(http, cluster.urls[0], cluster.token, 1)
                t0, c0 = time.monotonic(), cpu_s(pid)
                await asyncio.sleep(IDLE_S)
                idle = (cpu_s(pid) - c0) / (time.monotonic() - t0)
                out: dict[str, float] = {}
                kinds = {
                    "capacity": [
                        orjson.dumps({"type": "capacity", "capacity": 63 + i % 2}).decode()
                        for i in range(frames)
                    ],
                    "heartbeat": [orjson.dumps({"type": "heartbeat", "leases": []}).decode()]
                    * frames,
                }
                for kind, texts in kinds.items():
                    t0, c0 = time.monotonic(), cpu_s(pid)
                    await send(ws, texts)
                    await asyncio.sleep(0.5)  # what is still being read
                    spent = cpu_s(pid) - c0 - idle * (time.monotonic() - t0)
                    out[kind] = spent / frames * 1e6
                await ws.close()
                return out
        finally:
            cluster.stop()


async def main(frames: int, runs: int) -> None:
    results = [await one_run(frames) for _ in range(runs)]
    for kind in ("capacity", "heartbeat"):
        values = [r[kind] for r in results]
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{kind}: median {statistics.median(values):.1f} µs of leader CPU a frame ({shown})")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [20_000, 3][len(args) :])))
