"""``AsyncClient``: the schedd API from asyncio code, with submits batched by themselves.

The servers are tried the way ``schedctl`` tries them (its ``--server`` parsing and the same
failover rules): a server that cannot be reached is passed over, one that answers 502/503/504
(no leader yet, a leader change) is asked again after its ``Retry-After`` or the next one is
tried, and the whole round goes on for ``retry_budget`` seconds before :class:`Unreachable`.
Every write carries an ``X-Request-Id`` that stays the same when it is sent again, and the
cluster applies a request id once: a write repeated after a timeout or a leader change neither
loses nor duplicates anything.

Batching: concurrent :meth:`AsyncClient.submit` calls are coalesced into ``POST /jobs/batch``
requests of at most ``batch_size`` jobs, like a Kafka producer: a batch goes when it is full,
when nothing is on the way to the server (the submits of one turn of the event loop together),
or ``linger`` seconds after its first job, and the jobs that queue up while a batch is on the
way go as soon as it is answered.  Each caller gets its own job, or its own error:
a job the server refuses (the error names its index in the batch) fails alone and the rest is
sent again; a caller that is cancelled leaves the others alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
import orjson

from schedd.client.errors import Unreachable, error_from_response
from schedd.client.jobs import job_body
from schedd.client.models import FINISHED_STATES, Job, Run
from schedd.client.servers import (
    DEFAULT_SERVER,
    job_path,
    parse_retry_after,
    parse_server,
    run_path,
)
from schedd.errors import InvalidArgument, ResourceExhausted, SchedError
from schedd.ids import new_request_id
from schedd.protocol.headers import INDEX_HEADER, MIN_INDEX_HEADER

API = "/api/v1"
RETRY_BUDGET = 10.0  # seconds a request keeps trying the servers
BATCH_SIZE = 500
LINGER = 0.005  # seconds a batch waits for more jobs after its first
_FAILOVER = frozenset({502, 503, 504})
_ITEM = re.compile(r"^jobs\[(\d+)\]\.?")


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    server: str

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


def servers_of(servers: str | Sequence[str] | None) -> list[str]:
    """The base URLs of ``servers``: one URL, comma-separated URLs or a list (``host:port``
    means ``http://host:port``); default ``http://127.0.0.1:7700``."""
    if servers is None:
        items = [DEFAULT_SERVER]
    elif isinstance(servers, str):
        items = [s for s in servers.split(",") if s.strip()]
    else:
        items = [s for s in servers if s.strip()]
    if not items:
        raise InvalidArgument(f"servers: expected a URL like {DEFAULT_SERVER}", field="servers")
    return [parse_server(item, "servers").url for item in items]


class AsyncClient:
    """A client of a schedd cluster; use it as ``async with AsyncClient(...) as client``.

    ``servers``: one URL or several (any node; writes reach the leader).  ``token``: a bearer
    token (role ``submit`` to submit, ``read`` to read).  ``cafile``/``ssl_context``: the CAs
    to trust for https.  ``batching``: coalesce concurrent submits (``batch_size``,
    ``linger`` seconds).  ``timeout``: per HTTP request; ``retry_budget``: how long a request
    keeps trying the servers through a leader change.
    """

    def __init__(
        self,
        servers: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        cafile: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        retry_budget: float = RETRY_BUDGET,
        batching: bool = True,
        batch_size: int = BATCH_SIZE,
        linger: float = LINGER,
    ) -> None:
        if cafile is not None and ssl_context is not None:
            raise InvalidArgument("give cafile or ssl_context, not both", field="cafile")
        if not 1 <= batch_size <= 10_000:
            raise InvalidArgument("batch_size: expected 1 to 10000", field="batch_size")
        if linger < 0:
            raise InvalidArgument("linger: expected seconds >= 0", field="linger")
        self.servers = servers_of(servers)
        self.token = token
        if cafile is not None:
            from schedd.net import ca_context

            ssl_context = ca_context(cafile)
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.timeout = timeout
        self.retry_budget = retry_budget
        self.batching = batching
        self._batcher = _Batcher(self, batch_size, linger)
        self._session: aiohttp.ClientSession | None = None
        self._preferred = 0
        self._leader_known = False  # writes go first to the leader among the servers
        #: the highest X-Schedd-Index any answer carried: every read asks for at least it
        #: (min_index), so this client sees its own writes whichever server answers
        self.index = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send what is waiting to be batched, wait for the batches in flight, close."""
        await self._batcher.drain()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the transport ---------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": "schedd-client"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=3.0),
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl),
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        request_id: str | None = None,
    ) -> Answer:
        """The first real answer (2xx) to a request, trying the servers; an error answer is
        raised as its exception (``schedd.client.errors``)."""
        headers = {"X-Request-Id": request_id or new_request_id()}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if method == "GET" and self.index:
            headers[MIN_INDEX_HEADER] = str(self.index)
        if method != "GET" and not self._leader_known and len(self.servers) > 1:
            await self._prefer_leader()
        deadline = time.monotonic() + self.retry_budget
        problems: dict[str, str] = {}
        delay = 0.05
        while True:
            n = len(self.servers)
            for k in range(n):
                i = (self._preferred + k) % n
                url = self.servers[i]
                try:
                    async with self._http().request(
                        method, url + path, params=list(query), data=body, headers=headers
                    ) as resp:
                        data = await resp.read()
                        status = resp.status
                        wait = parse_retry_after(resp.headers.get("Retry-After"))
                        self._saw(resp.headers.get(INDEX_HEADER))
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    problems[url] = _describe(exc, self.timeout)
                    self._leader_known = False  # a node is gone: perhaps the leader
                    continue
                if status < 400:
                    self._preferred = i
                    return Answer(status, data, url)
                if status in _FAILOVER:
                    problems[url] = f"answered {status}"
                    self._leader_known = False  # no leader there now: a leader change
                    continue
                error = error_from_response(status, data, url, wait)
                if status == 429 and wait is not None and time.monotonic() + wait < deadline:
                    await asyncio.sleep(wait)  # over the submit rate: the server says when
                    break
                raise error
            else:
                now = time.monotonic()
                if now + delay >= deadline:
                    where = ", ".join(f"{u} ({p})" for u, p in problems.items())
                    raise Unreachable(
                        f"no server answered within {self.retry_budget:g}s: {where}; the "
                        "cluster may have no leader or no quorum"
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _saw(self, index: str | None) -> None:
        if index is not None and index.isdigit():
            self.index = max(self.index, int(index))

    async def _prefer_leader(self) -> None:
        """Ask the cluster which node leads and try it first: a follower would forward each
        write to it, one more hop.  Best effort: without an answer the order stays."""
        self._leader_known = True
        try:
            view = (await self.request("GET", f"{API}/cluster")).json()
            leader = parse_server(str(view.get("leader_url") or "")).url
        except (SchedError, ValueError, AttributeError):
            return
        if leader in self.servers:
            self._preferred = self.servers.index(leader)

    async def _json(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Sequence[tuple[str, str]] = (),
    ) -> Any:
        data = None if body is None else orjson.dumps(body)
        return (await self.request(method, path, query=query, body=data)).json()

    # -- jobs -------------------------------------------------------------------------------

    async def submit(self, task: str, payload: Any = None, **options: Any) -> Job:
        """Submit a job; ``options`` are the API's job fields (``schedule``, ``priority``,
        ``retry``, ``name``, ``queue``, ``idempotency_key``, …) and the schedule shortcuts
        ``at``, ``in_``, ``every``, ``cron``, ``timezone``.  Batched with concurrent submits
        unless ``batching=False``."""
        body = job_body(task, payload, **options)
        if self.batching:
            return await self._batcher.submit(body)
        return Job.from_json(await self._json("POST", f"{API}/jobs", body))

    async def submit_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[Job]:
        """Submit job bodies at once, all or nothing (one ``POST /jobs/batch``)."""
        answer = await self._json("POST", f"{API}/jobs/batch", {"jobs": list(jobs)})
        return [Job.from_json(j) for j in answer["jobs"]]

    async def get(self, job_id: str) -> Job:
        return Job.from_json(await self._json("GET", job_path(job_id)))

    async def jobs(self, *, page_size: int = 100, **filters: str) -> AsyncIterator[Job]:
        """Every job matching ``filters`` (``namespace``, ``queue``, ``status``, ``task``,
        ``name``, ``id_prefix``, ``last_run``), page by page: the newest first, or as ``sort``
        (``created``, ``next_fire``, ``latest_run``) and ``order`` (``asc``, ``desc``) say."""
        async for item in self._pages(f"{API}/jobs", "jobs", page_size, filters):
            yield Job.from_json(item)

    async def runs(
        self, job_id: str, *, page_size: int = 100, **filters: str
    ) -> AsyncIterator[Run]:
        """A job's runs, newest first (``state``, ``since``)."""
        async for item in self._pages(job_path(job_id, "/runs"), "runs", page_size, filters):
            yield Run.from_json(item)

    async def dead_letters(self, *, page_size: int = 100, **filters: str) -> AsyncIterator[Run]:
        """The dead-letter queue, newest first (``namespace``, ``queue``, ``task``, ``since``)."""
        async for item in self._pages(f"{API}/dlq", "runs", page_size, filters):
            yield Run.from_json(item)

    async def _pages(
        self, path: str, key: str, page_size: int, filters: Mapping[str, str]
    ) -> AsyncIterator[Mapping[str, Any]]:
        query = [(k, str(v)) for k, v in filters.items() if v is not None]
        query.append(("limit", str(page_size)))
        cursor: str | None = None
        while True:
            page = await self._json(
                "GET", path, query=query + ([("cursor", cursor)] if cursor else [])
            )
            for item in page.get(key) or ():
                yield item
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def run(self, run_id: str) -> Run:
        return Run.from_json(await self._json("GET", run_path(run_id)))

    async def cancel(self, job_id: str) -> None:
        await self.request("DELETE", job_path(job_id))

    async def cancel_run(self, run_id: str) -> Run:
        return Run.from_json(await self._json("POST", run_path(run_id, "/cancel")))

    async def pause(self, job_id: str) -> Job:
        return await self.update(job_id, paused=True)

    async def resume(self, job_id: str) -> Job:
        return await self.update(job_id, paused=False)

    async def update(self, job_id: str, **fields: Any) -> Job:
        """Change a job: the API's ``PATCH`` fields (``schedule``, ``payload``, ``priority``,
        ``retry``, ``timeout``, ``paused``)."""
        return Job.from_json(await self._json("PATCH", job_path(job_id), fields))

    async def trigger(self, job_id: str, *, override: bool = False) -> Run:
        body = {"overlap": "override" if override else "respect"}
        return Run.from_json(await self._json("POST", job_path(job_id, "/trigger"), body))

    async def replay(self, run_id: str) -> Run:
        """Run a dead-lettered run again."""
        return Run.from_json(await self._json("POST", run_path(run_id, "/replay", under="dlq")))

    async def drop(self, run_id: str) -> None:
        """Remove a run from the dead-letter queue."""
        await self.request("DELETE", run_path(run_id, under="dlq"))

    async def explain(self, job_id: str | None = None, **query: Any) -> list[dict[str, Any]]:
        """The next fire times of a job, or of ``cron=``/``every=`` (``timezone``, ``count``,
        ``from_``)."""
        if "from_" in query:
            query["from"] = query.pop("from_")
        pairs = [(k, str(v)) for k, v in query.items() if v is not None]
        path = job_path(job_id, "/explain") if job_id is not None else f"{API}/explain"
        fires: list[dict[str, Any]] = (await self._json("GET", path, query=pairs))["fires"]
        return fires

    async def cluster(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._json("GET", f"{API}/cluster")
        return answer

    async def wait(self, ref: str, *, timeout: float | None = None) -> Run:
        """The run ``ref`` (a run id, or a job id: its latest run) once it has finished;
        ``TimeoutError`` when ``timeout`` seconds pass first.  Follows the cluster's event
        stream (``GET /events``) and reads the run again when it changes; where a server has
        no stream, polls with a backoff from 0.1 s to 2 s."""
        try:
            return await asyncio.wait_for(self._wait(ref), timeout)
        except TimeoutError:
            raise TimeoutError(f"{ref}: not finished after {timeout:g}s") from None

    async def _finished(self, ref: str) -> Run | None:
        run = await self.run(ref) if "@" in ref else (await self.get(ref)).latest_run
        return run if run is not None and run.finished else None

    async def _visible(self, ref: str) -> Run:
        """The run once a read shows it finished: a node sends an event once its own reads
        see it, and the read asks for the event's entry (min_index) on whichever node answers
        it; polls while a server does not know min_index."""
        delay = 0.01
        while (run := await self._finished(ref)) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        return run

    async def _wait(self, ref: str) -> Run:
        job_id = ref.rpartition("@")[0] if "@" in ref else ref
        last_id: str | None = None
        for _ in range(len(self.servers) * 3):  # a stream lost in a failover resumes elsewhere
            url = self.servers[self._preferred]
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                async with self._http().get(
                    f"{url}{API}/events",
                    params={"types": "run", "job_id": job_id},
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=3.0, sock_read=60.0),
                ) as resp:
                    if resp.status == 404:  # a server without the stream
                        break
                    if resp.status != 200:
                        raise error_from_response(resp.status, await resp.read(), url)
                    if (run := await self._finished(ref)) is not None:  # after the stream began
                        return run
                    async for event, event_id, data in _events(resp):
                        last_id = event_id or last_id
                        if event == "run" and _ends(data, ref):
                            self._saw(event_id)  # the read asks for the event's entry
                            return await self._visible(ref)
                        if event == "reset" and (run := await self._finished(ref)) is not None:
                            return run  # changes were missed: read it again
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass
            self._preferred = (self._preferred + 1) % len(self.servers)
        delay = 0.1
        while (run := await self._finished(ref)) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        return run


