"""The API's middlewares: one error table (a ``SchedError`` becomes its status and JSON
body), the request metrics, and the bearer token or session of every request."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from schedd.api.common import Handler
from schedd.api.operations import PUBLIC_PATHS
from schedd.api.ports import (
    CONFIG,
    METRICS,
    SHARD,
    TOKEN,
    TOKENS,
    error_response,
    json_response,
)
from schedd.api.views import VIEW_SHARD
from schedd.api.zones import zone_like
from schedd.errors import InvalidArgument, NotFound, PayloadTooLarge, SchedError, UnknownZone

log = logging.getLogger(__name__)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except UnknownZone as err:  # say which zone was probably meant (read in a worker thread)
        meant = await asyncio.to_thread(zone_like, err.zone)
        if meant is not None:
            err.message += f"; did you mean {meant!r}?"
        return error_response(err)
    except SchedError as err:
        return error_response(err)
    except web.HTTPRequestEntityTooLarge:
        config = request.app[CONFIG]
        return error_response(
            PayloadTooLarge(
                f"request body over http.max_body ({config.http.max_body:,} bytes); a job's "
                f"payload may be at most scheduler.max_payload "
                f"({config.scheduler.max_payload:,} bytes)"
            )
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: NotFound, 405: InvalidArgument}.get(exc.status, InvalidArgument)
        message = f"{request.method} {request.path}: {exc.reason}"
        headers = None
        if exc.status == 404:
            message = f"no route for {request.method} {request.path}"
        elif isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            message = (
                f"{request.method} is not allowed on {request.path}; expected one of {allowed}"
            )
            headers = {"Allow": allowed}
        return json_response(code(message).to_dict(), exc.status, headers)
    except asyncio.CancelledError:
        raise
    except Exception:  # never a stack trace in a response
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_response({"error": {"code": "internal", "message": "internal error"}}, 500)


@web.middleware
async def shard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A cluster of several shards: the job and run views of the answer say this process's
    shard (the request's peer is ``ports.peer``: a clone of the request here cost 36-43 µs a
    request)."""
    VIEW_SHARD.set(request.app[SHARD])
    return await handler(request)


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    request.app[METRICS].api_latency.labels(name, request.method, str(response.status)).observe(
        time.perf_counter() - started
    )
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS:
        return await handler(request)
    if isinstance(request.match_info.http_exception, web.HTTPNotFound):
        # no such route: say so (a 401 would send the caller looking for a token); every path
        # there is is in the public API document anyway
        return await handler(request)
    token = request.app[TOKENS].authenticate(request.headers.get("Authorization"))
    request[TOKEN] = token
    return await handler(request)
