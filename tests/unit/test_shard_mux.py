"""A node's front door sharing a worker's capacity between the shards that lease it runs
(schedd.shard.mux): whatever order the shards' leases, results and cancels come in, and
however late each shard learns its share, the worker never holds more than its capacity, a
lease over it waits in the front door and goes to the worker first when a slot frees, and a
shard with work gets the slots the others leave."""

from __future__ import annotations

import asyncio
import contextlib
import random

import aiohttp
import pytest

from schedd.config import Config
from schedd.ids import new_job_id
from schedd.protocol import messages
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
    assert [s.offer(k) for k in range(SHARDS)] == [2, 2, 2]  # idle: a part each, rounded up
    mine: list[str] = []
    while s.offer(2) > s.live(2):  # shard 2 takes what it is offered, and is offered more
        mine.append(run_of(2, len(mine)))
        s.lease(2, *lease(mine[-1], len(mine)))
    assert s.used == 4 and s.share == [0, 0, 3]  # the whole worker, one slot left the pool's
    assert [s.offer(k) for k in range(SHARDS)] == [0, 0, 4]
    s.ended(2, mine[0])  # the pool's slot frees: offered to every shard again
    assert [s.offer(k) for k in range(SHARDS)] == [1, 1, 4]
    s.lease(0, *lease(run_of(0, 9), 9))
    s.lease(1, *lease(run_of(1, 10), 10))  # both took the last slot: one waits here
    assert s.used == 4 and len(s.held) == 1
    assert [s.offer(k) for k in range(SHARDS)] == [1, 1, 3]  # what each holds: no more
    s.ended(2, mine[1])  # a slot frees: the waiting lease takes it, out of shard 2's share
    assert s.used == 4 and not s.held and s.share == [0, 0, 2]
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


async def test_the_next_connection_goes_to_a_shards_leader_at_once() -> None:
    """The first worker's connection to a shard led by another node asks this node's process
    of the shard, which redirects it; the next ones go to that leader's node at once. A leader
    that answers no more is forgotten: the next connection asks this node's process again."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    asked: list[str] = []

    def serving(name: str, answer: messages.Message) -> web.Application:
        async def connect(request: web.Request) -> web.WebSocketResponse:
            asked.append(name)
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.receive()  # the hello
            await ws.send_str(messages.encode(answer))
            await ws.receive()  # until the front door closes it
            return ws

        app = web.Application()
        app.router.add_get("/api/v1/workers/connect", connect)
        return app

    remote = TestServer(serving("leader", messages.Welcome("n2", 5.0, 30.0)))
    await remote.start_server()
    leader_url = str(remote.make_url("")).rstrip("/")
    local = TestServer(serving("local", messages.Redirect(leader=leader_url)))
    await local.start_server()
    base = str(local.make_url("")).rstrip("/")

    class Local:
        def __init__(self) -> None:
            self.http = aiohttp.ClientSession()

        def ws_connect(self, url: str, **kw: object) -> object:
            return self.http.ws_connect(url.replace("http://shard1", base), **kw)

    here = Local()
    m = WorkerMux(Config(), SHARDS, lambda k: here, True)  # type: ignore[arg-type,return-value]
    try:
        for n in range(3):
            s = _Session(m, Socket(), messages.Hello(f"w{n}", ("default",), 2), {})  # type: ignore[arg-type]
            ws = await s.inners[1]._open(None)
            assert ws is not None
            await ws.close()
        assert asked == ["local", "leader", "leader", "leader"]
        assert m.leaders == {1: leader_url}
        await remote.close()  # that leader's node is gone
        s = _Session(m, Socket(), messages.Hello("w9", ("default",), 2), {})  # type: ignore[arg-type]
        with pytest.raises(aiohttp.ClientError):
            await s.inners[1]._open(None)
        assert m.leaders == {}
        asked.clear()
        with contextlib.suppress(aiohttp.ClientError):
            await s.inners[1]._open(None)
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
    tries = [asyncio.create_task(inner.run(None)) for inner in first.inners]
    await wait_for(lambda: all(inner.attempted for inner in first.inners), 5)
    assert m.setting_up == mux.MAX_SETTING_UP - 1
    assert all(inner.ws is None for inner in first.inners)
    first.tried()
    assert m.setting_up == mux.MAX_SETTING_UP - 1  # counted off once
    first.closed = True
    for task in tries:
        task.cancel()
    await asyncio.gather(*tries, return_exceptions=True)
    assert sessions[1].admitted is not None
    sessions[1].admitted.release()
    sessions[1].admitted.release()
    assert m.setting_up == mux.MAX_SETTING_UP - 2
    await m.close()


# -- the capacity's shares: the front door and each shard's leader, frame by frame --------------
class Leader:
    """A shard's leader as the front door's connection reaches it: it reads the frames sent
    to it in order, leases while it holds fewer leases than the capacity it was last told
    (and has runs queued), frees a lease's slot as it commits the result, and acks it."""

    def __init__(self, s: _Session, shard: int, sock: Socket) -> None:
        self.s, self.shard, self.sock = s, shard, sock
        self.read = 0
        self.capacity = s.offer(shard)  # the hello's
        s.inners[shard].ws = object()  # type: ignore[assignment]
        s.inners[shard].offered = self.capacity
        self.leases: set[str] = set()
        self.queued = 0
        self.n = 0
        self.done = 0

    def step(self) -> None:
        inner = self.s.inners[self.shard]
        while self.read < len(self.sock.sent):
            msg = self.sock.sent[self.read]
            self.read += 1
            if isinstance(msg, messages.Capacity):
                self.capacity = msg.capacity
            elif isinstance(msg, messages.Complete) and msg.run_id in self.leases:
                self.leases.discard(msg.run_id)
                self.done += 1
                inner._from_shard(messages.encode(messages.Ack(msg.run_id, True)))
        while self.queued and len(self.leases) < self.capacity:
            self.queued -= 1
            self.n += 1
            run_id = run_of(self.shard, self.shard * 1_000_000 + self.n)
            self.leases.add(run_id)
            inner._from_shard(lease(run_id, self.n)[1])


