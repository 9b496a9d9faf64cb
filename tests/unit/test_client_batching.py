"""``AsyncClient``'s batching and retries against a small fake API (an aiohttp app on loopback):
size and linger bounds, each caller's own error, a lost reply sent again under the same
X-Request-Id, a batch over the burst split, a cancelled caller leaving the others alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from schedd.client import AsyncClient, InvalidArgument, RateLimited


@dataclass
class Fake:
    url: str = ""
    batches: list[list[Any]] = field(default_factory=list)  # the jobs of each batch request
    request_ids: list[str] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    #: called with the request's jobs before answering; returns a response to send instead
    hook: Callable[[list[Any], web.Request], web.StreamResponse | None] | None = None
    slow_first: float = 0.0  # seconds the first batch takes to be answered
    leader_url: str | None = None  # what GET /cluster says


def job(k: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"J{k}", "task": body["task"], "status": "active", "payload": body.get("payload")}


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    async with serving() as state:
        yield state


@pytest.fixture
async def other() -> AsyncIterator[Fake]:
    async with serving() as state:
        yield state


@asynccontextmanager
async def serving() -> AsyncIterator[Fake]:
    state = Fake()
    count = 0

    async def batch(request: web.Request) -> web.StreamResponse:
        nonlocal count
        jobs = (await request.json())["jobs"]
        state.batches.append(jobs)
        state.request_ids.append(request.headers["X-Request-Id"])
        state.sent_at.append(asyncio.get_running_loop().time())
        if state.slow_first and len(state.batches) == 1:
            await asyncio.sleep(state.slow_first)
        if state.hook is not None and (answer := state.hook(jobs, request)) is not None:
            return answer
        out = []
        for body in jobs:
            count += 1
            out.append(job(count, body))
        return web.json_response({"jobs": out}, status=201)

    async def cluster(request: web.Request) -> web.Response:
        return web.json_response({"leader_url": state.leader_url})

    app = web.Application()
    app.router.add_post("/api/v1/jobs/batch", batch)
    app.router.add_get("/api/v1/cluster", cluster)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


def error(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return web.json_response({"error": body}, status=status)


async def test_batches_are_bounded_by_size(fake: Fake) -> None:
    async with AsyncClient(fake.url, batch_size=10, linger=0.5) as client:
        jobs = await asyncio.gather(*(client.submit("t", {"k": k}) for k in range(25)))
    assert sorted(len(b) for b in fake.batches) == [5, 10, 10]
    assert [j.payload for j in jobs] == [{"k": k} for k in range(25)]  # each its own


async def test_a_lone_submit_goes_at_once_and_others_wait_for_the_batch_on_its_way(
    fake: Fake,
) -> None:
    loop = asyncio.get_running_loop()
    fake.slow_first = 0.6
    async with AsyncClient(fake.url, linger=10) as client:
        began = loop.time()
        first = asyncio.ensure_future(client.submit("t", 1))
        await asyncio.sleep(0.1)  # the first is on its way; these queue behind it
        rest = [asyncio.ensure_future(client.submit("t", k)) for k in (2, 3)]
        await asyncio.gather(first, *rest)
    assert fake.sent_at[0] - began < 0.1  # nothing was on the way: sent at once
    assert [len(b) for b in fake.batches] == [1, 2]
    # the two went when the first was answered, long before their linger of 10 s
    assert 0.55 <= fake.sent_at[1] - began < 5.0


async def test_while_a_batch_is_on_its_way_the_linger_bounds_the_wait(fake: Fake) -> None:
    loop = asyncio.get_running_loop()
    fake.slow_first = 2.0
    async with AsyncClient(fake.url, linger=0.3) as client:
        first = asyncio.ensure_future(client.submit("t", 1))
        await asyncio.sleep(0.05)
        queued_at = loop.time()
        second = asyncio.ensure_future(client.submit("t", 2))
        await asyncio.gather(first, second)
    waited = fake.sent_at[1] - queued_at
    assert 0.29 <= waited < 1.5, waited  # sent when its linger ran out, not after the first


async def test_a_job_the_server_refuses_fails_alone_and_the_rest_is_sent_again(
    fake: Fake,
) -> None:
    def refuse_the_second(jobs: list[Any], request: web.Request) -> web.Response | None:
        for i, body in enumerate(jobs):
            if body.get("payload") == "bad":
                return error(
                    400, "invalid_argument", f"jobs[{i}].payload: too odd", f"jobs[{i}].payload"
                )
        return None

    fake.hook = refuse_the_second
    async with AsyncClient(fake.url, linger=0.05) as client:
        results = await asyncio.gather(
            client.submit("t", "a"),
            client.submit("t", "bad"),
            client.submit("t", "c"),
            return_exceptions=True,
        )
    ok_a, bad, ok_c = results
    assert isinstance(bad, InvalidArgument)
    assert (bad.field, bad.message) == ("payload", "payload: too odd")  # its own field
    assert getattr(ok_a, "payload", None) == "a" and getattr(ok_c, "payload", None) == "c"
    assert [len(b) for b in fake.batches] == [3, 2]
    assert fake.request_ids[0] != fake.request_ids[1]  # another request: another id


async def test_a_lost_reply_is_sent_again_with_the_same_request_id(fake: Fake) -> None:
    def drop_the_first(jobs: list[Any], request: web.Request) -> web.StreamResponse | None:
        if len(fake.batches) == 1:
            assert request.transport is not None
            request.transport.close()  # applied, but the reply never comes
            return web.Response()
        return None

    fake.hook = drop_the_first
    async with AsyncClient([fake.url, fake.url], linger=0.01) as client:
        j = await client.submit("t", {"k": 1})
    assert j.payload == {"k": 1}
    assert len(fake.request_ids) == 2 and fake.request_ids[0] == fake.request_ids[1]
    assert fake.batches[0] == fake.batches[1]  # the same bytes: the cluster applies it once


async def test_a_batch_over_the_burst_is_split(fake: Fake) -> None:
    def burst_of_two(jobs: list[Any], request: web.Request) -> web.Response | None:
        if len(jobs) > 2:
            return error(429, "resource_exhausted", "the batch is larger than the burst")
        return None

    fake.hook = burst_of_two
    async with AsyncClient(fake.url, linger=0.05) as client:
        jobs = await asyncio.gather(*(client.submit("t", k) for k in range(5)))
    assert [j.payload for j in jobs] == list(range(5))
    assert sorted(len(b) for b in fake.batches if len(b) <= 2) == [1, 2, 2]


async def test_rate_limited_with_retry_after_waits_then_succeeds_else_raises(fake: Fake) -> None:
    def limited(jobs: list[Any], request: web.Request) -> web.Response | None:
        if len(fake.batches) == 1:
            return web.json_response(
                {"error": {"code": "resource_exhausted", "message": "over the rate"}},
                status=429,
                headers={"Retry-After": "0.2"},
            )
        return None

    fake.hook = limited
    async with AsyncClient(fake.url, linger=0.01) as client:
        assert (await client.submit("t", 1)).payload == 1
    fake.batches.clear()
    fake.hook = lambda jobs, request: web.json_response(
        {"error": {"code": "resource_exhausted", "message": "over the rate"}},
        status=429,
        headers={"Retry-After": "60"},
    )
    async with AsyncClient(fake.url, linger=0.01, retry_budget=1) as client:
        with pytest.raises(RateLimited) as exc:
            await client.submit("t", 1)
    assert exc.value.retry_after == 60


async def test_a_cancelled_caller_does_not_cancel_the_others(fake: Fake) -> None:
    fake.slow_first = 0.3
    async with AsyncClient(fake.url, linger=10) as client:
        first = asyncio.ensure_future(client.submit("t", "first"))
        await asyncio.sleep(0.05)  # on its way: the next ones queue
        keep = [asyncio.ensure_future(client.submit("t", k)) for k in range(3)]
        gone = asyncio.ensure_future(client.submit("t", "gone"))
        await asyncio.sleep(0.05)
        gone.cancel()
        done = await asyncio.gather(*keep)
        await first
    assert [j.payload for j in done] == [0, 1, 2]
    assert fake.batches[1] == [{"task": "t", "payload": k} for k in range(3)]


async def test_writes_go_first_to_the_leader_the_cluster_names(fake: Fake, other: Fake) -> None:
    # the first server listed is a follower; it names the other as the leader
    fake.leader_url = other.url
    async with AsyncClient([fake.url, other.url], linger=0.01) as client:
        await asyncio.gather(*(client.submit("t", k) for k in range(3)))
    assert fake.batches == [] and len(other.batches) == 1
