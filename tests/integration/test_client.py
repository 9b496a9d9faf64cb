"""``schedd.client`` against a real node: submits batched by themselves (each caller its own job
or its own error, a cancelled caller leaving the others alone), typed results and errors, every
call the CLI makes, the synchronous client from many threads."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import aiohttp
import pytest

from schedd.client import (
    AsyncClient,
    Client,
    InvalidArgument,
    Job,
    NotFound,
    Unreachable,
)
from schedd.protocol import messages
from tests.conftest import Node
from tests.integration.test_worker_protocol import API, connect


class Counting:
    """Counts the API requests a client makes, by method and path (wraps its transport)."""

    def __init__(self, client: AsyncClient) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        real = client.request

        async def counted(method: str, path: str, **kw: Any) -> Any:
            self.seen[(method, path)] += 1
            return await real(method, path, **kw)

        client.request = counted  # type: ignore[method-assign]


async def test_concurrent_submits_are_batched_and_each_caller_gets_its_own_job(node: Node) -> None:
    async with AsyncClient(node.url, token=node.token, batch_size=50, linger=0.05) as client:
        counting = Counting(client)
        jobs = await asyncio.gather(
            *(client.submit("t", {"k": k}, in_="1h", name=f"b{k}") for k in range(120))
        )
        assert [j.payload for j in jobs] == [{"k": k} for k in range(120)]
        assert len({j.id for j in jobs}) == 120
        assert all(isinstance(j, Job) and j.status == "active" for j in jobs)
        # 120 jobs in batches of at most 50: three requests, not 120
        assert counting.seen == Counter({("POST", f"{API}/jobs/batch"): 3})
        # and they exist, each once
        names = Counter([j.name async for j in client.jobs(task="t")])
        assert names == Counter({f"b{k}": 1 for k in range(120)})


async def test_one_bad_job_fails_alone_and_a_cancelled_caller_leaves_the_others(
    node: Node,
) -> None:
    async with AsyncClient(node.url, token=node.token, batch_size=100, linger=0.05) as client:
        good = [asyncio.ensure_future(client.submit("t", {"n": k})) for k in range(3)]
        # the server refuses this one (its depends_on names no job): only its caller hears
        bad = asyncio.ensure_future(client.submit("t", depends_on=["no-such-job"]))
        gone = asyncio.ensure_future(client.submit("t", {"n": "gone"}))
        await asyncio.sleep(0)  # queued, not yet sent
        gone.cancel()
        with pytest.raises(NotFound) as refused:
            await bad
        assert refused.value.field == "depends_on[0]"  # its own field, not jobs[3].…
        assert "no-such-job" in refused.value.message
        done = await asyncio.gather(*good)
        assert [j.payload for j in done] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert gone.cancelled()
        payloads = [j.payload async for j in client.jobs(task="t")]
        assert {"n": "gone"} not in payloads and len(payloads) == 3
        # a mistake is caught before anything is sent, naming the field
        with pytest.raises(InvalidArgument) as typo:
            await client.submit("t", priorty="high")
        assert typo.value.field == "priorty"
        with pytest.raises(InvalidArgument) as when:
            await client.submit("t", in_="soon")
        assert when.value.field == "schedule.in"


async def test_without_batching_each_submit_is_a_request(node: Node) -> None:
    async with AsyncClient(node.url, token=node.token, batching=False) as client:
        counting = Counting(client)
        await asyncio.gather(*(client.submit("t", {"k": k}) for k in range(5)))
        assert counting.seen == Counter({("POST", f"{API}/jobs"): 5})


async def test_every_call_of_the_cli(node: Node, http: aiohttp.ClientSession) -> None:
    w = await connect(http, node, "w-client", capacity=2)
    async with AsyncClient([node.url], token=node.token) as client:
        job = await client.submit(
            "t", {"x": 1}, cron="0 9 * * *", timezone="Europe/Berlin", name="nine"
        )
        assert job.schedule is not None and job.schedule["timezone"] == "Europe/Berlin"
        assert (await client.get(job.id)).name == "nine"
        fires = await client.explain(job.id, count=2)
        assert len(fires) == 2 and fires[0]["local"].endswith(("+01:00", "+02:00"))
        every = await client.explain(every="90m", from_="2030-01-01T00:00:00Z", count=1)
        assert every[0]["scheduled_at"].startswith("2030-01-01T01:30")
        assert (await client.pause(job.id)).status == "paused"
        assert (await client.resume(job.id)).status == "active"
        updated = await client.update(job.id, priority="high")
        assert updated.raw["priority"] == "high"
        run = await client.trigger(job.id, override=True)
        lease = await w.expect(messages.Lease)
        assert lease.run_id == run.id
        await w.send(messages.Complete(run_id=run.id, fence=lease.fence, result={"ok": 1}))
        finished = await client.wait(run.id, timeout=10)
        assert finished.succeeded and finished.result == {"ok": 1}
        assert finished.attempts[0].worker_id == "w-client"
        assert [r.id async for r in client.runs(job.id, state="succeeded")] == [run.id]
        one = await client.submit("t", retry={"max_attempts": 1})
        lease = await w.expect(messages.Lease)
        await w.send(
            messages.Fail(run_id=lease.run_id, fence=lease.fence, error="boom", retryable=False)
        )
        dead = await client.wait(one.id, timeout=10)
        assert dead.state == "failed"
        assert [r.id async for r in client.dead_letters(task="t")] == [dead.id]
        await client.drop(dead.id)
        await client.cancel(job.id)
        assert (await client.get(job.id)).status == "cancelled"
        assert (await client.cluster())["nodes"]
        with pytest.raises(NotFound):
            await client.get("01J0000000000000000000000X")
        with pytest.raises(TimeoutError):
            await client.wait((await client.submit("t", in_="1h")).id, timeout=0.3)
    await w.ws.close()


def test_the_sync_client_batches_submits_from_many_threads(node_url_token: tuple[str, str]) -> None:
    url, token = node_url_token
    with Client(url, token=token, linger=0.05) as client:
        counting = Counting(client._async)
        out: list[Job] = []
        lock = threading.Lock()

        def submit(k: int) -> None:
            job = client.submit("t", {"k": k}, in_="1h")
            with lock:
                out.append(job)

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(j.payload["k"] for j in out) == list(range(20))
        assert counting.seen[("POST", f"{API}/jobs/batch")] < 20  # coalesced
        assert len(list(client.jobs(page_size=7))) == 20  # pages followed
        newest = [j.id for j in client.jobs(page_size=7)]
        oldest = [j.id for j in client.jobs(page_size=7, order="asc")]
        assert newest == oldest[::-1] and set(newest) == {j.id for j in out}
        soonest = [j.next_run_at for j in client.jobs(page_size=7, sort="next_fire")]
        assert len(soonest) == 20 and soonest == sorted(soonest)  # type: ignore[type-var]
        with pytest.raises(NotFound):
            client.get("01J0000000000000000000000X")


def test_no_server_is_unreachable_in_the_budget() -> None:
    with Client("http://127.0.0.1:9", retry_budget=0.5) as client:
        with pytest.raises(Unreachable) as exc:
            client.cluster()
    assert "127.0.0.1:9" in str(exc.value)


@pytest.fixture
def node_url_token(tmp_path: Any) -> Any:
    """A real node on a loop in another thread, for the synchronous client's tests."""
    from tests.conftest import start_node

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    n = asyncio.run_coroutine_threadsafe(start_node(tmp_path / "n1"), loop).result(30)
    try:
        yield n.url, n.token
    finally:
        asyncio.run_coroutine_threadsafe(n.rt.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_task_handle_submits_its_task(node_url_token: tuple[str, str]) -> None:
    from schedd.client import tasks
    from schedd.worker import Registry

    url, token = node_url_token

    @Registry().task("reports.generate")
    async def generate(ctx: Any, payload: Any) -> Any:
        return payload

    tasks.configure(url, token=token, linger=0.01)
    try:
        job = generate.submit({"report": "sales"}, in_="10m")
        assert (job.task, job.payload) == ("reports.generate", {"report": "sales"})
        assert generate.delay({"n": 2}).task == "reports.generate"

        async def from_asyncio() -> Job:
            try:
                return await generate.asubmit({"n": 3}, in_="1h")
            finally:
                await tasks.aclose()

        assert asyncio.run(from_asyncio()).payload == {"n": 3}
        assert asyncio.run(generate(None, "called")) == "called"  # still the handler
    finally:
        tasks.configure(None)


async def test_wait_follows_the_event_stream_instead_of_polling(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w-wait", capacity=1)
    async with AsyncClient(node.url, token=node.token) as client:
        job = await client.submit("t", {"x": 1})
        lease = await w.expect(messages.Lease)
        counting = Counting(client)
        waiting = asyncio.ensure_future(client.wait(lease.run_id, timeout=20))
        await asyncio.sleep(1.5)  # idle: a poller would ask ~8 times meanwhile
        assert not waiting.done()
        asked_while_idle = counting.seen[("GET", f"{API}/runs/{lease.run_id.replace('@', '%40')}")]
        await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence, result=7))
        run = await waiting
        assert (run.state, run.result, run.job_id) == ("succeeded", 7, job.id)
        assert asked_while_idle <= 1, counting.seen  # once when the stream began
    await w.ws.close()
