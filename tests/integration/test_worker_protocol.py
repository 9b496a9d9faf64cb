"""The worker websocket protocol against a real one-node cluster, spoken frame by frame."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from schedd.protocol import messages
from tests.conftest import Node, running_node, wait_for

API = "/api/v1"


class RawWorker:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, msg: messages.Message) -> None:
        await self.ws.send_str(messages.encode(msg))

    async def recv(self, timeout: float = 10.0) -> messages.Message:
        frame = await self.ws.receive(timeout=timeout)
        assert frame.type is aiohttp.WSMsgType.TEXT, frame
        return messages.decode(frame.data)

    async def expect(self, kind: type[Any], timeout: float = 10.0) -> Any:
        while True:
            msg = await self.recv(timeout)
            if isinstance(msg, kind):
                return msg


async def connect(
    http: aiohttp.ClientSession,
    node: Node,
    worker_id: str,
    capacity: int = 1,
    resume: tuple[messages.LeaseRef, ...] = (),
    tasks: tuple[str, ...] | None = None,
) -> RawWorker:
    ws = await http.ws_connect(node.url + API + "/workers/connect", headers=node.headers())
    w = RawWorker(ws)
    await w.send(
        messages.Hello(
            worker_id=worker_id, queues=("default",), capacity=capacity, resume=resume, tasks=tasks
        )
    )
    welcome = await w.expect(messages.Welcome)
    assert welcome.node_id == "n1"
    return w


async def submit(http: aiohttp.ClientSession, node: Node, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(
        node.url + API + "/jobs", data=orjson.dumps(body), headers=node.headers()
    ) as r:
        assert r.status == 201, await r.text()
        job: dict[str, Any] = await r.json()
        return job


async def runs(http: aiohttp.ClientSession, node: Node, job_id: str) -> list[dict[str, Any]]:
    async with http.get(node.url + API + f"/jobs/{job_id}/runs", headers=node.headers()) as r:
        out: list[dict[str, Any]] = (await r.json())["runs"]
        return out


async def committed(node: Node) -> None:
    """Wait until the node's reads see every entry applied so far: a worker's result, a fire
    or a lease becomes visible to the API up to ``LAZY_COMMIT_S`` after it was applied (and
    acknowledged)."""
    applied = node.rt.node.applied_index
    await wait_for(lambda: node.rt.node.state_index >= applied, timeout=5)


async def committed_runs(
    http: aiohttp.ClientSession, node: Node, job_id: str
) -> list[dict[str, Any]]:
    """The job's runs as the API shows them once everything applied so far is visible."""
    await committed(node)
    return await runs(http, node, job_id)


@pytest.fixture
async def fast_node(tmp_path: Any) -> AsyncIterator[Node]:
    async with running_node(
        tmp_path / "n1", heartbeat_interval="0.2s", heartbeat_timeout="1s"
    ) as n:
        yield n


async def test_lease_complete_ack(node: Node, http: aiohttp.ClientSession) -> None:
    w = await connect(http, node, "w1")
    job = await submit(http, node, {"task": "t", "payload": {"a": 1}, "idempotency_key": "k1"})
    lease = await w.expect(messages.Lease)
    assert (lease.job_id, lease.task, lease.payload, lease.attempt) == (job["id"], "t", {"a": 1}, 1)
    assert lease.idempotency_key == "k1" and lease.fence > 0
    await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence, result={"ok": 1}))
    ack = await w.expect(messages.Ack)
    assert ack.run_id == lease.run_id and ack.accepted
    [run] = await committed_runs(http, node, job["id"])
    assert run["state"] == "succeeded" and run["result"] == {"ok": 1}
    assert run["attempts"][0]["fence"] == lease.fence and run["attempts"][0]["worker_id"] == "w1"
    await w.ws.close()


async def test_pull_never_exceeds_capacity(node: Node, http: aiohttp.ClientSession) -> None:
    w = await connect(http, node, "w1", capacity=2)
    for _ in range(5):
        await submit(http, node, {"task": "t"})
    first = [await w.expect(messages.Lease), await w.expect(messages.Lease)]
    with pytest.raises(asyncio.TimeoutError):
        await w.expect(messages.Lease, timeout=0.5)
    await w.send(messages.Complete(run_id=first[0].run_id, fence=first[0].fence))
    await w.expect(messages.Ack)
    third = await w.expect(messages.Lease)
    assert third.run_id not in {x.run_id for x in first}
    await w.ws.close()