def wired_leaders(capacity: int) -> tuple[_Session, Socket, list[Leader]]:
    s, sock = session(capacity)
    return s, sock, [Leader(s, k, out) for k, out in enumerate(wired(s))]


def worker_completes(s: _Session, sock: Socket, run_id: str) -> None:
    s.from_worker(messages.encode(messages.Complete(run_id, s.holding[s.shard_of(run_id)][run_id])))


async def steady(
    s: _Session, sock: Socket, leaders: list[Leader], rounds: int, rng: random.Random
) -> None:
    """``rounds`` times: the worker completes one of its runs, and the leaders catch up."""
    for _ in range(rounds):
        for leader in leaders:
            leader.step()
        await settle()
        held = [r for h in s.holding for r in h if r not in s.finishing[s.shard_of(r)]]
        if held:
            worker_completes(s, sock, rng.choice(sorted(held)))
        await settle()
        for leader in rng.sample(leaders, len(leaders)):
            leader.step()
        await settle()
        assert s.used <= s.capacity


async def test_runs_leased_into_their_shards_freed_slots_need_no_capacity_frame() -> None:
    rng = random.Random(1)
    s, sock, leaders = wired_leaders(12)
    for leader in leaders:
        leader.queued = 10_000  # every shard has more work than the worker takes
    await steady(s, sock, leaders, 60, rng)  # the shares form
    assert s.used == 12 and sorted(s.share) == [3, 4, 4]  # 11: one slot stays in the pool
    frames, done = s.frames, sum(leader.done for leader in leaders)
    await steady(s, sock, leaders, 300, rng)
    runs = sum(leader.done for leader in leaders) - done
    assert runs >= 290
    # each freed slot was leased again by its shard: the pool's slot alone moves, so under
    # one frame per ten runs (a frame to every other shard for each lease and result: 4)
    assert (s.frames - frames) / runs < 0.1, (s.frames - frames, runs)
    assert min(leader.done for leader in leaders) > 0.25 * sum(x.done for x in leaders)


async def test_a_shard_with_nothing_gets_the_pool_slot_and_the_shares_even_out() -> None:
    rng = random.Random(2)
    s, sock, leaders = wired_leaders(8)
    leaders[0].queued = 10_000
    await steady(s, sock, leaders, 40, rng)
    assert s.share == [7, 0, 0] and s.used == 8  # the pool's slot is used by shard 0 too
    leaders[1].queued = 10_000  # work arrives in shard 1: it takes the pool's slot when it frees
    await steady(s, sock, leaders, 120, rng)
    assert abs(s.share[0] - s.share[1]) <= 1 and s.share[2] == 0, s.share
    assert leaders[1].done > 20


