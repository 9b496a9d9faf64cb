"""The error answer a node's front door gives (its worker multiplexer too): a
:class:`~schedd.errors.SchedError`'s body and status, and ``Retry-After`` when it has one."""

from __future__ import annotations

from aiohttp import web

from schedd.errors import SchedError


def error_answer(err: SchedError) -> web.Response:
    headers = None if err.retry_after is None else {"Retry-After": str(round(err.retry_after))}
    return web.json_response(err.to_dict(), status=err.http_status, headers=headers)
