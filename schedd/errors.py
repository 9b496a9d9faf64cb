"""The one exception root of schedd, and the error codes shared by API, CLI and core.

Each error carries a ``code`` (the wire string in ``{"error": {"code": ...}}``), a message that
says what was expected, and optionally the ``field`` it concerns.  The HTTP status for each code
lives in one table, :data:`HTTP_STATUS`.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    INVALID_ARGUMENT = "invalid_argument"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    STALE_FENCE = "stale_fence"
    WRONG_GROUP = "wrong_group"
    SLOT_MOVING = "slot_moving"
    INTERNAL = "internal"


HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400,
    Code.UNAUTHENTICATED: 401,
    Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404,
    Code.CONFLICT: 409,
    Code.STALE_FENCE: 409,
    Code.PAYLOAD_TOO_LARGE: 413,
    Code.WRONG_GROUP: 421,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.UNAVAILABLE: 503,
    Code.SLOT_MOVING: 503,
    Code.INTERNAL: 500,
}


class SchedError(Exception):
    """Something went wrong in schedd."""

    code: Code = Code.INTERNAL

    def __init__(
        self,
        message: str | None = None,
        *,
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.message = message or (self.__doc__ or "error").strip()
        self.field = field
        self.retry_after = retry_after
        super().__init__(self.message)

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": str(self.code), "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return {"error": body}


class InvalidArgument(SchedError):
    """The request is not valid."""

    code = Code.INVALID_ARGUMENT


class UnknownZone(InvalidArgument):
    """A time zone that is not an IANA zone; ``zone`` is what was given (the API suggests the
    zone it probably means: schedd.api.zones)."""

    def __init__(self, message: str, *, field: str, zone: str) -> None:
        super().__init__(message, field=field)
        self.zone = zone


class Unauthenticated(SchedError):
    """A valid bearer token is required: send 'Authorization: Bearer <token>'."""

    code = Code.UNAUTHENTICATED


class PermissionDenied(SchedError):
    """This token's role does not allow the operation."""

    code = Code.PERMISSION_DENIED


class NotFound(SchedError):
    """No such object."""

    code = Code.NOT_FOUND


class Conflict(SchedError):
    """The operation conflicts with the current state."""

    code = Code.CONFLICT


class StaleFence(SchedError):
    """The fence is older than the current lease: the result is refused."""

    code = Code.STALE_FENCE


class PayloadTooLarge(SchedError):
    """The request body is larger than the configured limit."""

    code = Code.PAYLOAD_TOO_LARGE


class ResourceExhausted(SchedError):
    """Over quota or overloaded; retry later."""

    code = Code.RESOURCE_EXHAUSTED


class Unavailable(SchedError):
    """The cluster has no quorum or no known leader yet; retry shortly."""

    code = Code.UNAVAILABLE


class ConfigError(SchedError):
    """The configuration is not valid."""

    code = Code.INVALID_ARGUMENT

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems) or "invalid configuration")


BY_CODE: dict[str, type[SchedError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        Conflict,
        StaleFence,
        PayloadTooLarge,
        ResourceExhausted,
        Unavailable,
    )
}


def from_code(code: str, message: str, field: str | None = None) -> SchedError:
    """Rebuild an error from its wire form (used for rejections coming out of ``apply``)."""
    cls = BY_CODE.get(code, SchedError)
    return cls(message, field=field)
