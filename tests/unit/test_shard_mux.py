"""A node's front door sharing a worker's capacity between the shards that lease it runs
(schedd.shard.mux): whatever order the shards' leases, results and cancels come in, and
however late each shard learns its share, the worker never holds more than its capacity, a
lease over it waits in the front door and goes to the worker first when a slot frees, and a
shard with work gets the slots the others leave."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from schedd.config import Config
from schedd.ids import new_job_id
from schedd.protocol import messages
from schedd.protocol.headers import SHARD_HEADER
from schedd.protocol.signed import LINK_HEADER, LINK_PATH, link_proof
from schedd.shard import mux
from schedd.shard.mux import WorkerMux, _Session
from tests.conftest import wait_for

SHARDS = 3
T0 = 1_700_000_000_000


class Socket:
    """The worker's end: the frames the front door sent it."""

    def __init__(self) -> None:
        self.sent: list[messages.Message] = []

    async def send_str(self, text: str) -> None:
        self.sent.append(messages.decode(text))


def session(capacity: int) -> tuple[_Session, Socket]:
    mux = WorkerMux(Config(), SHARDS, lambda k: None, True)  # type: ignore[arg-type,return-value]
    sock = Socket()
    hello = messages.Hello("w1", ("default",), capacity)
    return _Session(mux, sock, hello, {}), sock  # type: ignore[arg-type]


def run_of(shard: int, n: int) -> str:
    return f"{new_job_id(T0 + n, shard)}@{T0}"


def lease(run_id: str, fence: int) -> tuple[messages.Lease, str]:
    msg = messages.Lease(run_id, run_id.split("@")[0], 1, fence, "t", None, "x")
    return msg, messages.encode(msg)


def wired(s: _Session) -> list[Socket]:
    """Each shard's end of the session's connections: the frames the front door sent it."""
    socks = [Socket() for _ in s.inners]
    for inner, sock in zip(s.inners, socks, strict=True):
        inner.out = mux._Outbox(sock)  # type: ignore[arg-type]
    return socks


class Local:
    """This node's shard processes as the front door asks them (``http://shardK``), served
    at ``route(K)``."""

    def __init__(self, route: Callable[[int], str]) -> None:
        self.http = aiohttp.ClientSession()
        self.route = route

    def ws_connect(self, url: str, **kw: Any) -> Any:
        k = int(url.split("/")[2].removeprefix("shard"))
        return self.http.ws_connect(url.replace(f"http://shard{k}", self.route(k)), **kw)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("seed", range(20))
async def test_the_worker_never_holds_more_than_its_capacity_and_no_lease_is_lost(
    seed: int,
) -> None:
    rng = random.Random(seed)
    capacity = rng.randint(1, 4)
    s, sock = session(capacity)
    # what each shard's leader believes it may lease: an offer it learns some steps late
    offers: list[list[int]] = [[s.offer(k) for k in range(SHARDS)]]
    sent: list[int] = [0] * SHARDS  # leases each shard sent and still counts
    n = 0
    for _ in range(300):
        seen = offers[max(0, len(offers) - 1 - rng.randint(0, 3))]
        k = rng.randrange(SHARDS)
        holding = [r for r, _ in sorted(s.holding[k].items())]
        if rng.random() < 0.55 and sent[k] < seen[k]:
            n += 1
            s.lease(k, *lease(run_of(k, n), n))
            sent[k] += 1
        elif holding:
            done = rng.choice(holding)
            if rng.random() < 0.8:
                s.ended(k, done)  # its result acked
            else:
                cancel = messages.Cancel(done, s.holding[k][done])
                s.cancelled(k, cancel, messages.encode(cancel))
            sent[k] -= 1
        elif any(h[0] == k for h in s.held) and rng.random() < 0.3:
            _, gone, _ = next(h for h in s.held if h[0] == k)
            cancel = messages.Cancel(gone.run_id, gone.fence)
            s.cancelled(k, cancel, messages.encode(cancel))  # never shown to the worker
            sent[k] -= 1
        await settle()
        assert s.used <= capacity
        assert not s.held or s.used == capacity  # one waits only while the worker is full
        for j in range(SHARDS):  # each shard's own count agrees with the front door's
            assert sent[j] == len(s.holding[j]) + sum(1 for h in s.held if h[0] == j)
        offers.append([s.offer(j) for j in range(SHARDS)])
    shown = {m.run_id for m in sock.sent if isinstance(m, messages.Lease)}
    assert not shown & {h[1].run_id for h in s.held}  # a held lease never reached the worker