def _ends(data: Any, ref: str) -> bool:
    """Whether a ``run`` event's changes finish the run ``ref`` (or a run of the job ``ref``)."""
    return isinstance(data, list) and any(
        isinstance(c, dict)
        and (c.get("id") == ref or c.get("job_id") == ref)
        and c.get("state") in FINISHED_STATES
        for c in data
    )


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str | None, Any]]:
    """The (event type, id, data as JSON) of each server-sent event of ``resp``."""
    kind, event_id, data = "message", None, ""
    async for raw in resp.content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                try:
                    parsed = orjson.loads(data)
                except orjson.JSONDecodeError:
                    parsed = None
                yield kind, event_id, parsed
            kind, data = "message", ""
        elif line.startswith(":"):
            continue  # a comment: the server's keep-alive
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                kind = value
            elif name == "id":
                event_id = value
            elif name == "data":
                data = f"{data}\n{value}" if data else value


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return f"timed out after {timeout:g}s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    return str(exc) or type(exc).__name__


Pending = tuple[dict[str, Any], "asyncio.Future[Job]"]


class _Batcher:
    """Coalesces submits into ``POST /jobs/batch`` requests (see the module's docstring)."""

    def __init__(self, client: AsyncClient, size: int, linger: float) -> None:
        self.client = client
        self.size = size
        self.linger = linger
        self._pending: list[Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False  # a flush is due at the end of this turn of the loop
        self._inflight: set[asyncio.Task[None]] = set()

    def submit(self, body: dict[str, Any]) -> asyncio.Future[Job]:
        """Queue ``body``; it is sent when the batch is full, when nothing is on the way to the
        server (at the end of this turn of the loop, with whatever else came in it), or
        ``linger`` seconds after the batch's first job, whichever comes first."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Job] = loop.create_future()
        self._pending.append((body, fut))
        if len(self._pending) >= self.size:
            self.flush()
        elif not self._inflight and not self._soon:
            self._soon = True
            loop.call_soon(self.flush)
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self.flush)
        return fut

    def flush(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items = [(b, f) for b, f in self._pending if not f.done()]
        self._pending = []
        if items:
            task = asyncio.get_running_loop().create_task(self._send(items))
            self._inflight.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        """A batch is answered: what queued up meanwhile goes now, not after the linger."""
        self._inflight.discard(task)
        if self._pending and not self._inflight:
            self.flush()

    async def drain(self) -> None:
        self.flush()
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _send(self, items: list[Pending]) -> None:
        try:
            while items:
                items = [(b, f) for b, f in items if not f.done()]  # cancelled meanwhile
                if not items:
                    return
                body = orjson.dumps({"jobs": [b for b, _ in items]})
                try:
                    answer = await self.client.request("POST", f"{API}/jobs/batch", body=body)
                except SchedError as exc:
                    index = _item_of(exc)
                    if index is not None and index < len(items):
                        _fail(items[index][1], _for_item(exc))
                        del items[index]
                        continue  # the others again, as a new request
                    if isinstance(exc, ResourceExhausted) and exc.retry_after is None:
                        if len(items) > 1:  # larger than the namespace's burst: split it
                            half = len(items) // 2
                            await asyncio.gather(self._send(items[:half]), self._send(items[half:]))
                            return
                    for _, fut in items:
                        _fail(fut, exc)
                    return
                jobs = answer.json()["jobs"]
                for (_, fut), job in zip(items, jobs, strict=True):
                    if not fut.done():
                        fut.set_result(Job.from_json(job))
                return
        except BaseException as exc:
            for _, fut in items:
                _fail(fut, exc if isinstance(exc, Exception) else Unreachable(str(exc)))
            if not isinstance(exc, Exception):
                raise


def _item_of(exc: SchedError) -> int | None:
    match = _ITEM.match(exc.field or "") or _ITEM.match(exc.message or "")
    return int(match.group(1)) if match else None


def _for_item(exc: SchedError) -> SchedError:
    """The batch's error about one job, as that job's own (``jobs[3].payload`` → ``payload``)."""
    field = _ITEM.sub("", exc.field) if exc.field else None
    message = _ITEM.sub("", exc.message)
    out = type(exc)(message, field=field or None, retry_after=exc.retry_after)
    return out


def _fail(fut: asyncio.Future[Job], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        with contextlib.suppress(Exception):
            fut.exception()  # retrieved: a caller that went away does not log "never retrieved"