async def test_stale_worker_result_is_refused_after_its_lease_is_lost(
    fast_node: Node, http: aiohttp.ClientSession
) -> None:
    node = fast_node
    stale = await connect(http, node, "stale")
    job = await submit(
        http,
        node,
        {"task": "t", "heartbeat_timeout": "1s", "retry": {"initial": "0.05s", "jitter": False}},
    )
    old = await stale.expect(messages.Lease)
    await stale.send(messages.Drain())  # takes nothing new, and never heartbeats: its lease is lost
    await wait_for(lambda: _state_is(http, node, job["id"], {"retrying", "queued"}), timeout=10)
    fresh = await connect(http, node, "fresh")
    new = await fresh.expect(messages.Lease)
    assert new.run_id == old.run_id and new.fence > old.fence and new.attempt == 2
    await stale.send(messages.Complete(run_id=old.run_id, fence=old.fence, result="stale"))
    refused = await stale.expect(messages.Ack)
    assert not refused.accepted and "fence" in (refused.reason or "")
    await fresh.send(messages.Complete(run_id=new.run_id, fence=new.fence, result="fresh"))
    assert (await fresh.expect(messages.Ack)).accepted
    [run] = await committed_runs(http, node, job["id"])
    assert run["result"] == "fresh"
    assert [a["outcome"] for a in run["attempts"]] == ["lost", "succeeded"]
    # the refused result stays with the run, for its timeline
    [refusal] = run["refused"]
    assert (refusal["fence"], refusal["worker_id"], refusal["outcome"]) == (
        old.fence,
        "stale",
        "succeeded",
    )
    assert refusal["reason"] == refused.reason and refusal["at"] >= run["attempts"][1]["started_at"]
    for w in (stale, fresh):
        await w.ws.close()


async def _state_is(http: aiohttp.ClientSession, node: Node, job_id: str, states: set[str]) -> bool:
    return (await runs(http, node, job_id))[0]["state"] in states


async def test_heartbeats_keep_a_lease_alive(fast_node: Node, http: aiohttp.ClientSession) -> None:
    node = fast_node
    w = await connect(http, node, "w1")
    job = await submit(http, node, {"task": "t", "heartbeat_timeout": "1s"})
    lease = await w.expect(messages.Lease)
    for _ in range(12):  # 2.4 s of heartbeats: more than twice the timeout
        await w.send(
            messages.Heartbeat(leases=(messages.LeaseRef(run_id=lease.run_id, fence=lease.fence),))
        )
        await asyncio.sleep(0.2)
    assert await _state_is(http, node, job["id"], {"running"})
    await w.send(
        messages.Fail(run_id=lease.run_id, fence=lease.fence, error="nope", retryable=False)
    )
    assert (await w.expect(messages.Ack)).accepted
    [run] = await committed_runs(http, node, job["id"])
    assert run["state"] == "failed" and run["error"] == "nope"
    async with http.get(node.url + API + "/dlq", headers=node.headers()) as r:
        assert [x["id"] for x in (await r.json())["runs"]] == [run["id"]]
    await w.ws.close()