async def test_a_shard_with_work_gets_the_slots_the_others_leave() -> None:
    s, _ = session(4)
    assert [s.offer(k) for k in range(SHARDS)] == [4, 4, 4]  # idle: each may fill it
    mine = [run_of(2, n) for n in range(3)]
    for n, run_id in enumerate(mine):
        s.lease(2, *lease(run_id, n + 1))
    assert [s.offer(k) for k in range(SHARDS)] == [1, 1, 4]
    s.lease(0, *lease(run_of(0, 9), 9))
    s.lease(1, *lease(run_of(1, 10), 10))  # both took the last slot: one waits here
    assert s.used == 4 and len(s.held) == 1
    assert [s.offer(k) for k in range(SHARDS)] == [1, 1, 3]  # what each holds: no more
    s.ended(2, mine[0])  # a slot frees: the waiting lease takes it, not a new one
    assert s.used == 4 and not s.held
    assert [s.offer(k) for k in range(SHARDS)] == [1, 1, 2]


async def test_a_draining_worker_is_offered_nothing_more() -> None:
    s, _ = session(4)
    s.from_worker(messages.encode(messages.Drain()))
    assert [s.offer(k) for k in range(SHARDS)] == [0, 0, 0]


async def test_a_lease_waiting_here_is_heartbeated_to_its_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mux, "HELD_BEAT_S", 0.01)
    s, _ = session(1)
    shard_socks = wired(s)
    s.lease(0, *lease(run_of(0, 1), 1))
    waiting = run_of(2, 2)
    s.lease(2, *lease(waiting, 2))  # the worker is full: it waits here
    assert [h[1].run_id for h in s.held] == [waiting]

    async def beaten() -> bool:
        return any(
            isinstance(m, messages.Heartbeat) and [r.run_id for r in m.leases] == [waiting]
            for m in shard_socks[2].sent
        )

    await wait_for(beaten, 5)  # the waiting lease heartbeated to shard 2
    assert not any(isinstance(m, messages.Heartbeat) for m in shard_socks[1].sent)


async def test_a_shard_the_worker_holds_nothing_of_hears_it_only_now_and_then() -> None:
    s, _ = session(4)
    shard_socks = wired(s)
    mine = run_of(1, 1)
    s.lease(1, *lease(mine, 7))

    def beat() -> None:
        s.from_worker(messages.encode(messages.Heartbeat((messages.LeaseRef(mine, 7),))))

    async def beats() -> list[list[list[str]]]:
        await settle()
        got = [
            [[r.run_id for r in m.leases] for m in sock.sent if isinstance(m, messages.Heartbeat)]
            for sock in shard_socks
        ]
        for sock in shard_socks:
            sock.sent.clear()
        return got

    beat()  # the first: every shard hears the worker is alive
    assert await beats() == [[[]], [[mine]], [[]]]
    for _ in range(3):  # then only the shard whose lease it lists
        beat()
    assert await beats() == [[], [[mine]] * 3, []]
    for inner in (s.inners[0], s.inners[2]):  # QUIET_BEAT_S later, the others hear it again
        inner.beat_at -= mux.QUIET_BEAT_S
    beat()
    assert await beats() == [[[]], [[mine]], [[]]]


async def test_a_draining_worker_still_gets_what_was_leased_to_it_before() -> None:
    s, sock = session(1)
    first, second = run_of(0, 1), run_of(1, 2)
    s.lease(0, *lease(first, 1))
    s.lease(1, *lease(second, 2))
    s.from_worker(messages.encode(messages.Drain()))
    s.ended(0, first)
    await settle()
    assert s.holding[1] == {second: 2} and not s.held  # handed over: the worker decides
    assert [m.run_id for m in sock.sent if isinstance(m, messages.Lease)] == [first, second]


