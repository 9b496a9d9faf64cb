"""What the API's handlers share: a write's request id and commit, the integer, cursor,
choice and time query parameters, and the defaults of a job's spec."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from enum import StrEnum
from typing import Any

from aiohttp import web

from schedd import clock
from schedd.api.operations import CURSOR, LIMIT, IntQuery
from schedd.api.ports import TOKEN, Raft
from schedd.config import Config
from schedd.core import commands
from schedd.core.durations import parse_time
from schedd.core.state import Ok, Rejected, Result
from schedd.core.validate import Defaults
from schedd.errors import InvalidArgument, Unavailable, from_code
from schedd.ids import new_request_id

WRITE_DEADLINE_S = 10.0

#: the position (the index, or with several shards the stamp) of the last entry the request
#: being handled committed (0: none); the answer carries it (``schedd.api.consistency``)
WRITTEN: ContextVar[int] = ContextVar("schedd_written", default=0)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def request_id(request: web.Request) -> str:
    """The client's ``X-Request-Id`` (scoped to its token and to this exact request), or a
    fresh one.

    Commands are deduplicated by request id, so a client that repeats a write after a lost reply
    (on this node or another) gets the first result instead of a second job.  The id covers the
    method, path and body too: the same id on a different request is a different request.
    """
    given = request.headers.get("X-Request-Id")
    if given is None:
        return new_request_id()
    if not 8 <= len(given) <= 128 or not given.isascii() or not given.isprintable():
        raise InvalidArgument(
            "X-Request-Id: expected 8 to 128 printable ASCII characters", field="X-Request-Id"
        )
    digest = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    digest.update(await request.read())
    return f"{request[TOKEN].name}:{given}:{digest.hexdigest()[:24]}"


async def commit(
    raft: Raft, make: Callable[[str, int], commands.Command], rid: str | None = None
) -> Result:
    """Commit a client command, retrying with the same request id across elections."""
    rid = rid or new_request_id()
    now = clock.wall_ms()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITE_DEADLINE_S
    delay = 0.05
    while True:
        try:
            committed = await raft.submit_indexed(
                make(rid, now), timeout=max(0.1, min(3.0, deadline - loop.time()))
            )
        except Unavailable:
            if loop.time() + delay >= deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            continue
        WRITTEN.set(max(WRITTEN.get(), committed.position))
        return committed.result


def unwrap(res: Result) -> Any:
    if isinstance(res, Rejected):
        raise from_code(res.code, res.message, res.field)
    assert isinstance(res, Ok)
    return res.value


def defaults(config: Config) -> Defaults:
    s = config.scheduler
    return Defaults(
        max_attempts=s.default_max_attempts,
        heartbeat_timeout_ms=s.heartbeat_timeout_ms,
        max_payload=s.max_payload,
    )


def int_param(request: web.Request, param: IntQuery) -> int:
    """The query parameter ``param`` (declared with its bounds in the operation table)."""
    name, lo, hi = param.name, param.lo, param.hi
    raw = request.query.get(name)
    if raw is None:
        assert param.default is not None
        return param.default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(
            f"{name}: expected an integer from {lo} to {hi}, got {raw!r}", field=name
        ) from None
    if not lo <= value <= hi:
        raise InvalidArgument(
            f"{name}: expected an integer from {lo} to {hi}, got {value}", field=name
        )
    return value


def page_of(request: web.Request, first: int) -> tuple[int, int]:
    """A listing's ``limit`` and ``cursor`` (a previous page's ``next_cursor``; ``first``
    without one), as the operation table declares them."""
    limit = int_param(request, LIMIT)
    raw = request.query.get("cursor")
    if raw is None:
        return limit, first
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) <= CURSOR.hi):
        raise InvalidArgument(
            f"cursor: expected the next_cursor of a previous page (digits), got {raw!r}",
            field="cursor",
        )
    return limit, int(raw)


def next_cursor(after: int | None) -> str | None:
    return None if after is None else str(after)


def choice(request: web.Request, name: str, allowed: type[StrEnum]) -> str | None:
    value = request.query.get(name)
    if value is not None and value not in set(allowed):
        raise InvalidArgument(
            f"{name}: expected one of {', '.join(allowed)}, got {value!r}", field=name
        )
    return value


FROM_BEFORE_MS = 7_258_118_400_000  # 2200-01-01T00:00:00Z


def from_param(request: web.Request) -> int | None:
    """``from``: explain the fire times after this instant instead of after now."""
    raw = request.query.get("from")
    if raw is None:
        return None
    ms = parse_time(raw, "from")
    if not 0 <= ms < FROM_BEFORE_MS:
        raise InvalidArgument(
            f"from: expected a time from 1970-01-01 to 2199-12-31, got {raw!r}", field="from"
        )
    return ms


def since_param(request: web.Request) -> int | None:
    raw = request.query.get("since")
    return None if raw is None else parse_time(raw, "since")
