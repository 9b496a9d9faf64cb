"""``GET /api/v1/events`` across a failover on three real nodes: a client that follows the
leader, loses it to SIGKILL and resumes on another node with ``Last-Event-ID`` ends with every
run's latest change exactly as a client that followed a surviving node all along saw it (same
entry, same state): no run event is lost, and every node sends the same events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.test_failover import submit, wait_states
from tests.sse import Stream

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

NO_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None)


def runs_seen(stream: Stream) -> dict[str, tuple[int, str]]:
    """Each run's latest change in the stream so far: run id -> (index, state)."""
    out: dict[str, tuple[int, str]] = {}
    for event in stream.events:
        if event.kind == "run":
            for change in event.data:
                out[change["id"]] = (change["index"], change["state"])
    return out


async def follow(stream: Stream, progress: asyncio.Condition) -> None:
    """Read until the stream ends (its node died), telling ``progress`` of each event."""
    with contextlib.suppress(aiohttp.ClientError, ConnectionError):
        while await stream.next(timeout=120) is not None:
            async with progress:
                progress.notify_all()


async def until(progress: asyncio.Condition, predicate: Callable[[], bool], timeout: float) -> None:
    async with progress:
        await asyncio.wait_for(progress.wait_for(predicate), timeout)


async def test_a_client_resumes_on_another_node_after_the_leader_dies_and_loses_no_run_event(
    tmp_path: Path,
) -> None:
    cluster = Cluster(
        tmp_path / "c", scheduler={"heartbeat_interval": "0.5s", "heartbeat_timeout": "3s"}
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession(timeout=NO_TIMEOUT) as http:
            a = await cluster.wait_serving(http)  # b and c can elect when a dies
            b, c = (i for i in range(3) if i != a)
            headers = cluster.headers()
            progress = asyncio.Condition()
            async with (
                http.get(cluster.nodes[a].url + "/api/v1/events", headers=headers) as on_a,
                http.get(cluster.nodes[c].url + "/api/v1/events", headers=headers) as on_c,
            ):
                client, observer = Stream(on_a), Stream(on_c)
                hello = await client.until("hello")
                assert (await observer.until("hello")).id is not None
                reading = [
                    asyncio.create_task(follow(client, progress)),
                    asyncio.create_task(follow(observer, progress)),
                ]
                cluster.start_worker(
                    "--import",
                    "tests.acceptance.tasks",
                    "--concurrency",
                    "8",
                    env={"SCHEDD_TEST_RECORD": str(tmp_path / "executions.txt")},
                )
                body: dict[str, Any] = {"task": "acc.record", "payload": {"sleep": 0.2}}
                ids = [await submit(http, cluster, body) for _ in range(30)]
                await until(
                    progress,
                    lambda: sum(s == "succeeded" for _, s in runs_seen(client).values()) >= 5,
                    60,
                )
                cluster.kill(a)  # SIGKILL: the client's stream ends mid-flight
                await asyncio.wait_for(reading[0], 30)
                resume_from = client.last_id
                assert resume_from is not None and resume_from > hello.id
                before = runs_seen(client)
                ids += [await submit(http, cluster, body) for _ in range(30)]
                async with http.get(
                    cluster.nodes[b].url + "/api/v1/events",
                    headers={**headers, "Last-Event-ID": str(resume_from)},
                ) as on_b:
                    resumed = Stream(on_b)
                    again = await resumed.until("hello")
                    assert again.id == resume_from  # no reset: node b holds what came since
                    reading.append(asyncio.create_task(follow(resumed, progress)))
                    final = await wait_states(http, cluster, ids, {"succeeded"}, timeout=90)
                    expected = {runs[0]["id"] for runs in final.values()}

                    def caught_up() -> bool:
                        seen = {**before, **runs_seen(resumed)}
                        return all(
                            seen.get(r, (0, ""))[1] == "succeeded"
                            and runs_seen(observer).get(r, (0, ""))[1] == "succeeded"
                            for r in expected
                        )

                    await until(progress, caught_up, 30)
                    for task in reading:
                        task.cancel()
                    await asyncio.gather(*reading, return_exceptions=True)
            client_view = {**before, **runs_seen(resumed)}
            all_along = runs_seen(observer)
            assert {r: client_view.get(r) for r in expected} == {
                r: all_along.get(r) for r in expected
            }, cluster.logs()
            assert all(state == "succeeded" for _, state in client_view.values())
            # every change the resumed stream sent came after where the client left off
            assert all(
                change["index"] > resume_from
                for event in resumed.events
                if event.kind in ("job", "run", "dlq")
                for change in event.data
            )
    finally:
        cluster.stop()