async def test_connections_waiting_for_a_dead_leader_wake_once_the_shard_names_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One question per shard to this node's process of it, however many workers wait: the
    waiters try again as soon as it names another leader, not at their next back-off."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    leader = {"url": "http://dead:1"}
    asked = []

    async def cluster(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Authorization"))
        return web.json_response({"leader_url": leader["url"]})

    app = web.Application()
    app.router.add_get("/api/v1/cluster", cluster)
    monkeypatch.setattr(mux, "PROBE_S", 0.01)
    async with TestClient(TestServer(app)) as client:
        base = str(client.make_url(""))
        local = client.session

        class Local:
            def get(self, url: str, **kw: object) -> object:
                return local.get(url.replace("http://shard1", base.rstrip("/")), **kw)

        m = WorkerMux(Config(), SHARDS, lambda k: Local(), True)  # type: ignore[arg-type,return-value]
        headers = {"Authorization": "Bearer w"}
        moved = m.unreachable(1, "http://dead:1", headers)
        assert m.unreachable(1, "http://dead:1", headers) is moved  # one probe for all
        await wait_for(lambda: len(asked) >= 3, 5)
        assert not moved.is_set()  # the dead leader is still the one it names
        leader["url"] = "http://alive:2"
        await asyncio.wait_for(moved.wait(), 5)
        assert set(asked) == {"Bearer w"}
        n = len(asked)
        await asyncio.sleep(0.05)
        assert len(asked) == n  # the probe stopped
        # a leader that failed once but answers the next connection (a busy node, not a dead
        # one): the waiters go at once, and the shard is asked no more
        busy = m.unreachable(1, "http://alive:2", headers)
        await wait_for(lambda: len(asked) >= n + 2, 5)
        assert not busy.is_set()
        m.reached(1, "http://alive:2")
        await asyncio.wait_for(busy.wait(), 5)
        await wait_for(lambda: 1 not in m._gone, 5)
        n = len(asked)
        await asyncio.sleep(0.05)
        assert len(asked) == n
        await m.close()


async def test_a_link_made_again_goes_to_the_shards_leader_at_once() -> None:
    """The first link to a shard led by another node asks this node's process of the shard,
    which redirects it; the next ones (after a lost link) go to that leader's node at once. A
    leader that answers no more is forgotten: the next link asks this node's process again."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    asked: list[str] = []
    signed: list[str] = []

    def serving(name: str, answer: dict[str, object]) -> web.Application:
        async def link(request: web.Request) -> web.WebSocketResponse:
            asked.append(name)
            signed.append(request.headers.get(LINK_HEADER, ""))
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.send_bytes(orjson.dumps([answer]))
            await ws.receive()  # until the front door closes it
            return ws

        app = web.Application()
        app.router.add_get(LINK_PATH, link)
        return app

    remote = TestServer(serving("leader", {"t": "ready"}))
    await remote.start_server()
    leader_url = str(remote.make_url("")).rstrip("/")
    local = TestServer(serving("local", {"t": "redirect", "leader": leader_url}))
    await local.start_server()
    base = str(local.make_url("")).rstrip("/")

    here = Local(lambda k: base)
    m = WorkerMux(Config(), SHARDS, lambda k: here, True)  # type: ignore[arg-type,return-value]
    try:
        for _ in range(3):
            ws = await m.links[1]._open()
            assert ws is not None
            await ws.close()
        assert asked == ["local", "leader", "leader", "leader"]
        assert m.leaders == {1: leader_url}
        # signed: the sender's clock and its proof (this cluster has no Raft secret)
        at, _, given = signed[0].partition(".")
        assert given == link_proof(None, int(at))
        await remote.close()  # that leader's node is gone
        with pytest.raises(aiohttp.ClientError):
            await m.links[1]._open()
        assert m.leaders == {}
        asked.clear()
        with contextlib.suppress(aiohttp.ClientError):
            await m.links[1]._open()
        assert asked == ["local"]  # asked where the leader is again
    finally:
        await m.close()
        await here.http.close()
        await local.close()
        await remote.close()


async def test_a_front_door_busy_connecting_workers_answers_the_next_one_503() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    class NoShard:  # this node's shard processes do not answer (a shard without a leader)
        def ws_connect(self, url: str, **kw: object) -> object:
            raise aiohttp.ClientConnectionError(f"cannot connect to {url}")

    m = WorkerMux(Config(), SHARDS, lambda k: NoShard(), True)  # type: ignore[arg-type,return-value]
    app = web.Application()
    app.router.add_get("/api/v1/workers/connect", m.serve)
    # the ones being connected: each counted until every shard connection has been tried
    sessions = [
        _Session(m, Socket(), messages.Hello(f"w{n}", ("default",), 2), {}, mux._Admitted(m))  # type: ignore[arg-type]
        for n in range(mux.MAX_SETTING_UP)
    ]
    assert m.setting_up == mux.MAX_SETTING_UP
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/api/v1/workers/connect")
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert "connecting 64 workers" in (await resp.json())["error"]["message"]
    assert m.setting_up == mux.MAX_SETTING_UP  # the refused one was never counted
    # the first worker's connections are tried, and fail: it is counted off once all three
    # were tried (they go on trying), so a shard without a leader does not fill the count
    first = sessions[0]
    for inner in first.inners:
        m.links[inner.shard].join(inner)
    await wait_for(lambda: all(inner.attempted for inner in first.inners), 5)
    assert m.setting_up == mux.MAX_SETTING_UP - 1
    assert all(inner.out is None for inner in first.inners)
    first.tried()
    assert m.setting_up == mux.MAX_SETTING_UP - 1  # counted off once
    first.closed = True
    assert sessions[1].admitted is not None
    sessions[1].admitted.release()
    sessions[1].admitted.release()
    assert m.setting_up == mux.MAX_SETTING_UP - 2
    await m.close()


async def _hellos(ws: aiohttp.web.WebSocketResponse, n: int) -> dict[int, messages.Hello]:
    said: dict[int, messages.Hello] = {}
    while len(said) < n:
        for env in orjson.loads((await ws.receive(timeout=5)).data):
            if env["t"] == "hello":
                said[env["w"]] = messages.decode(env["f"])  # type: ignore[assignment]
    return said


async def _frames(ws: aiohttp.web.WebSocketResponse) -> list[tuple[int, messages.Message]]:
    got = orjson.loads((await ws.receive(timeout=5)).data)
    return [(e["w"], messages.decode(e["f"])) for e in got if e["t"] == "frame"]


def _to(w: int, *msgs: messages.Message) -> bytes:
    return orjson.dumps([{"w": w, "t": "frame", "f": messages.encode(m)} for m in msgs])


async def test_a_link_lost_says_hello_again_for_every_worker_with_its_leases_and_results() -> None:
    """Every worker's connection to a shard rides on the front door's one link to its leader.
    The link lost and made again: each worker says hello again with the leases it holds of
    that shard (none lost), and a result not acked yet is sent again after the welcome."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    links: asyncio.Queue[web.WebSocketResponse] = asyncio.Queue()
    done = asyncio.Event()

    async def link(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(orjson.dumps([{"t": "ready"}]))
        if request.match_info["k"] == "1":
            await links.put(ws)
        await done.wait()
        return ws

    app = web.Application()
    app.router.add_get("/s{k}" + LINK_PATH, link)
    server = TestServer(app)
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")

    here = Local(lambda k: f"{base}/s{k}")
    m = WorkerMux(Config(), SHARDS, lambda k: here, True)  # type: ignore[arg-type,return-value]
    sessions = [
        _Session(m, Socket(), messages.Hello(f"w{n}", ("default",), 2), {})  # type: ignore[arg-type]
        for n in range(2)
    ]
    try:
        for s in sessions:
            for inner in s.inners:
                m.links[inner.shard].join(inner)
        ws = await links.get()
        said = await _hellos(ws, 2)
        assert set(said) == {s.w for s in sessions}
        assert all(h.resume == () for h in said.values())
        a, b = sessions
        held = run_of(1, 1)
        msg, _ = lease(held, 4)
        await ws.send_bytes(_to(a.w, messages.Welcome("n1", 5.0, 30.0), msg))
        await ws.send_bytes(_to(b.w, messages.Welcome("n1", 5.0, 30.0)))
        await wait_for(lambda: a.holding[1] == {held: 4}, 5)
        done_run = run_of(1, 2)
        msg2, _ = lease(done_run, 5)
        await ws.send_bytes(_to(a.w, msg2))
        await wait_for(lambda: done_run in a.holding[1], 5)
        a.from_worker(messages.encode(messages.Complete(done_run, 5, result=1)))
        while not any(isinstance(f, messages.Complete) for _, f in await _frames(ws)):
            pass
        await ws.close()  # the link is lost before the result's ack
        ws = await links.get()
        said = await _hellos(ws, 2)
        assert set(said[a.w].resume) == {messages.LeaseRef(held, 4), messages.LeaseRef(done_run, 5)}
        assert said[b.w].resume == ()
        await ws.send_bytes(_to(a.w, messages.Welcome("n1", 5.0, 30.0)))
        again: list[tuple[int, messages.Message]] = []
        while not any(isinstance(f, messages.Complete) for _, f in again):
            again += await _frames(ws)
        assert (a.w, messages.Complete(done_run, 5, result=1)) in again
        await ws.send_bytes(_to(a.w, messages.Ack(done_run, True)))
        await wait_for(lambda: not a.results[1] and done_run not in a.holding[1], 5)
        assert a.holding[1] == {held: 4}
    finally:
        for s in sessions:
            s.closed = True
        done.set()
        await m.close()
        await here.http.close()
        await server.close()


async def test_a_shard_led_by_a_node_of_an_earlier_build_is_served_per_worker() -> None:
    """A node whose front door has no links (an earlier build, during a rolling upgrade)
    answers the link 404: each worker gets its own connection to the shard's leader through
    that front door, with its credentials and the node that serves it, as that build's front
    doors made them. A worker the leader refuses (its token revoked) is tried again on its
    own, the others staying connected; the leader's redirect (it steps down) sends the link
    back to ask this node's process who leads."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    asked: list[str] = []
    opened: list[messages.Hello] = []  # the hellos the earlier build's leader took
    welcomed: asyncio.Queue[tuple[str, web.WebSocketResponse]] = asyncio.Queue()
    headers: list[dict[str, str]] = []

    async def connect(request: web.Request) -> web.StreamResponse:
        headers.append(dict(request.headers))
        if request.headers.get("Authorization") == "Bearer revoked":
            raise web.HTTPUnauthorized(text="token revoked")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        hello = messages.decode((await ws.receive(timeout=5)).data)
        assert isinstance(hello, messages.Hello)
        opened.append(hello)
        await ws.send_str(messages.encode(messages.Welcome("n2", 5.0, 30.0)))
        await welcomed.put((hello.worker_id, ws))
        async for _ in ws:
            pass
        return ws

    earlier = web.Application()  # the worker endpoint only: no link path (404)
    earlier.router.add_get("/api/v1/workers/connect", connect)
    remote = TestServer(earlier)
    await remote.start_server()
    leader_url = str(remote.make_url("")).rstrip("/")

    async def link(request: web.Request) -> web.WebSocketResponse:
        asked.append("local")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(orjson.dumps([{"t": "redirect", "leader": leader_url}]))
        await ws.receive()
        return ws

    here_app = web.Application()
    here_app.router.add_get(LINK_PATH, link)
    local = TestServer(here_app)
    await local.start_server()
    base = str(local.make_url("")).rstrip("/")

    here = Local(lambda k: base)
    m = WorkerMux(Config(), SHARDS, lambda k: here, True)  # type: ignore[arg-type,return-value]
    worker: Any = Socket()  # (the worker's end: no frame of its is read here)
    good = _Session(
        m, worker, messages.Hello("good", ("default",), 2), {"Authorization": "Bearer ok"}
    )
    token = {"Authorization": "Bearer revoked"}
    revoked = _Session(m, worker, messages.Hello("revoked", ("default",), 2), token)
    try:
        for s in (good, revoked):
            m.links[1].join(s.inners[1])
        who, ws = await welcomed.get()
        assert who == "good"
        await wait_for(lambda: good.inners[1].out is not None, 5)
        sent = next(h for h in headers if h["Authorization"] == "Bearer ok")
        assert sent[SHARD_HEADER] == "1" and sent["X-Schedd-Relay-Node"] == Config().node.id
        assert sent["X-Schedd-Relay-Capacity"] == "2"
        held = run_of(1, 1)
        _, text = lease(held, 7)
        await ws.send_str(text)
        await wait_for(lambda: good.holding[1] == {held: 7}, 5)
        # the revoked worker is refused again and again; the good one stays connected
        await wait_for(
            lambda: sum(h["Authorization"] == "Bearer revoked" for h in headers) >= 3, 10
        )
        assert [h.worker_id for h in opened] == ["good"] and revoked.inners[1].out is None
        assert revoked.inners[1].attempted  # (not left counted as being connected)
        # the leader steps down: the link asks this node's process again
        before = len(asked)
        await ws.send_str(messages.encode(messages.Redirect(leader=None)))
        await ws.close()
        await wait_for(lambda: len(asked) > before, 5)
        # ... which names the same node again: the worker says hello there with its lease
        who, ws = await welcomed.get()
        assert who == "good" and opened[-1].resume == (messages.LeaseRef(held, 7),)
    finally:
        for s in (good, revoked):
            s.closed = True
        await m.close()
        await here.http.close()
        await local.close()
        await remote.close()