async def test_reconnecting_worker_resumes_its_lease(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w1")
    job = await submit(http, node, {"task": "t"})
    lease = await w.expect(messages.Lease)
    await w.ws.close()
    again = await connect(
        http, node, "w1", resume=(messages.LeaseRef(run_id=lease.run_id, fence=lease.fence),)
    )
    await again.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
    assert (await again.expect(messages.Ack)).accepted
    [run] = await committed_runs(http, node, job["id"])
    assert len(run["attempts"]) == 1 and run["state"] == "succeeded"
    # Resuming a lease that does not exist is answered with cancel.
    bogus = await connect(http, node, "w2", resume=(messages.LeaseRef(run_id="nope@1", fence=3),))
    cancel = await bogus.expect(messages.Cancel)
    assert cancel.run_id == "nope@1"
    for x in (again, bogus):
        await x.ws.close()


async def test_bad_frames_get_an_error_not_a_disconnect(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w1")
    await w.ws.send_str("{not json")
    err = await w.expect(messages.Error)
    assert err.code == "invalid_argument"
    await w.ws.send_str('{"type": "heartbeat", "leases": [{"run_id": 5}]}')
    err = await w.expect(messages.Error)
    assert "run_id" in err.message
    await w.send(messages.Heartbeat(leases=()))  # still connected and served
    await submit(http, node, {"task": "t"})
    assert isinstance(await w.expect(messages.Lease), messages.Lease)
    await w.ws.close()


async def test_worker_needs_the_worker_role(node: Node, http: aiohttp.ClientSession) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
        await http.ws_connect(node.url + API + "/workers/connect")
    assert exc.value.status == 401


async def test_a_run_past_its_timeout_is_cancelled_and_counts_as_a_failed_attempt(
    fast_node: Node, http: aiohttp.ClientSession
) -> None:
    node = fast_node
    w = await connect(http, node, "w1")
    job = await submit(
        http,
        node,
        {
            "task": "t",
            "timeout": "0.5s",
            "retry": {"max_attempts": 2, "initial": "0.05s", "jitter": False},
        },
    )
    lease = await w.expect(messages.Lease)
    assert lease.deadline is not None
    for _ in range(20):  # keeps heartbeating: alive, but past its deadline
        await w.send(
            messages.Heartbeat(leases=(messages.LeaseRef(run_id=lease.run_id, fence=lease.fence),))
        )
        try:
            cancel = await w.expect(messages.Cancel, timeout=0.1)
            break
        except TimeoutError:
            continue
    assert cancel.run_id == lease.run_id and cancel.fence == lease.fence
    retry = await w.expect(messages.Lease)
    assert retry.run_id == lease.run_id and retry.attempt == 2
    [run] = await committed_runs(http, node, job["id"])
    assert run["attempts"][0]["outcome"] == "timed_out"
    await w.ws.close()


async def test_fuzzed_frames_never_wedge_the_node(node: Node, http: aiohttp.ClientSession) -> None:
    import random

    import orjson

    rng = random.Random(20261125)
    valid = [
        messages.encode(x)
        for x in (
            messages.Heartbeat(leases=(messages.LeaseRef(run_id="a@1", fence=1),)),
            messages.Complete(run_id="a@1", fence=1, result={"x": 1}),
            messages.Fail(run_id="a@1", fence=2, error="e", retryable=False),
            messages.Drain(),
            messages.Hello(worker_id="w", queues=("default",), capacity=1, resume=()),
        )
    ]

    def frame() -> str | bytes:
        kind = rng.randrange(5)
        if kind == 0:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        if kind == 1:
            text = rng.choice(valid)
            return text[: rng.randrange(len(text))]
        if kind == 2:
            obj = orjson.loads(rng.choice(valid))
            key = rng.choice(list(obj))
            obj[key] = rng.choice([None, -1, 2**62, "x" * 1000, [], {}, 1.5, True])
            return orjson.dumps(obj).decode()
        if kind == 3:
            return '{"type": "' + rng.choice(["lease", "ack", "welcome", "nope", ""]) + '"}'
        return rng.choice(valid)

    for i in range(4):  # several connections, half of them past a valid hello
        ws = await http.ws_connect(node.url + API + "/workers/connect", headers=node.headers())
        if i % 2 == 0:
            await ws.send_str(
                messages.encode(
                    messages.Hello(worker_id=f"fuzz{i}", queues=("default",), capacity=1, resume=())
                )
            )
            assert isinstance(
                messages.decode((await ws.receive(timeout=10)).data), messages.Welcome
            )
        for _ in range(150):
            f = frame()
            if isinstance(f, bytes):
                await ws.send_bytes(f)
            else:
                await ws.send_str(f)
        await ws.close()
    # Still serving: the API answers and a well-behaved worker gets and completes work.
    async with http.get(node.url + "/healthz") as r:
        assert r.status == 200
    w = await connect(http, node, "good")
    job = await submit(http, node, {"task": "t"})
    lease = await w.expect(messages.Lease)
    await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
    assert (await w.expect(messages.Ack)).accepted
    [run] = await committed_runs(http, node, job["id"])
    assert run["state"] == "succeeded"
    await w.ws.close()


async def test_a_stalled_worker_is_told_to_drop_a_lost_lease_before_new_work(
    fast_node: Node, http: aiohttp.ClientSession
) -> None:
    node = fast_node
    w = await connect(http, node, "stalled", capacity=1)
    await submit(
        http,
        node,
        {"task": "t", "heartbeat_timeout": "1s", "retry": {"initial": "0.05s", "jitter": False}},
    )
    first = await w.expect(messages.Lease)
    # No heartbeats: the lease is lost, and the worker is told to drop it.  Silent, it gets no
    # new lease (the retry's, due 0.05 s later) until it is heard again - then the retry's.
    cancel = await w.expect(messages.Cancel)
    assert (cancel.run_id, cancel.fence) == (first.run_id, first.fence)
    nxt = asyncio.ensure_future(w.recv(timeout=30))
    done, _ = await asyncio.wait({nxt}, timeout=1.5)
    assert not done, nxt.result()
    await w.send(messages.Heartbeat(leases=()))
    frames = [await nxt]
    while not any(isinstance(f, messages.Lease) for f in frames):
        frames.append(await w.recv(timeout=10))
    assert frames[-1].run_id == first.run_id and frames[-1].fence > first.fence
    await w.ws.close()


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (None, "(401): no token was given"),
        (
            "not-a-known-token-0123456789",
            "(401): the server does not know the token that was given",
        ),
    ],
)
async def test_schedd_worker_stops_with_status_3_when_its_credentials_are_refused(
    node: Node, tmp_path: Path, token: str | None, says: str
) -> None:
    # Retrying cannot help: it says why and exits, instead of retrying forever.
    args = [str(Path(sys.executable).parent / "schedd-worker"), "--server", node.url]
    if token is not None:
        args += ["--token", token]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDD_")}
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=tmp_path,  # no ./.schedd/tokens.toml here
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 3
    assert f"schedd-worker: {node.url}" in err.decode() and says in err.decode()