async def test_a_result_whose_slot_goes_elsewhere_lowers_its_shard_first() -> None:
    s, sock, leaders = wired_leaders(4)
    leaders[0].queued = 3
    for _ in range(3):  # offered a part of the idle worker, then more as it takes it
        leaders[0].step()
        await settle()
    assert s.share == [3, 0, 0]
    leaders[1].queued = leaders[2].queued = 1  # both take the pool's one slot: one waits here
    leaders[1].step()
    leaders[2].step()
    await settle()
    assert s.used == 4 and len(s.held) == 1
    first = sorted(s.holding[0])[0]
    worker_completes(s, sock, first)  # shard 0's slot pays for the lease waiting here
    await settle()
    to_0 = leaders[0].sock.sent[leaders[0].read :]
    assert [type(m) for m in to_0[-2:]] == [messages.Capacity, messages.Complete], to_0
    last = to_0[-2]
    assert isinstance(last, messages.Capacity)
    assert last.capacity == 2  # its two other runs: the freed slot is not its to lease
    for leader in leaders:
        leader.step()
    await settle()
    assert not s.held and s.used == 4 and len(leaders[0].leases) == 2


async def test_a_share_left_unused_goes_back_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mux, "IDLE_SHARE_S", 0.05)
    rng = random.Random(3)
    s, sock, leaders = wired_leaders(6)
    leaders[0].queued = 40
    await steady(s, sock, leaders, 80, rng)  # shard 0's work done: its share stays, unused
    assert leaders[0].done == 40 and s.used == 0

    async def released() -> bool:
        await settle()
        return s.share == [0, 0, 0] and [s.offer(k) for k in range(SHARDS)] == [2, 2, 2]

    await wait_for(released, 5)
    assert s._idle is None  # an idle worker: nothing left to watch
    leaders[1].queued = 6
    for _ in range(4):  # a part at first, more with each round trip
        leaders[1].step()
        await settle()
    assert len(leaders[1].leases) == 6  # shard 1 takes the whole worker
    assert [s.offer(k) for k in range(SHARDS)] == [0, 6, 0]


@pytest.mark.parametrize("seed", range(15))
async def test_shares_under_random_work_keep_the_capacity_and_starve_no_shard(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mux, "IDLE_SHARE_S", 0.01)
    rng = random.Random(seed)
    s, sock, leaders = wired_leaders(rng.randint(1, 9))
    for _ in range(400):
        before = s.used
        k = rng.randrange(SHARDS)
        roll = rng.random()
        if roll < 0.2:
            leaders[k].queued += rng.randint(1, 4)
        elif roll < 0.6:
            leaders[k].step()  # each leader reads its frames late, in its own time
        elif roll < 0.95:
            mine = [r for r in s.holding[k] if r not in s.finishing[k]]
            if mine:
                worker_completes(s, sock, rng.choice(sorted(mine)))
        elif rng.random() < 0.5:
            s.from_worker(messages.encode(messages.Capacity(rng.randint(1, 9))))
        else:
            await asyncio.sleep(0.012)  # unused shares go back to the pool
        await settle()
        assert s.used <= max(s.capacity, before)  # (a worker may lower its capacity below it)
        assert sum(s.share) <= max(0, s.capacity - 1)
        lives, _, pool = s._claims()
        if s.capacity > sum(lives):  # a free slot: in the pool, or in a share being watched
            assert pool >= 1 or s._idle is not None, (s.share, lives)
    # the work stops arriving: everything queued is run, in every shard
    for _ in range(2000):
        for leader in leaders:
            leader.step()
        await settle()
        mine = [r for h, f in zip(s.holding, s.finishing, strict=True) for r in h if r not in f]
        if mine:
            worker_completes(s, sock, rng.choice(sorted(mine)))
        elif not any(leader.queued or leader.leases for leader in leaders):
            break
        else:
            await asyncio.sleep(0.012)
    assert not any(leader.queued for leader in leaders), [x.queued for x in leaders]
    assert not s.held and s.used == 0


async def test_the_pool_goes_to_the_smallest_share_and_to_every_shard_once_left_unused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mux, "IDLE_SHARE_S", 0.05)
    s, _ = session(7)
    n = 0
    for k in range(SHARDS):
        for _ in range(2):
            n += 1
            s.lease(k, *lease(run_of(k, n), n))
    assert s.share == [2, 2, 2]
    assert [s.offer(k) for k in range(SHARDS)] == [3, 2, 2]  # one offered the last slot

    async def everyone() -> bool:
        await settle()
        return [s.offer(k) for k in range(SHARDS)] == [3, 3, 3]

    s.offer_soon()
    await wait_for(everyone, 5)  # shard 0 left it: now any shard may take it
    n += 1
    s.lease(2, *lease(run_of(2, n), n))
    await settle()
    assert [s.offer(k) for k in range(SHARDS)] == [2, 2, 3] and s.used == 7
