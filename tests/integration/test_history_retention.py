"""History retention on a real node (``[history]``): a finished one-off job is forgotten after
the retention, and an every-second job never keeps more than ``max_runs_per_job``
finished runs; what is forgotten is counted in the metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from schedd.protocol import messages
from tests.conftest import start_node, wait_for
from tests.integration.test_api import get
from tests.integration.test_worker_protocol import connect, runs, submit


async def test_finished_history_is_forgotten_and_bounded_per_job(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    node = await start_node(
        tmp_path / "n1", dispatch_ahead="0s", history={"retention": "1s", "max_runs_per_job": 2}
    )
    try:
        w = await connect(http, node, "w-history", capacity=4)

        completed: list[str] = []

        async def work() -> None:
            while True:
                lease = await w.expect(messages.Lease, timeout=30)
                await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
                completed.append(lease.run_id)

        worker = asyncio.create_task(work())
        try:
            once = await submit(http, node, {"task": "t"})
            rec = await submit(http, node, {"task": "t", "schedule": {"every": "1s"}})

            async def forgotten() -> bool:
                return (await get(http, node, f"/jobs/{once['id']}"))[0] == 404

            await wait_for(forgotten, timeout=20)
            assert (await get(http, node, f"/runs/{once['latest_run']['id']}"))[0] == 404

            async def finished(n: int) -> bool:
                done = [r for r in await runs(http, node, rec["id"]) if r["state"] == "succeeded"]
                return len(done) >= n

            await wait_for(lambda: finished(2), timeout=20)

            async def five_finished_two_kept() -> bool:  # one finishes a second
                done = [r for r in await runs(http, node, rec["id"]) if r["state"] == "succeeded"]
                assert len(done) <= 2, done
                return sum(r.startswith(f"{rec['id']}@") for r in completed) >= 5

            await wait_for(five_finished_two_kept, timeout=20)
            metrics = node.rt.metrics.exposition().decode()
            assert 'schedd_history_purged_total{kind="jobs"} 1.0' in metrics
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            await w.ws.close()
    finally:
        await node.rt.stop()
