"""A node's front door, when the cluster has several shards: the API on ``http.listen``, in
the supervisor's process, that sends each request to the shard it concerns (that shard's
process on this node, over its socket) and merges the listings of every shard.

Where a request goes:

- ``X-Schedd-Shard: K`` (a node asking another node's shard K, e.g. its leader): shard K;
- a job or a run named in the path (``/jobs/{id}...``, ``/runs/{id}...``): the shard its id
  says (``schedd.ids.shard_of_id``);
- ``POST /jobs``: the shard of its upstream jobs (``depends_on`` by id), else of its
  ``idempotency_key`` (with its namespace), else of its ``X-Request-Id`` (a retry lands in the
  same shard and is deduplicated there), else the next shard in turn; ``POST /jobs/batch``:
  one shard for the whole batch, by the same rules on its first job;
- ``GET /jobs`` and ``GET /dlq``: every shard, merged (:func:`merge_pages`);
- anything else: shard 0.

Each shard authenticates the request itself (the front door passes the caller's
``Authorization`` on and holds no tokens of its own).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import itertools
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from schedd import clock
from schedd.config import Config, join_hostport, peer_ssl_context, split_hostport
from schedd.core.fairness import TokenBucket, take_submits
from schedd.core.model import Direction, JobSort
from schedd.errors import InvalidArgument, SchedError, Unavailable
from schedd.ids import is_job_id, shard_of_id, shard_of_key
from schedd.logs import log_event
from schedd.protocol.headers import (
    CONSISTENCY_HEADER,
    INDEX_HEADER,
    MIN_INDEX_HEADER,
    SHARD_HEADER,
    SHARDS_HEADER,
)
from schedd.protocol.signed import CAPS_PATH
from schedd.protocol.timing import CONNECT_PATH
from schedd.shard.answers import error_answer as _error
from schedd.shard.caps import CapsCoordinator
from schedd.shard.feeds import LAG_MS, merged_events
from schedd.shard.layout import shard_address
from schedd.shard.link import LinkError, ShardLink
from schedd.shard.mux import WorkerMux

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
_BY_ID = re.compile(rf"^{PREFIX}/(?:jobs|runs)/([^/]+)")
#: headers of one hop, not passed on (RFC 9110 7.6.1), and those aiohttp sets itself
_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
CAPS_ASK_TIMEOUT_S = 10.0  # the coordinator's request to a shard (a give waits for its commit)
BARRIER_TIMEOUT_S = 5.0  # a barrier asked of a shard whose change feed lags (_nudge)
#: a merged listing's cursor: this prefix, then each shard's own cursor (base64 of JSON)
CURSOR_PREFIX = "s1."


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_UNREAD: Any = object()  # a request body not read as JSON


class BadCursor(ValueError):
    pass


class BadShard(ValueError):
    """A request names a shard this cluster does not have."""


def encode_cursor(cursors: Sequence[str | None]) -> str:
    raw = orjson.dumps(list(cursors))
    return CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str, shards: int) -> list[str | None]:
    """Each shard's own cursor (None: that shard is read to its end) from a merged cursor."""
    if not text.startswith(CURSOR_PREFIX):
        raise BadCursor(text)
    body = text[len(CURSOR_PREFIX) :]
    try:
        value = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except ValueError:
        raise BadCursor(text) from None
    if (
        not isinstance(value, list)
        or len(value) != shards
        or not all(c is None or isinstance(c, str) for c in value)
    ):
        raise BadCursor(text)
    return value


@dataclass(frozen=True, slots=True)
class Page:
    """One shard's page: its items in the listing's order with each item's own cursor, and
    where it goes on (None: nothing more)."""

    items: Sequence[Any]
    places: Sequence[str]
    cursor: str | None


