"""The errors a :mod:`schedd.client` call raises: the API's error codes as the exceptions of
:mod:`schedd.errors` (``NotFound``, ``InvalidArgument`` with its ``field``, ``Conflict``,
``Unavailable``, ``RateLimited`` with ``retry_after``, …), plus :class:`Unreachable` when no
server answered."""

from __future__ import annotations

from typing import Any

import orjson

from schedd.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
    SchedError,
    Unauthenticated,
    Unavailable,
    from_code,
)

RateLimited = ResourceExhausted  # 429: over the namespace's submit rate; ``retry_after`` says when

__all__ = [
    "ApiError",
    "Conflict",
    "InvalidArgument",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "SchedError",
    "Unauthenticated",
    "Unavailable",
    "Unreachable",
    "error_from_response",
]


class ApiError(SchedError):
    """An answer that is not a schedd error (a proxy's page, a wrong URL)."""


class Unreachable(Unavailable):
    """No server could be reached, or each kept answering 502/503/504: the message names every
    server and what went wrong.  A write that may have been applied says so."""


def error_from_response(
    status: int, body: bytes, server: str, retry_after: float | None = None
) -> SchedError:
    """The exception for an error answer: the API's ``{"error": {"code", "message", "field"}}``
    mapped to its class (``retry_after`` kept), or :class:`ApiError` for anything else."""
    try:
        err: Any = orjson.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
        field = err.get("field")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        snippet = body[:200].decode("utf-8", "replace").strip()
        return ApiError(
            f"{server}: HTTP {status} that is not a schedd error"
            + (f": {snippet}" if snippet else "")
            + " (is this a schedd server and the right URL?)"
        )
    exc = from_code(code, message, None if field is None else str(field))
    exc.retry_after = retry_after
    return exc
