"""A node's front door serving a worker from every shard (a cluster of several shards).

The worker holds one websocket to any node's front door and speaks the worker protocol as it
would to a leader.  For each shard the front door keeps one **link** to that shard's leader
(:class:`_Link`: a websocket to this node's process of the shard, or through the front door of
the node that leads it, with ``X-Schedd-Shard``; made again after a failover), and every
worker it serves has a worker connection to the shard on it (:class:`_Inner`): a ``hello``,
then its frames, in envelopes that one turn of the loop sends as one message
(:mod:`schedd.api.links` is the shard's end).  What goes where:

- the worker's ``hello``: each shard gets the leases of its own runs (a run's id names its
  shard), with the worker's id, queues and tasks; one ``welcome`` comes from here;
- ``heartbeat``: split by shard, each shard getting one (also with none of its leases: a
  heartbeat is what tells a leader the worker is there);
- ``complete``/``fail``: to the run's shard, kept until acked and sent again after that
  shard's link is made again (the worker's own rule, kept here for it);
- ``drain`` and the shards' ``lease``, ``ack``, ``cancel``, ``drain``, ``error``: passed on.

The worker's capacity ``C`` is shared with ``capacity`` frames: each shard may lease it what
it holds from that shard plus the worker's free slots, so a shard with work gets the slots
the others leave.  Two shards may both fill the same free slot before their lowered capacity
reaches them; the lease over ``C`` is held here (heartbeated, never shown to the worker) and
handed over first when a slot frees, so the worker never holds more than ``C`` and no shard's
run waits behind another shard's queue.  A draining worker is offered nothing more; what
was leased to it before is handed over as slots free (the worker refuses what it will not run).

While a cluster is upgraded from a build whose front doors have no links (they answer the link
404), a shard led by a node of that build is served as that build did: each worker has its own
connection to the shard's leader, through that node's front door, with the worker's
credentials (:class:`_Single`), until the shard's leader changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from schedd import clock
from schedd.aio import PerTurn, wait_event
from schedd.config import Config, read_raft_secret
from schedd.errors import PermissionDenied, Unavailable
from schedd.ids import shard_of_id
from schedd.logs import log_event
from schedd.protocol import messages
from schedd.protocol.headers import SHARD_HEADER
from schedd.protocol.messages import MAX_FRAME_BYTES as MAX_FRAME
from schedd.protocol.messages import LeaseRef, ProtocolError
from schedd.protocol.signed import LINK_HEADER, LINK_PATH, MAX_LINK_MESSAGE, link_proof
from schedd.protocol.timing import CONNECT_PATH, HANDSHAKE_TIMEOUT_S, HELLO_TIMEOUT_S
from schedd.shard.answers import error_answer

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.05  # a shard connection lost is made again after this, doubling ...
RETRY_MAX_S = 1.0  # ... up to this (or as soon as the shard's new leader is known)
#: after a shard's leader could not be reached, this node's process of the shard is asked who
#: leads it this often (one question per shard, whatever the number of workers waiting) ...
PROBE_S = 0.05
PROBE_FOR_S = 30.0  # ... for at most this long
MAX_HOPS = 3  # redirects followed for one connection (the leader moved meanwhile)
#: a lease waiting here for a slot is heartbeated at least this often (s)
HELD_BEAT_S = 1.0
#: a worker's heartbeat goes to the shards whose leases it lists; a shard it holds none of
#: hears an empty one at most this often (s): that it is alive is all it says there, and
#: thousands of idle workers would otherwise cost every shard's leader a frame per worker
#: per heartbeat interval
QUIET_BEAT_S = 30.0
#: a heartbeat waits up to this long (s) on a link for other frames to go with it: with
#: thousands of workers, one link message carries many workers' heartbeats
LAZY_S = 0.05
#: workers whose connections to the shards are still being made, at most, on one front door:
#: one more is answered 503 (the worker tries another node, or again soon). Each costs a
#: check of its credentials by shard 0 and a hello on every shard's link (and waits for a
#: shard without a leader); thousands at once (a node restarted) are let in as these end.
MAX_SETTING_UP = 64
#: the worker's request headers passed to shard 0 to check its credentials (and kept for the
#: probes of "who leads")
_PASSED = ("Authorization", "User-Agent", "X-Request-Id")
WHOAMI_PATH = "/api/v1/whoami"


class WorkerMux:
    """The worker sessions of one front door."""

    def __init__(
        self,
        cfg: Config,
        shards: int,
        local: Callable[[int], aiohttp.ClientSession],
        remote_ssl: Any,
    ) -> None:
        self.cfg = cfg
        self.shards = shards
        self.local = local  # shard k's session over this node's socket
        self._ssl = remote_ssl
        self._remote: aiohttp.ClientSession | None = None
        self.sessions: set[_Session] = set()
        #: per shard, while its last known leader cannot be reached: that leader's URL, and an
        #: event set once this node's process of the shard names another
        self._gone: dict[int, tuple[str, asyncio.Event]] = {}
        self._probes: set[asyncio.Task[None]] = set()
        #: per shard led by another node, the URL of that node's front door as the last
        #: connection to it found it: the next connections go there at once, instead of asking
        #: this node's process of the shard to be redirected (one hop less per worker)
        self.leaders: dict[int, str] = {}
        self.setting_up = 0  # sessions not yet connected to every shard
        self._closed = False
        self.links = [_Link(self, k) for k in range(shards)]
        self._ids = itertools.count(1)  # the sessions' numbers on the links
        self._secret: bytes | None = None
        self._secret_read = False

    def link_headers(self) -> dict[str, str]:
        """A link's upgrade headers: signed with the Raft secret (:mod:`schedd.api.links`)."""
        if not self._secret_read:
            self._secret = read_raft_secret(self.cfg)
            self._secret_read = True
        at = clock.wall_ms()
        return {
            LINK_HEADER: f"{at}.{link_proof(self._secret, at)}",
            "X-Forwarded-For": "127.0.0.1",  # (the shard's socket has no peer of its own)
        }

    @property
    def remote(self) -> aiohttp.ClientSession:
        """The session to other nodes' front doors (made on first use)."""
        if self._remote is None:
            self._remote = aiohttp.ClientSession(
                # one link per shard led elsewhere (no cap: aiohttp's is 100)
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            )
        return self._remote

    def unreachable(self, shard: int, url: str, headers: dict[str, str]) -> asyncio.Event:
        """Shard ``shard``'s leader at ``url`` did not answer: an event set once this node's
        process of the shard knows another leader, or once that leader answers a connection
        after all (the connections waiting on it try again then, instead of at their next
        back-off)."""
        gone = self._gone.get(shard)
        if gone is None or gone[0] != url:
            gone = self._gone[shard] = (url, asyncio.Event())
            task = asyncio.create_task(self._probe(shard, url, headers, gone[1]))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)
        return gone[1]

    def here(self, url: str) -> bool:
        """Whether ``url`` is this node's own (a shard led here: its local socket serves)."""
        return url.rstrip("/") == self.cfg.advertise_url().rstrip("/")

    def reached(self, shard: int, url: str) -> None:
        """Shard ``shard``'s leader at ``url`` answered: a failure to reach it was passing (a
        busy node), so the connections waiting on it try again now, and it is asked no more."""
        gone = self._gone.get(shard)
        if gone is not None and gone[0] == url:
            gone[1].set()

    async def _probe(
        self, shard: int, url: str, headers: dict[str, str], moved: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + PROBE_FOR_S
        try:
            while loop.time() < until and not moved.is_set():
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with self.local(shard).get(
                        f"http://shard{shard}/api/v1/cluster",
                        headers=headers,
                        timeout=aiohttp.ClientTimeout(total=2),
                    ) as resp:
                        view = await resp.json() if resp.status == 200 else {}
                    leader = view.get("leader_url") if isinstance(view, dict) else None
                    if leader and leader.rstrip("/") != url.rstrip("/"):
                        break
                await asyncio.sleep(PROBE_S)
        finally:
            moved.set()
            if self._gone.get(shard, (None,))[0] == url:
                del self._gone[shard]

    async def close(self) -> None:
        """Tell every worker to connect again elsewhere (and refuse new ones), and stop."""
        self._closed = True
        for task in list(self._probes):
            task.cancel()
        for session in list(self.sessions):
            await session.end(tell=True)
        for link in self.links:
            await link.close()
        if self._remote is not None:
            await self._remote.close()

    def welcome(self) -> messages.Welcome:
        sched = self.cfg.scheduler
        return messages.Welcome(
            node_id=self.cfg.node.id,
            heartbeat_interval=sched.heartbeat_interval_ms / 1000,
            lease_timeout=sched.heartbeat_timeout_ms / 1000,
        )

    async def serve(self, request: web.Request) -> web.StreamResponse:
        if self._closed:  # the node stops
            return error_answer(Unavailable("this node is stopping", retry_after=1))
        if self.setting_up >= MAX_SETTING_UP:
            return error_answer(
                Unavailable(
                    f"this node is connecting {self.setting_up} workers to the shards; try "
                    "another node, or again in a second",
                    retry_after=1,
                )
            )
        admitted = _Admitted(self)
        try:
            return await self._serve(request, admitted)
        finally:
            admitted.release()

    async def _serve(self, request: web.Request, admitted: _Admitted) -> web.StreamResponse:
        headers = {k: request.headers[k] for k in _PASSED if k in request.headers}
        if request.remote:
            headers["X-Forwarded-For"] = request.remote
        refused = await self._check(headers)
        if refused is not None:
            return refused
        outer = web.WebSocketResponse(heartbeat=20.0, max_msg_size=MAX_FRAME)
        await outer.prepare(request)
        try:
            hello = await _hello(outer)
        except (TimeoutError, ProtocolError) as exc:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await outer.send_str(
                    messages.encode(messages.Error(code="invalid_argument", message=str(exc)))
                )
            await outer.close()
            return outer
        session = _Session(self, outer, hello, headers, admitted)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
        return outer

    async def _check(self, headers: dict[str, str]) -> web.Response | None:
        """Shard 0 of this node checks the worker's credentials before its upgrade is
        answered (the front door holds no tokens): the refusal to answer, or None."""
        try:
            async with self.local(0).get(
                f"http://shard0{WHOAMI_PATH}",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=HANDSHAKE_TIMEOUT_S),
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_answer(
                Unavailable(f"shard 0 does not answer ({exc or type(exc).__name__})", retry_after=1)
            )
        if status != 200:
            return web.Response(status=status, body=body, content_type="application/json")
        try:
            who = orjson.loads(body)
            name, role, actions = who["name"], who["role"], who["actions"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return error_answer(Unavailable("shard 0 answered no identity", retry_after=1))
        if "worker" not in actions:
            return error_answer(
                PermissionDenied(
                    f"token {name!r} has role {role!r}, which may not perform 'worker' (the "
                    "worker protocol needs a token of role worker or admin)"
                )
            )
        return None


async def _hello(outer: web.WebSocketResponse) -> messages.Hello:
    async with asyncio.timeout(HELLO_TIMEOUT_S):
        frame = await outer.receive()
    if frame.type is not aiohttp.WSMsgType.TEXT:
        raise ProtocolError("expected a hello frame first")
    hello = messages.decode(frame.data)
    if not isinstance(hello, messages.Hello):
        raise ProtocolError(f"expected a hello frame first, got {type(hello).__name__.lower()}")
    return hello


class _Admitted:
    """A worker counted among those being connected to the shards, until :meth:`release`."""

    def __init__(self, mux: WorkerMux) -> None:
        self.mux: WorkerMux | None = mux
        mux.setting_up += 1

    def release(self) -> None:
        if self.mux is not None:
            self.mux.setting_up -= 1
            self.mux = None


class _Session:
    """One worker served from every shard: what it holds, what waits for a slot, and the
    connection to each shard."""

    def __init__(
        self,
        mux: WorkerMux,
        outer: web.WebSocketResponse,
        hello: messages.Hello,
        headers: dict[str, str],
        admitted: _Admitted | None = None,
    ) -> None:
        self.mux = mux
        self.admitted = admitted
        self.outer = outer
        self.hello = hello
        self.capacity = hello.capacity
        self.headers = headers  # the worker's request's (its credentials, for the probes)
        self.host = headers.get("X-Forwarded-For")  # where it connects from
        self.w = next(mux._ids)  # its number on the links
        n = mux.shards
        #: the leases the worker holds (delivered, not acked or cancelled): run id -> fence
        self.holding: list[dict[str, int]] = [{} for _ in range(n)]
        for ref in hello.resume:
            self.holding[self.shard_of(ref.run_id)][ref.run_id] = ref.fence
        self.held: deque[tuple[int, messages.Lease, str]] = deque()  # over C: waits for a slot
        self.results: list[dict[str, str]] = [{} for _ in range(n)]  # sent, not acked
        self.frames = 0  # capacity frames sent to the shards (logged as the worker leaves)
        self.draining = False
        self.closed = False
        self.inners = [_Inner(self, k) for k in range(n)]
        self._offer_soon = False
        self.out = _Outbox(outer)
        self._beats: asyncio.Task[None] | None = None

    def tried(self) -> None:
        """A shard connection's first attempt ended (made, or failed: a shard with no leader
        to reach goes on trying in the background): once every shard's has, the worker is no
        longer counted among those being connected."""
        if self.admitted is not None and all(inner.attempted for inner in self.inners):
            self.admitted.release()
            self.admitted = None

    def shard_of(self, run_id: str) -> int:
        found = shard_of_id(run_id, self.mux.shards)
        return 0 if found is None else found

    @property
    def used(self) -> int:
        return sum(len(h) for h in self.holding)

    def offer(self, shard: int) -> int:
        """What shard ``shard`` may lease the worker: what it holds from it (or waits here),
        plus the worker's free slots."""
        free = 0 if self.draining else self.capacity - self.used - len(self.held)
        mine = len(self.holding[shard]) + sum(1 for k, _, _ in self.held if k == shard)
        return mine + max(0, free)

    def resume(self, shard: int) -> tuple[LeaseRef, ...]:
        refs = [LeaseRef(r, f) for r, f in self.holding[shard].items()]
        refs += [LeaseRef(lease.run_id, lease.fence) for k, lease, _ in self.held if k == shard]
        return tuple(refs)

    # -- the worker's side ---------------------------------------------------------------
    async def run(self) -> None:
        self.send_worker(self.mux.welcome())
        for inner in self.inners:
            self.mux.links[inner.shard].join(inner)
        try:
            async for frame in self.outer:
                if frame.type is not aiohttp.WSMsgType.TEXT:
                    continue
                self.from_worker(frame.data)
        finally:
            self.closed = True
            if self._beats is not None:
                self._beats.cancel()
                await asyncio.gather(self._beats, return_exceptions=True)
            for inner in self.inners:
                self.mux.links[inner.shard].leave(inner)
            await self.out.close()
            log_event(
                log,
                "mux.worker_gone",
                worker_id=self.hello.worker_id,
                holding=self.used,
                held=len(self.held),
                capacity_frames=self.frames,
            )

    def from_worker(self, text: str) -> None:
        try:
            msg = messages.decode(text)
        except ProtocolError as exc:
            self.send_worker(messages.Error(code="invalid_argument", message=str(exc)))
            return
        if isinstance(msg, messages.Heartbeat):
            split: list[list[LeaseRef]] = [[] for _ in self.inners]
            for ref in msg.leases:
                split[self.shard_of(ref.run_id)].append(ref)
            for k, lease, _ in self.held:
                split[k].append(LeaseRef(lease.run_id, lease.fence))
            now = time.monotonic()
            for inner, refs in zip(self.inners, split, strict=True):
                if refs or now - inner.beat_at >= QUIET_BEAT_S:
                    inner.beat(refs, now)
        elif isinstance(msg, messages.Complete | messages.Fail):
            k = self.shard_of(msg.run_id)
            self.results[k][msg.run_id] = text
            self.inners[k].send(text)
        elif isinstance(msg, messages.Drain):
            self.draining = True
            for inner in self.inners:
                inner.send(text)
            self.offer_soon()
        elif isinstance(msg, messages.Capacity):
            self.capacity = msg.capacity
            self.hand_over()
            self.offer_soon()
        else:
            self.send_worker(
                messages.Error(
                    code="invalid_argument",
                    message=f"unexpected {type(msg).__name__.lower()} frame",
                )
            )

    def send_worker(self, msg: messages.Message) -> None:
        self.send_worker_text(messages.encode(msg))

    def send_worker_text(self, text: str) -> None:
        if not self.closed:
            self.out.put(text)

    # -- the shards' side ----------------------------------------------------------------
    def lease(self, shard: int, lease: messages.Lease, text: str) -> None:
        if self.held or self.used >= self.capacity:
            self.held.append((shard, lease, text))
            if self._beats is None or self._beats.done():
                self._beats = asyncio.create_task(self._beat_held())
        else:
            self.holding[shard][lease.run_id] = lease.fence
            self.send_worker_text(text)
        self.offer_soon()

    def ended(self, shard: int, run_id: str) -> None:
        """The worker holds ``run_id`` no more (acked, or cancelled)."""
        if self.holding[shard].pop(run_id, None) is not None:
            self.hand_over()
        self.offer_soon()

    def cancelled(self, shard: int, msg: messages.Cancel, text: str) -> None:
        for i, (k, lease, _) in enumerate(self.held):
            if k == shard and lease.run_id == msg.run_id and lease.fence <= msg.fence:
                del self.held[i]  # never shown to the worker: nothing to tell it
                self.offer_soon()
                return
        held = self.holding[shard].get(msg.run_id)
        if held is not None and held <= msg.fence:
            self.results[shard].pop(msg.run_id, None)
            self.ended(shard, msg.run_id)
        self.send_worker_text(text)

    def hand_over(self) -> None:
        """Leases waiting here go to the worker while it has free slots."""
        while self.held and self.used < self.capacity:
            shard, lease, text = self.held.popleft()
            self.holding[shard][lease.run_id] = lease.fence
            self.send_worker_text(text)

    async def _beat_held(self) -> None:
        """While leases wait here, heartbeat them to their shards (the worker does not know
        them, so its own heartbeats, and the pace a lease asks for, do not count them)."""
        while self.held and not self.closed:
            pace = min(
                HELD_BEAT_S, *(lease.heartbeat_interval or HELD_BEAT_S for _, lease, _ in self.held)
            )
            await asyncio.sleep(pace)
            split: list[list[LeaseRef]] = [[] for _ in self.inners]
            for k, lease, _ in self.held:
                split[k].append(LeaseRef(lease.run_id, lease.fence))
            for inner, refs in zip(self.inners, split, strict=True):
                if refs:
                    inner.beat(refs, time.monotonic())

    def offer_soon(self) -> None:
        """Tell each shard its offer once this turn of the loop is done (many changes of one
        turn send one frame per shard)."""
        if not self._offer_soon:
            self._offer_soon = True
            asyncio.get_running_loop().call_soon(self._offer)

    def _offer(self) -> None:
        self._offer_soon = False
        for inner in self.inners:
            inner.offer(self.offer(inner.shard))

    async def end(self, tell: bool) -> None:
        """The front door stops: tell the worker to connect again (elsewhere)."""
        if tell:
            self.send_worker(messages.Redirect(leader=None))
        await self.out.close()
        await self.outer.close()


class _Inner:
    """A session's worker connection to one shard's leader, on this front door's link to it."""

    def __init__(self, session: _Session, shard: int) -> None:
        self.session = session
        self.shard = shard
        #: where the worker's frames for the shard go once the shard said welcome (None before)
        self.out: _Via | _Outbox | None = None
        self.offered = -1
        self.beat_at = -QUIET_BEAT_S  # when a heartbeat last went to this connection (monotonic)
        self.attempted = False  # whether the first connection attempt has ended
        self.said = -1  # the link's connection the last hello went on (-1: none)

    @property
    def w(self) -> int:
        return self.session.w

    def send(self, text: str) -> None:
        if self.out is not None:
            self.out.put(text)

    def beat(self, refs: list[LeaseRef], now: float) -> None:
        if self.out is not None:
            self.beat_at = now
            self.out.put(messages.encode(messages.Heartbeat(tuple(refs))), lazy=True)

    def offer(self, capacity: int) -> None:
        if self.out is not None and capacity != self.offered:
            self.offered = capacity
            self.session.frames += 1
            self.send(messages.encode(messages.Capacity(capacity)))

    def hello_frames(self) -> list[str]:
        """The worker's hello to the shard, with the leases it holds of it and its offer (and
        the offer lowered at once, when less than the hello's least)."""
        session = self.session
        self.out = None
        offer = session.offer(self.shard)
        hello = session.hello
        frames = [
            messages.encode(
                messages.Hello(
                    worker_id=hello.worker_id,
                    queues=hello.queues,
                    capacity=max(1, offer),
                    resume=session.resume(self.shard),
                    version=hello.version,
                    tasks=hello.tasks,
                )
            )
        ]
        if offer < 1:  # the hello's least is 1: lowered at once
            frames.append(messages.encode(messages.Capacity(offer)))
        self.offered = offer
        return frames

    def hello(self, link: _Link) -> None:
        """Say hello for the worker on ``link`` (just made, or the shard closed the worker's
        connection on it)."""
        session = self.session
        if session.closed:
            return
        text, *lowered = self.hello_frames()
        link.put(
            {
                "w": self.w,
                "t": "hello",
                "f": text,
                "node": session.mux.cfg.node.id,
                "host": session.host,
                "whole": session.capacity,
            }
        )
        for frame in lowered:
            link.put({"w": self.w, "t": "frame", "f": frame})
        self.said = link.made

    def tried(self) -> None:
        if not self.attempted:
            self.attempted = True
            self.session.tried()

    def lost(self) -> None:
        """The link to the shard's leader is gone (it says hello again once made again)."""
        self.out = None
        self.offered = -1
        self.said = -1

    def bye(self, link: _Link) -> None:
        """The shard closed the worker's connection (its leader steps down, or took a newer
        connection of the same worker): hello again after a while, on the link as it is then
        (unless that link was made again meanwhile: it said hello for every worker)."""
        said = self.said
        self.lost()
        if self.session.closed:
            return

        def again() -> None:
            if link.ws is not None and link.made == said and self.out is None and self.said < 0:
                self.hello(link)

        delay = random.uniform(RETRY_MIN_S, 2 * RETRY_MIN_S)
        asyncio.get_running_loop().call_later(delay, again)

    def from_shard(self, link: _Link | _Single, text: str) -> None:
        if self.out is not None:
            self._from_shard(text)
            return
        try:
            msg = messages.decode(text)
        except ProtocolError:
            return
        if isinstance(msg, messages.Welcome):
            session = self.session
            self.out = link.via(self)
            self.beat_at = -QUIET_BEAT_S  # a new leader hears the worker's next heartbeat
            for result in list(session.results[self.shard].values()):
                self.send(result)  # the results the shard has not acked: again, as the worker would
            if session.draining:
                self.send(messages.encode(messages.Drain()))
            self.tried()
            session.offer_soon()
        elif isinstance(msg, messages.Error):
            self.session.send_worker_text(text)

    def _from_shard(self, text: str) -> None:
        """Pass on one frame of the shard's."""
        session = self.session
        try:
            msg = messages.decode(text)
        except ProtocolError:
            return
        if isinstance(msg, messages.Lease):
            session.lease(self.shard, msg, text)
        elif isinstance(msg, messages.Ack):
            session.results[self.shard].pop(msg.run_id, None)
            session.send_worker_text(text)
            session.ended(self.shard, msg.run_id)
        elif isinstance(msg, messages.Cancel):
            session.cancelled(self.shard, msg, text)
        elif isinstance(msg, messages.Drain | messages.Error):
            session.send_worker_text(text)
        # (a redirect: the shard's leader steps down; its link says where the new one is)


class _Via:
    """A worker's frames to one shard, on the link to it."""

    __slots__ = ("link", "w")

    def __init__(self, link: _Link, w: int) -> None:
        self.link = link
        self.w = w

    def put(self, text: str, lazy: bool = False) -> None:
        self.link.put({"w": self.w, "t": "frame", "f": text}, lazy)


class _Link:
    """This front door's websocket to one shard's leader, carrying the worker connections of
    every worker it serves (:mod:`schedd.api.links` is the other end): to this node's process
    of the shard, or through the front door of the node that leads it (``X-Schedd-Shard``),
    following its redirects, and made again after a failover, every worker saying hello again
    with the leases it holds."""

    def __init__(self, mux: WorkerMux, shard: int) -> None:
        self.mux = mux
        self.shard = shard
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.out: _Outbox | None = None
        self.inners: dict[int, _Inner] = {}
        self.envelopes: PerTurn[dict[str, Any]] = PerTurn(self._send, LAZY_S)
        self.made = 0  # connections made so far (the current one's number while connected)
        self.tried: str | None = None  # the leader's URL the last connection was sent to
        self.task: asyncio.Task[None] | None = None
        #: while the shard's leader is a node of an earlier build (at ``single_url``): each
        #: worker's own connection to it
        self.singles: dict[int, _Single] | None = None
        self.single_url = ""
        self.single_ended = asyncio.Event()  # its leader went away: ask who leads again

    def via(self, inner: _Inner) -> _Via:
        return _Via(self, inner.w)

    def join(self, inner: _Inner) -> None:
        self.inners[inner.w] = inner
        if self.ws is not None:
            inner.hello(self)
        elif self.singles is not None:
            self.singles[inner.w] = _Single(self, inner, self.single_url)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.run())

    def leave(self, inner: _Inner) -> None:
        if self.inners.get(inner.w) is inner:
            del self.inners[inner.w]
            if inner.said >= 0:
                self.put({"w": inner.w, "t": "bye"})
            single = self.singles.pop(inner.w, None) if self.singles is not None else None
            if single is not None:
                single.close()
        inner.lost()

    def put(self, envelope: dict[str, Any], lazy: bool = False) -> None:
        """Send ``envelope`` after this turn of the loop (``lazy``: within ``LAZY_S``)."""
        if self.ws is not None:  # (else: what a worker needs again is sent once it is made)
            self.envelopes.put(envelope, lazy)

    def _send(self, turn: list[dict[str, Any]]) -> None:
        if self.out is not None:
            self.out.put(orjson.dumps(turn))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task

    def _probe_headers(self) -> dict[str, str] | None:
        """A worker's request headers on the link (its credentials may ask who leads)."""
        return next((inner.session.headers for inner in self.inners.values()), None)

    async def run(self) -> None:
        mux = self.mux
        failures = 0
        while not mux._closed:
            self.tried = None
            moved: asyncio.Event | None = None
            try:
                ws = await self._open()
            except _EarlierBuild as exc:
                failures = 0 if await self._single(exc.url) else failures + 1
                await asyncio.sleep(_backoff(failures))
                continue
            except (aiohttp.ClientError, ConnectionError, TimeoutError, ValueError) as exc:
                log_event(
                    log,
                    "mux.shard_unreachable",
                    level=logging.DEBUG,
                    shard=self.shard,
                    error=str(exc) or type(exc).__name__,
                )
                ws = None
                headers = self._probe_headers()
                if self.tried is not None and headers is not None:  # wait for another leader
                    moved = mux.unreachable(self.shard, self.tried, headers)
            if ws is None:
                for inner in list(self.inners.values()):
                    inner.tried()
                failures += 1
                # (woken early once the shard names another leader than the one it tried)
                await wait_event(moved or asyncio.Event(), _backoff(failures))
                continue
            failures = 0
            self.made += 1
            self.ws, self.out = ws, _Outbox(ws)
            for inner in list(self.inners.values()):
                inner.hello(self)
            try:
                async for frame in ws:
                    if frame.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                        continue
                    if self._from_shard(frame.data):
                        break
            finally:
                self.ws = None
                self.envelopes.pending = []
                out, self.out = self.out, None
                for inner in list(self.inners.values()):
                    inner.lost()
                if out is not None:
                    await out.close()
                await ws.close()

    async def _single(self, url: str) -> bool:
        """Serve each worker with its own connection to the shard's leader at ``url`` (a node
        of an earlier build) until one of them finds it gone (it names another leader, or
        does not answer); whether any was welcomed."""
        log_event(log, "mux.shard_single", shard=self.shard, leader=url)
        self.single_ended.clear()
        self.single_url = url
        singles = self.singles = {w: _Single(self, inner, url) for w, inner in self.inners.items()}
        try:
            await self.single_ended.wait()
        finally:
            self.singles = None
            for single in singles.values():
                single.close()
            await asyncio.gather(*(s.task for s in singles.values()), return_exceptions=True)
            for inner in self.inners.values():
                inner.lost()
        return any(single.welcomed for single in singles.values())

    def _from_shard(self, data: str | bytes) -> bool:
        """Pass on one message of the shard's; True when the link ends (the shard's leader
        went away: link again, to the one it names)."""
        try:
            envelopes = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(envelopes, list):
            return False
        for envelope in envelopes:
            if not isinstance(envelope, dict):
                continue
            kind = envelope.get("t")
            if kind == "redirect":
                self._moved(envelope.get("leader"))
                return True
            inner = self.inners.get(envelope.get("w"))  # type: ignore[arg-type]
            if inner is None:
                continue
            if kind == "frame" and isinstance(envelope.get("f"), str):
                inner.from_shard(self, envelope["f"])
            elif kind == "bye":
                inner.bye(self)
        return False

    def _moved(self, leader: Any) -> None:
        mux = self.mux
        if isinstance(leader, str) and leader and not mux.here(leader):
            mux.leaders[self.shard] = leader
        else:
            mux.leaders.pop(self.shard, None)  # ask this node's process of the shard again

    async def _open(self) -> aiohttp.ClientWebSocketResponse | None:
        """A link to the shard's leader, which said it is ready; None: no leader is known."""
        mux = self.mux
        url = mux.leaders.get(self.shard)
        for _ in range(MAX_HOPS):
            if url is None:
                ws = await mux.local(self.shard).ws_connect(
                    f"http://shard{self.shard}{LINK_PATH}",
                    headers=mux.link_headers(),
                    max_msg_size=MAX_LINK_MESSAGE,
                )
            else:
                self.tried = url
                try:
                    ws = await mux.remote.ws_connect(
                        url.rstrip("/") + LINK_PATH,
                        headers={**mux.link_headers(), SHARD_HEADER: str(self.shard)},
                        max_msg_size=MAX_LINK_MESSAGE,
                        heartbeat=20.0,
                        ssl=mux._ssl,
                    )
                except Exception as exc:  # (not a cancel: the node it leads from is not in doubt)
                    if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status == 404:
                        mux.reached(self.shard, url)  # it answered: its front door has no links
                        raise _EarlierBuild(url) from None
                    if mux.leaders.get(self.shard) == url:
                        del mux.leaders[self.shard]  # ask this node's process next time
                    raise
                self.tried = None  # it answered
                mux.reached(self.shard, url)
            try:
                async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                    frame = await ws.receive()
                first = orjson.loads(frame.data) if frame.type is aiohttp.WSMsgType.BINARY else []
            except (TimeoutError, orjson.JSONDecodeError):
                first = []
            said = first[0] if isinstance(first, list) and first else {}
            if not isinstance(said, dict):
                said = {}
            if said.get("t") == "ready":
                if url is None:
                    mux.leaders.pop(self.shard, None)  # led here
                else:
                    mux.leaders[self.shard] = url
                return ws
            if url is not None and mux.leaders.get(self.shard) == url:
                del mux.leaders[self.shard]  # it leads no more
            await ws.close()
            leader = said.get("leader")
            if said.get("t") != "redirect" or not isinstance(leader, str) or not leader:
                return None
            url = None if mux.here(leader) else leader
        return None


def _backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: ``RETRY_MIN_S`` doubling
    to ``RETRY_MAX_S``, a random point in the upper half of the step."""
    delay = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** min(failures, 8))
    return random.uniform(delay / 2, delay)


class _EarlierBuild(Exception):
    """The shard's leader is a node whose front door has no links (an earlier build)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


#: what a front door of the earlier build told a shard's leader with each worker's connection:
#: the node serving the worker and its whole capacity (the leader's workers view shows them)
RELAY_NODE_HEADER = "X-Schedd-Relay-Node"
RELAY_CAPACITY_HEADER = "X-Schedd-Relay-Capacity"


class _Single:
    """One worker's own connection to a shard's leader on a node of an earlier build: the
    worker endpoint through that node's front door (``X-Schedd-Shard``), with the worker's
    credentials and the headers that build's front doors sent (the node serving the worker,
    its whole capacity).  Made again after a while when it closes, as that build did; when
    the leader names another or does not answer, its link asks again who leads the shard."""

    def __init__(self, link: _Link, inner: _Inner, url: str) -> None:
        self.link = link
        self.inner = inner
        self.url = url
        self.out: _Outbox | None = None
        self.welcomed = False  # whether the shard said welcome to it once
        self.task = asyncio.create_task(self.run())

    def via(self, inner: _Inner) -> _Outbox:
        assert self.out is not None
        return self.out

    def close(self) -> None:
        self.task.cancel()

    async def run(self) -> None:
        failures = 0
        try:
            while True:
                gone, welcomed = await self._once()
                self.inner.tried()
                if gone:
                    self.link.single_ended.set()
                    return
                failures = 0 if welcomed else failures + 1
                await asyncio.sleep(_backoff(failures))
        finally:
            self.inner.tried()

    async def _once(self) -> tuple[bool, bool]:
        """One connection, until it closes: (whether the leader is gone, whether it said
        welcome)."""
        inner, session, mux = self.inner, self.inner.session, self.link.mux
        headers = {
            **session.headers,
            SHARD_HEADER: str(inner.shard),
            RELAY_NODE_HEADER: mux.cfg.node.id,
            RELAY_CAPACITY_HEADER: str(session.capacity),
        }
        try:
            ws = await mux.remote.ws_connect(
                self.url.rstrip("/") + CONNECT_PATH,
                headers=headers,
                max_msg_size=MAX_FRAME,
                heartbeat=20.0,
                ssl=mux._ssl,
            )
        except aiohttp.WSServerHandshakeError:
            return False, False  # (it answered: refused this worker, e.g. its token)
        except (aiohttp.ClientError, ConnectionError, TimeoutError, ValueError):
            return True, False  # the leader's node does not answer
        out = self.out = _Outbox(ws)
        welcomed = False
        try:
            for text in inner.hello_frames():
                out.put(text)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                frame = await ws.receive()
            while frame.type is aiohttp.WSMsgType.TEXT:
                if '"redirect"' in frame.data and self._moved(frame.data):
                    return True, welcomed
                inner.from_shard(self, frame.data)
                if not welcomed:
                    if inner.out is not out:
                        return False, False  # (an error: passed on to the worker)
                    welcomed = self.welcomed = True
                frame = await ws.receive()
            return False, welcomed
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return False, welcomed
        finally:
            if inner.out is out:
                inner.lost()
            try:
                await out.close()
            finally:
                await ws.close()

    def _moved(self, data: str) -> bool:
        """Whether ``data`` is the leader's redirect (it leads no more: the link is told who
        does)."""
        try:
            said = messages.decode(data)
        except ProtocolError:
            return False
        if not isinstance(said, messages.Redirect):
            return False
        self.link._moved(said.leader)
        return True


class _Outbox:
    """The frames for one websocket, sent in order by one task."""

    def __init__(self, ws: web.WebSocketResponse | aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._write())

    def put(self, text: str | bytes, lazy: bool = False) -> None:
        self.queue.put_nowait(text)

    async def close(self) -> None:
        self.queue.put_nowait(None)
        with contextlib.suppress(Exception):
            await self.task

    async def _write(self) -> None:
        while (text := await self.queue.get()) is not None:
            try:
                if isinstance(text, bytes):
                    await self.ws.send_bytes(text)
                else:
                    await self.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                return