def merge_pages(
    pages: Sequence[Page | None],
    limit: int,
    key: Callable[[Any], Any],
    desc: bool,
    previous: Sequence[str | None],
) -> tuple[list[Any], list[str | None] | None]:
    """One page of at most ``limit`` items from the shards' pages (None: a shard read to its
    end before), taken in the listing's order from the heads of the shards' pages, and each
    shard's cursor after it (None for all: the listing ends here).

    Every item of every shard comes once, in its shard's order, whatever the keys say; the
    merged page is in ``key`` order where the shards agree with it.  A shard whose page ran
    out while it has more stops the merge there (its next items are not known yet); one that
    read nothing to give and has more makes the page empty, with that shard moved on (a
    filtered listing read in windows: its pages may be short, or empty, and still go on)."""
    cursors: list[str | None] = list(previous)
    heads: list[tuple[Any, int, int]] = []
    unknown = False  # a shard read nothing it could give yet, and has more
    for s, page in enumerate(pages):
        if page is None:
            continue
        if page.items:
            heads.append((_order(key(page.items[0]), desc), s, 0))
        else:
            cursors[s] = page.cursor
            unknown = unknown or page.cursor is not None
    if unknown:  # its next items may come before any other's: this page ends here, empty
        return [], cursors
    heapq.heapify(heads)
    out: list[Any] = []
    while heads and len(out) < limit:
        _, s, i = heapq.heappop(heads)
        page = pages[s]
        assert page is not None
        out.append(page.items[i])
        cursors[s] = page.places[i]
        if i + 1 < len(page.items):
            heapq.heappush(heads, (_order(key(page.items[i + 1]), desc), s, i + 1))
        else:
            cursors[s] = page.cursor  # read to its page's end: where the shard goes on
            if page.cursor is not None:
                break  # its next items may come before any other head
    if all(c is None for c in cursors):
        return out, None
    return out, cursors


class _Rev:
    """A key in reverse order (for a descending listing)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Rev) -> bool:
        return bool(other.key < self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rev) and self.key == other.key


def _order(key: Any, desc: bool) -> Any:
    return _Rev(key) if desc else key


_AFTER = "~"  # sorts after every ISO time: a job with no next fire, as the shards order it
_BEFORE = ""  # sorts before every ISO time: a job not run yet, as the shards order it


def job_key(sort: JobSort) -> Callable[[Any], Any]:
    """A job view's place in a listing of ``sort``, as its shard orders it (schedd.core.model
    JobSort), the id breaking ties."""
    if sort is JobSort.NEXT_FIRE:
        return lambda j: (j.get("next_run_at") or _AFTER, j["id"])
    if sort is JobSort.LATEST_RUN:
        return lambda j: ((j.get("latest_run") or {}).get("scheduled_at") or _BEFORE, j["id"])
    return lambda j: (j["created_at"], j["id"])


def _dlq_key(run: Any) -> Any:
    return (run.get("updated_at") or "", run["id"])


class Bodies(list[bytes]):
    """The shards' answers to one request, with the highest position (``X-Schedd-Index``,
    a stamp) they carried: the one a merged answer carries."""

    position: int = 0


class FrontDoor:
    def __init__(self, cfg: Config, sockets: Sequence[str]) -> None:
        self.cfg = cfg
        self.shards = len(sockets)
        self._sockets = list(sockets)
        self._sessions: list[aiohttp.ClientSession] = []  # streams and websockets
        self._links = [ShardLink(path) for path in sockets]  # everything else
        self._turn = itertools.count()
        limits = cfg.limits
        #: the node's per-namespace submission rates (the shards' own are off: one bucket for
        #: the node, as with one shard)
        self._buckets = {
            ns: TokenBucket(rate, limits.submit_burst) for ns, rate in cfg.node_submit_rates()
        }
        self.mux = WorkerMux(
            cfg, self.shards, lambda k: self._sessions[k], peer_ssl_context(cfg) or True
        )
        self.caps = CapsCoordinator(cfg, self.shards, self._ask_caps)
        self._caps_task: asyncio.Task[None] | None = None
        #: barriers asked of shards whose change feed lags (schedd.shard.feeds): when each
        #: shard was last asked, and the requests under way
        self._nudged: dict[int, float] = {}
        self._barriers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._sessions = [
            aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path, limit=0),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            )
            for path in self._sockets
        ]
        self._caps_task = asyncio.create_task(self.caps.run())

    async def close(self) -> None:
        for task in list(self._barriers):
            task.cancel()
        await asyncio.gather(*self._barriers, return_exceptions=True)
        if self._caps_task is not None:
            self._caps_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._caps_task
        await self.mux.close()
        for link in self._links:
            await link.close()
        for session in self._sessions:
            await session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.http.max_body + (64 << 10))
        merged = {
            ("GET", f"{PREFIX}/jobs"): self.list_jobs,
            ("GET", f"{PREFIX}/dlq"): self.list_dlq,
            ("GET", "/metrics"): self.metrics,
            ("GET", "/readyz"): self.readyz,
            ("GET", f"{PREFIX}/cluster"): self.cluster,
            ("GET", f"{PREFIX}/workers"): self.workers,
            ("POST", f"{PREFIX}/workers/{{worker_id}}/drain"): self.drain_worker,
            ("GET", f"{PREFIX}/events"): self.events,
            ("POST", f"{PREFIX}/cluster/nodes"): self.add_node,
            ("DELETE", f"{PREFIX}/cluster/nodes/{{node}}"): self.remove_node,
        }
        for (method, path), handler in merged.items():
            app.router.add_route(method, path, self._all_or_named(handler))
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def _all_or_named(self, handler: Handler) -> Handler:
        """``handler``, which asks every shard, unless the request names one shard (another
        node's process of that shard asking this node's): then that shard alone answers."""

        async def either(request: web.Request) -> web.StreamResponse:
            if SHARD_HEADER in request.headers:
                return await self.handle(request)
            return await handler(request)

        return either

    async def _ask_caps(self, shard: int, body: dict[str, Any]) -> tuple[int, Any]:
        """The coordinator's signed request to shard ``shard``'s leader (through this node's
        process of the shard, which asks its leader if it does not lead)."""
        headers = (("Content-Type", "application/json"), ("X-Forwarded-For", "127.0.0.1"))
        try:
            status, _, raw = await asyncio.wait_for(
                self._links[shard].request("POST", CAPS_PATH, headers, orjson.dumps(body)),
                CAPS_ASK_TIMEOUT_S,
            )
        except LinkError as exc:
            raise OSError(str(exc)) from None
        return status, _loads(raw)

    # -- routing ---------------------------------------------------------------------------
    def _rotate(self) -> int:
        return next(self._turn) % self.shards

    def route(self, request: web.Request, body: bytes, doc: Any = _UNREAD) -> int:
        named = request.headers.get(SHARD_HEADER)
        if named is not None:
            try:
                shard = int(named)
            except ValueError:
                shard = -1
            if not 0 <= shard < self.shards:
                raise BadShard(f"{SHARD_HEADER}: expected 0 to {self.shards - 1}, got {named!r}")
            return shard
        path = request.path
        if m := _BY_ID.match(path):
            if m[1] != "batch":
                found = shard_of_id(m[1], self.shards)
                return 0 if found is None else found
        if _submits(request):
            if doc is _UNREAD:
                doc = _loads(body)
            return self._submit_shard(request, doc, batch=path.endswith("/batch"))
        return 0

    def _submit_shard(self, request: web.Request, doc: Any, batch: bool) -> int:
        found = upstream_shard(doc, batch, self.shards)
        if found is not None:
            return found
        first = doc
        if batch:
            jobs = doc.get("jobs") if isinstance(doc, dict) else None
            first = jobs[0] if isinstance(jobs, list) and jobs else None
        if isinstance(first, dict):
            key = first.get("idempotency_key")
            if isinstance(key, str):
                ns = first.get("namespace") or "default"
                return shard_of_key(f"{ns}\0{key}", self.shards)
        rid = request.headers.get("X-Request-Id")
        if rid:
            return shard_of_key(rid, self.shards)
        return self._rotate()

    # -- forwarding ------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        body = b"" if websocket else await request.read()
        doc = _loads(body) if _submits(request) else _UNREAD
        try:
            shard = self.route(request, body, doc)
        except BadShard as exc:
            return _invalid(str(exc), SHARD_HEADER)
        except InvalidArgument as exc:
            return _error(exc)
        if doc is not _UNREAD and self._buckets and SHARD_HEADER not in request.headers:
            refused = take_submits(
                self._buckets,
                _namespaces(doc, request.path.endswith("/batch")),
                clock.wall_ms(),
                self.cfg.limits.submit_burst,
            )
            if refused is not None:
                return _error(refused)
        if websocket:
            if request.path == CONNECT_PATH and SHARD_HEADER not in request.headers:
                return await self.mux.serve(request)  # a worker: served from every shard
            return await self._websocket(request, shard)
        return await self.forward(request, shard, body)

    def _headers(self, request: web.Request) -> dict[str, str]:
        out = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP and k.lower() != "x-forwarded-for"
        }
        out.pop(SHARD_HEADER, None)
        # the peer as this node sees it (never one the caller names: the shard takes it as
        # the request's peer)
        out["X-Forwarded-For"] = request.remote or ""
        return out

    async def _ask(
        self, request: web.Request, shard: int, target: str, body: bytes = b""
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Shard ``shard``'s answer to this request's method on ``target`` (path and query),
        read whole."""
        headers = self._headers(request).items()
        return await self._links[shard].request(request.method, target, headers, body)

    async def forward(self, request: web.Request, shard: int, body: bytes) -> web.StreamResponse:
        if not _streams(request):
            try:
                status, headers, payload = await self._ask(
                    request, shard, str(request.rel_url), body
                )
            except LinkError as exc:
                return _unavailable(shard, exc)
            kept = CIMultiDict((k, v) for k, v in headers if k.lower() not in _HOP)
            return web.Response(status=status, body=payload, headers=kept)
        url = f"http://shard{shard}{request.rel_url}"
        try:
            upstream = await self._sessions[shard].request(
                request.method,
                url,
                headers=self._headers(request),
                data=body or None,
                allow_redirects=False,
            )
        except aiohttp.ClientError as exc:
            return _unavailable(shard, exc)
        async with upstream:
            passed = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            if request.path == f"{PREFIX}/snapshot" and SHARD_HEADER not in request.headers:
                passed[SHARDS_HEADER] = str(self.shards)  # shard 0's: ask the others by number
            response = web.StreamResponse(status=upstream.status, headers=passed)
            await response.prepare(request)
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response

    async def _websocket(self, request: web.Request, shard: int) -> web.StreamResponse:
        url = f"http://shard{shard}{request.rel_url}"
        try:
            inner = await self._sessions[shard].ws_connect(
                url, headers=self._headers(request), autoping=False, max_msg_size=0
            )
        except aiohttp.WSServerHandshakeError as exc:
            return web.json_response({"error": {"message": exc.message}}, status=exc.status)
        except aiohttp.ClientError as exc:
            return _unavailable(shard, exc)
        outer = web.WebSocketResponse(autoping=False, max_msg_size=0)
        await outer.prepare(request)

        async def pump(src: Any, dst: Any) -> None:
            async for msg in src:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    await dst.send_str(msg.data)
                elif msg.type == aiohttp.WSMsgType.BINARY:
                    await dst.send_bytes(msg.data)
                elif msg.type == aiohttp.WSMsgType.PING:
                    await dst.ping(msg.data)
                elif msg.type == aiohttp.WSMsgType.PONG:
                    await dst.pong(msg.data)
                else:
                    break

        tasks = [
            asyncio.ensure_future(pump(outer, inner)),
            asyncio.ensure_future(pump(inner, outer)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            code = inner.close_code or outer.close_code or 1000
            with contextlib.suppress(Exception):
                await outer.close(code=code, message=b"")
            with contextlib.suppress(Exception):
                await inner.close()
        return outer

    # -- merged listings -------------------------------------------------------------------
    async def _merged(
        self, request: web.Request, field: str, key: Callable[[Any], Any], desc: bool
    ) -> web.StreamResponse:
        given = request.query.get("cursor")
        try:
            previous: list[str | None] = (
                decode_cursor(given, self.shards) if given else [""] * self.shards
            )
        except BadCursor:
            shown = given[:40] if given else given
            return _invalid(
                f"cursor: expected a next_cursor of this listing, got {shown!r}", "cursor"
            )
        wanted = [s for s in range(self.shards) if previous[s] is not None]
        answers = await self._gather(
            request, [(s, _page_target(request, previous[s] or None)) for s in wanted]
        )
        if isinstance(answers, web.Response):
            return answers
        pages: list[Page | None] = [None] * self.shards
        for s, raw in zip(wanted, answers, strict=True):
            doc = orjson.loads(raw)
            pages[s] = Page(doc[field], doc.get("places") or [], doc.get("next_cursor"))
        limit = _limit(request)
        items, cursors = merge_pages(pages, limit, key, desc, previous)
        body = {field: items, "next_cursor": None if cursors is None else encode_cursor(cursors)}
        headers = {INDEX_HEADER: str(answers.position)} if answers.position else None
        return web.Response(
            body=orjson.dumps(body), content_type="application/json", headers=headers
        )

    async def _gather(
        self, request: web.Request, targets: Sequence[tuple[int, str]]
    ) -> Bodies | web.Response:
        """The bodies of the shards' answers to this request's method on each ``(shard,
        target)``; or, when one refused (a bad parameter, 401, 503), its answer, and 503 when
        one does not answer."""
        try:
            answers = await asyncio.gather(*(self._ask(request, k, t) for k, t in targets))
        except LinkError as exc:
            return _unavailable(-1, exc)
        bodies = Bodies()
        for status, headers, raw in answers:
            if status != 200:
                return web.Response(status=status, body=raw, content_type="application/json")
            bodies.append(raw)
            for name, value in headers:
                if name.lower() == INDEX_HEADER.lower() and value.isdigit():
                    bodies.position = max(bodies.position, int(value))
        return bodies

    async def _each(self, request: web.Request) -> list[bytes] | web.Response:
        """:meth:`_gather` of this very request from every shard."""
        target = str(request.rel_url)
        return await self._gather(request, [(k, target) for k in range(self.shards)])

    async def healthy(self) -> bool:
        """Whether every shard of this node answers its ``/healthz`` (within 2 s)."""
        try:
            async with asyncio.timeout(2):
                for link in self._links:
                    status, _, _ = await link.request("GET", "/healthz", (), b"")
                    if status != 200:
                        return False
        except (LinkError, TimeoutError):
            return False
        return True

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """Every shard's metrics, each sample labelled with its ``shard``."""
        answers = await self._each(request)
        if isinstance(answers, web.Response):
            return answers
        body = merge_metrics([raw.decode() for raw in answers])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readyz(self, request: web.Request) -> web.StreamResponse:
        """Ready once every shard is: the first that is not answers."""
        answers = await self._each(request)
        if isinstance(answers, web.Response):
            return answers
        leaders = [
            {"shard": k, "leader": orjson.loads(raw).get("leader")} for k, raw in enumerate(answers)
        ]
        body = {"status": "ready", "leader": leaders[0]["leader"], "shards": leaders}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def cluster(self, request: web.Request) -> web.StreamResponse:
        """Shard 0's view of the cluster, with each shard's leader, term and lag."""
        answers = await self._each(request)
        if isinstance(answers, web.Response):
            return answers
        views = [orjson.loads(raw) for raw in answers]
        body = dict(views[0])
        body["shards"] = [shard_view(k, v) for k, v in enumerate(views)]
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def workers(self, request: web.Request) -> web.StreamResponse:
        """The workers every shard's leader serves, each once: a worker served from several
        shards (through a front door) counts the leases it holds from each."""
        answers = await self._each(request)
        if isinstance(answers, web.Response):
            return answers
        body = {"workers": merge_workers([orjson.loads(raw)["workers"] for raw in answers])}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def drain_worker(self, request: web.Request) -> web.StreamResponse:
        """Drain a worker on every shard's leader that serves it (404 when none does)."""
        target = str(request.rel_url)
        try:
            answers = await asyncio.gather(
                *(self._ask(request, k, target) for k in range(self.shards))
            )
        except LinkError as exc:
            return _unavailable(-1, exc)
        found = [orjson.loads(raw) for status, _, raw in answers if status == 200]
        if found:
            return web.Response(
                body=orjson.dumps(merge_workers([found])[0]), content_type="application/json"
            )
        status, _, raw = answers[0]
        return web.Response(status=status, body=raw, content_type="application/json")

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Every shard's change feed, merged (``schedd.shard.feeds``)."""
        headers = {k: v for k, v in self._headers(request).items() if k.lower() != "last-event-id"}
        headers.pop(CONSISTENCY_HEADER, None)

        def open_feed(shard: int, query: dict[str, str]) -> Any:
            return self._sessions[shard].get(
                f"http://shard{shard}{PREFIX}/events", params=query, headers=headers
            )

        def nudge(shard: int) -> None:
            self._nudge(shard, headers)

        try:
            return await merged_events(request, self.shards, open_feed, nudge)
        except InvalidArgument as exc:
            return _error(exc)
        except aiohttp.ClientError as exc:
            return _unavailable(-1, exc)

    def _nudge(self, shard: int, headers: dict[str, str]) -> None:
        """Ask shard ``shard`` for a barrier (a consistent read commits one), unless it was
        asked within the last ``LAG_MS``: its change feed then moves to about now."""
        now = asyncio.get_running_loop().time()
        if now - self._nudged.get(shard, -math.inf) < LAG_MS / 1000:
            return
        self._nudged[shard] = now
        target = f"{PREFIX}/cluster/nodes?consistency=consistent"
        drop = (CONSISTENCY_HEADER.lower(), MIN_INDEX_HEADER.lower())
        asked = [(k, v) for k, v in headers.items() if k.lower() not in drop]

        async def barrier() -> None:
            with contextlib.suppress(LinkError, TimeoutError):
                async with asyncio.timeout(BARRIER_TIMEOUT_S):
                    await self._links[shard].request("GET", target, asked, b"")

        task = asyncio.create_task(barrier())
        self._barriers.add(task)
        task.add_done_callback(self._barriers.discard)

    async def add_node(self, request: web.Request) -> web.StreamResponse:
        """Add a node to every shard's group: to shard k by its Raft address of shard k (the
        given port + k), one shard after another."""
        body = await request.read()
        try:
            doc = orjson.loads(body)
            shard_address(doc["raft"], 0)
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, SchedError):
            return await self.forward(request, 0, body)  # shard 0 says what is wrong with it
        raft = doc["raft"]
        bodies = [orjson.dumps({**doc, "raft": shard_address(raft, k)}) for k in range(self.shards)]
        return await self._each_shard(request, bodies, _added_before)

    async def remove_node(self, request: web.Request) -> web.StreamResponse:
        """Remove a node from every shard's group (named by its id, or by its Raft address:
        in shard k, the given port + k)."""
        ref = request.match_info["node"]
        if ":" not in ref:  # a name: by its address in every shard, which outlives the name
            # in a shard that removed it already (a removal stopped half-way, asked again)
            ref = await self._address_of(request, ref) or ref
        try:
            refs = [shard_address(ref, k) for k in range(self.shards)] if ":" in ref else None
        except (ValueError, SchedError):
            refs = None
        targets = [
            str(request.rel_url.with_path(f"{PREFIX}/cluster/nodes/{refs[k] if refs else ref}"))
            for k in range(self.shards)
        ]
        return await self._each_shard(request, [b""] * self.shards, _removed_before, targets)

    async def _address_of(self, request: web.Request, node_id: str) -> str | None:
        """The (shard 0) Raft address of the member named ``node_id`` in the first shard that
        still has it (shard k's address is its port + k), or None."""
        for k in range(self.shards):
            try:
                status, _, raw = await self._links[k].request(
                    "GET", f"{PREFIX}/cluster/nodes", self._headers(request).items(), b""
                )
                nodes = orjson.loads(raw)["nodes"] if status == 200 else []
            except (LinkError, orjson.JSONDecodeError, KeyError, TypeError):
                continue
            for node in nodes:
                if isinstance(node, dict) and node.get("id") == node_id:
                    try:
                        host, port = split_hostport(str(node["raft"]))
                    except (KeyError, ValueError, SchedError):
                        continue
                    return join_hostport(host, port - k)
        return None

    async def _each_shard(
        self,
        request: web.Request,
        bodies: Sequence[bytes],
        done_before: Callable[[int, bytes], bool],
        targets: Sequence[str] | None = None,
    ) -> web.StreamResponse:
        """This membership change asked of each shard in turn (shard k with ``bodies[k]`` at
        ``targets[k]``): shard 0's answer once every shard made it (or had made it before: a
        change asked again after one that stopped half-way); else the first refusal, saying
        which shard refused and which had changed."""
        made: list[tuple[int, bytes]] = []
        for k in range(self.shards):
            target = str(request.rel_url) if targets is None else targets[k]
            try:
                status, _, raw = await self._ask(request, k, target, bodies[k])
            except LinkError as exc:
                return _unavailable(k, exc)
            if status >= 400 and not done_before(status, raw):
                return _refused_at(k, status, raw)
            if status < 400:
                made.append((status, raw))
        if not made:  # every shard had made it before: the membership as it is
            try:
                status, _, raw = await self._links[0].request(
                    "GET", f"{PREFIX}/cluster/nodes", self._headers(request).items(), b""
                )
            except LinkError as exc:
                return _unavailable(0, exc)
            made.append((status, raw))
        status, raw = made[0]
        return web.Response(status=status, body=raw, content_type="application/json")

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        try:
            sort = JobSort(request.query.get("sort", JobSort.CREATED))
        except ValueError:
            sort = JobSort.CREATED  # the shards refuse it, naming it
        order = request.query.get("order")
        desc = order == Direction.DESC if order in set(Direction) else sort.descending
        return await self._merged(request, "jobs", job_key(sort), desc)

    async def list_dlq(self, request: web.Request) -> web.StreamResponse:
        return await self._merged(request, "runs", _dlq_key, True)


def upstream_shard(doc: Any, batch: bool, shards: int) -> int | None:
    """The shard a submit goes to for its upstream jobs (a job lives in the shard of its
    upstreams; a batch is one shard), None when it names none.  Raises
    :class:`~schedd.errors.InvalidArgument` when its upstreams are in several shards, or one is
    named by its name (which only its own shard knows) rather than its id."""
    jobs = doc.get("jobs") if batch and isinstance(doc, dict) else [doc]
    if not isinstance(jobs, list):
        return None
    refs = {j["ref"] for j in jobs if isinstance(j, dict) and isinstance(j.get("ref"), str)}
    found: dict[int, str] = {}
    for i, job in enumerate(jobs):
        deps = job.get("depends_on") if isinstance(job, dict) else None
        if not isinstance(deps, list):
            continue
        for j, upstream in enumerate(deps):
            if not isinstance(upstream, str) or upstream in refs:
                continue  # the shard answers what is wrong with it; a ref is in this batch
            field = f"jobs[{i}].depends_on[{j}]" if batch else f"depends_on[{j}]"
            if not is_job_id(upstream.upper()):
                raise InvalidArgument(
                    f"{field}: expected an upstream job's id in a cluster of {shards} shards, "
                    f"got {upstream!r}: an upstream is named by its id (or by the ref of a job "
                    "of the same batch); its name is known to its own shard only",
                    field=field,
                )
            shard = shard_of_id(upstream, shards)
            if shard is not None:
                found.setdefault(shard, upstream)
    if len(found) > 1:
        (a, first), (b, second) = sorted(found.items())[:2]
        what = "the batch's jobs" if batch else "the job"
        raise InvalidArgument(
            f"depends_on: upstream jobs in shards {a} and {b} ({first}, {second}): a job lives "
            f"in the shard of its upstream jobs, so the upstreams of {what} must share one "
            "shard; submit the downstream work in a batch with its upstreams (refs), or "
            "split it",
            field="depends_on",
        )
    return next(iter(found), None)


def _submits(request: web.Request) -> bool:
    return request.method == "POST" and request.path in (
        f"{PREFIX}/jobs",
        f"{PREFIX}/jobs/batch",
    )


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None  # the shard answers the 400


def _namespaces(doc: Any, batch: bool) -> dict[str, int]:
    """How many jobs of each namespace a submit's body holds (as the shard will read it)."""
    jobs = doc.get("jobs") if batch and isinstance(doc, dict) else [doc]
    counts: dict[str, int] = {}
    for job in jobs if isinstance(jobs, list) else ():
        if isinstance(job, dict):
            ns = job.get("namespace") or "default"
            if isinstance(ns, str):
                counts[ns] = counts.get(ns, 0) + 1
    return counts


def _page_target(request: web.Request, cursor: str | None) -> str:
    """This listing's page from one shard: from its own ``cursor``, with each item's place."""
    query = {k: v for k, v in request.query.items() if k not in ("cursor", "min_index")}
    query["places"] = "1"
    if cursor is not None:
        query["cursor"] = cursor
    return str(request.rel_url.with_query(query))


def _streams(request: web.Request) -> bool:
    """Whether the answer to this request is a stream (the change feed, a snapshot)."""
    path = request.path
    return path.endswith(("/events", "/snapshot")) or "text/event-stream" in request.headers.get(
        "Accept", ""
    )


def _limit(request: web.Request) -> int:
    try:
        return max(1, int(request.query.get("limit", "100")))
    except ValueError:
        return 100


def shard_view(shard: int, view: dict[str, Any]) -> dict[str, Any]:
    """One shard's line of the cluster view, from its own view of its group."""
    return {
        "shard": shard,
        "role": view.get("role"),
        "leader": view.get("leader"),
        "leader_url": view.get("leader_url"),
        "term": view.get("term"),
        "commit_index": view.get("commit_index"),
        "applied_index": view.get("applied_index"),
        "state_index": view.get("state_index"),
        "lag": max(0, int(view.get("commit_index") or 0) - int(view.get("applied_index") or 0)),
    }


def merge_workers(shards: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The workers of every shard's list, each once (by id): its leases summed over shards,
    draining when any shard drains it, heard last when any shard heard it."""
    merged: dict[str, dict[str, Any]] = {}
    for views in shards:
        for view in views:
            seen = merged.get(view["worker_id"])
            if seen is None:
                merged[view["worker_id"]] = dict(view)
                continue
            seen["leases"] = int(seen.get("leases") or 0) + int(view.get("leases") or 0)
            seen["draining"] = bool(seen.get("draining")) or bool(view.get("draining"))
            seen["capacity"] = max(int(seen.get("capacity") or 0), int(view.get("capacity") or 0))
            for field in ("last_heard",):
                seen[field] = max(seen.get(field) or "", view.get(field) or "") or None
    return sorted(merged.values(), key=lambda w: str(w["worker_id"]))


def merge_metrics(texts: Sequence[str]) -> bytes:
    """One exposition of the shards' (shard k's is ``texts[k]``): each family once, with the
    samples of every shard labelled ``shard="k"``."""
    merged: dict[str, Metric] = {}
    for shard, text in enumerate(texts):
        for family in text_string_to_metric_families(text):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                labels = {**sample.labels, "shard": str(shard)}
                into.samples.append(sample._replace(labels=labels))

    class _Merged(Collector):
        def collect(self) -> Iterator[Metric]:
            return (family for family in merged.values() if family.samples)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return bytes(generate_latest(registry))


def _added_before(status: int, raw: bytes) -> bool:
    """Whether a shard refused to add a node because it is a member there already."""
    return status == 409 and b"is already a member of this cluster" in raw


def _removed_before(status: int, raw: bytes) -> bool:
    """Whether a shard refused to remove a node because it was removed there before."""
    return status == 404 and b"(it was removed before)" in raw


def _refused_at(shard: int, status: int, raw: bytes) -> web.Response:
    """A shard's refusal of a membership change, saying which shard refused."""
    try:
        doc = orjson.loads(raw)
        error = doc["error"]
        error["message"] = f"shard {shard}: {error['message']}" + (
            f" (shards 0 to {shard - 1} made the change: ask again once this is resolved, "
            "they are left as they are)"
            if shard
            else ""
        )
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return web.Response(status=status, body=raw, content_type="application/json")
    return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")


def _invalid(message: str, field: str) -> web.Response:
    return _error(InvalidArgument(message, field=field))


def _unavailable(shard: int, exc: BaseException) -> web.Response:
    where = "a shard" if shard < 0 else f"shard {shard}"
    log_event(
        log, "frontdoor.shard_unreachable", level=logging.WARNING, shard=shard, error=str(exc)
    )
    message = f"{where} of this node does not answer ({exc}); retry, or ask another node"
    return _error(Unavailable(message, retry_after=1))
