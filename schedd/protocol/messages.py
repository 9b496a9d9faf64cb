"""The worker wire protocol: one frozen dataclass per message, and a codec that never surprises.

Sans-IO and pure: no clock, no I/O, no asyncio, no logging.  Every frame is one JSON object
with a ``"type"``; :func:`encode` turns a message into that text and :func:`decode` turns text
(or bytes) back into a message.  :func:`decode` raises nothing but :class:`ProtocolError`, whose
message names the bad field and says what was expected.  Unknown fields are ignored so that
either side can grow new optional fields without breaking the other.

The fields of each message are described once, in :data:`_SPECS`; decoding and encoding are
both driven by that table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from schedd.core.durations import parse_time
from schedd.errors import InvalidArgument

PROTOCOL_VERSION = 1
MAX_CAPACITY = 10_000
MAX_TASKS = 10_000  # task names a worker may list in its hello
MAX_FRAME_BYTES = 1 << 20  # a frame's size is the transport's concern; this is the agreed bound
#: A progress value (``progress`` of a lease ref, a complete or a fail) is kept with the attempt
#: only up to this size, as canonical JSON (:func:`progress_json`): it is replicated with every
#: change and stored with the run.  A larger one is not sent by the SDK, and dropped by the
#: leader with a log line (the attempt keeps the value it had).
MAX_PROGRESS_BYTES = 4096
#: The ``traceback`` of a fail is kept as its tail (:func:`traceback_tail`): the last
#: ``TRACEBACK_LINES`` lines, at most ``TRACEBACK_BYTES`` bytes of UTF-8.
TRACEBACK_LINES = 20
TRACEBACK_BYTES = 4096


class ProtocolError(InvalidArgument):
    """The frame is not a valid worker-protocol message."""


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """A lease a worker holds, as listed in ``hello.resume`` and ``heartbeat.leases``."""

    run_id: str
    fence: int
    progress: Any = None


# -- worker → server ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    TYPE: ClassVar[str] = "hello"
    worker_id: str
    queues: tuple[str, ...]
    capacity: int
    resume: tuple[LeaseRef, ...] = ()
    version: int = PROTOCOL_VERSION
    #: the tasks this worker runs; the leader leases it runs of these tasks only.  None (a
    #: worker that does not say): any task
    tasks: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    TYPE: ClassVar[str] = "heartbeat"
    leases: tuple[LeaseRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Complete:
    TYPE: ClassVar[str] = "complete"
    run_id: str
    fence: int
    result: Any = None
    progress: Any = None  # the handler's last progress (None: none reported)


@dataclass(frozen=True, slots=True)
class Fail:
    TYPE: ClassVar[str] = "fail"
    run_id: str
    fence: int
    error: str
    retryable: bool = True
    traceback: str | None = None  # the tail of the exception's traceback (a handler that raised)
    progress: Any = None  # the handler's last progress (None: none reported)


@dataclass(frozen=True, slots=True)
class Capacity:
    """The most leases the worker holds from now on (0 to ``MAX_CAPACITY``), replacing its
    hello's ``capacity``: lowered, no new lease comes until it holds fewer; raised, more come.
    A node that serves a worker from several shards sends it to each shard's leader, sharing
    the worker's capacity between them."""

    TYPE: ClassVar[str] = "capacity"
    capacity: int


@dataclass(frozen=True, slots=True)
class Drain:
    """Both ways: a worker that stops says it (send it no new leases); the leader tells a
    worker an operator drained (finish the leases you hold, take no new ones)."""

    TYPE: ClassVar[str] = "drain"


# -- server → worker ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welcome:
    TYPE: ClassVar[str] = "welcome"
    node_id: str
    heartbeat_interval: float  # seconds
    lease_timeout: float  # seconds


@dataclass(frozen=True, slots=True)
class Redirect:
    TYPE: ClassVar[str] = "redirect"
    leader: str | None = None  # None: no leader known yet; back off and retry


@dataclass(frozen=True, slots=True)
class Lease:
    TYPE: ClassVar[str] = "lease"
    run_id: str
    job_id: str
    attempt: int
    fence: int
    task: str
    payload: Any
    scheduled_at: str
    deadline: str | None = None
    idempotency_key: str | None = None
    #: leased ahead of its due time: start the handler at this time (worker's clock), not before
    not_before: str | None = None
    #: heartbeat at least this often (seconds) while holding this lease: set when the job's
    #: heartbeat timeout is too short for the ``welcome.heartbeat_interval``
    heartbeat_interval: float | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    TYPE: ClassVar[str] = "ack"
    run_id: str
    accepted: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    TYPE: ClassVar[str] = "cancel"
    run_id: str
    fence: int


@dataclass(frozen=True, slots=True)
class Error:
    TYPE: ClassVar[str] = "error"
    code: str
    message: str


WorkerMessage = Hello | Heartbeat | Complete | Fail | Drain | Capacity
ServerMessage = Welcome | Redirect | Lease | Ack | Cancel | Drain | Error
Message = WorkerMessage | ServerMessage

# -- field checkers: (value, path) -> value, or raise ProtocolError ----------------------------

Check = Callable[[Any, str], Any]
_REQUIRED: Any = object()


def _bad(path: str, expected: str, value: Any) -> ProtocolError:
    got = "null" if value is None else type(value).__name__
    if isinstance(value, bool):
        got = "a boolean"
    elif isinstance(value, int | float):
        got = repr(value)
    return ProtocolError(f"{path}: expected {expected}, got {got}", field=path)


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise _bad(path, "a string", value)
    return value


def _id(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(path, "a non-empty string", value)
    return value


def _opt_str(value: Any, path: str) -> str | None:
    return None if value is None else _str(value, path)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(path, "true or false", value)
    return value


def _int_range(low: int, high: int | None, expected: str) -> Check:
    def check(value: Any, path: str) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            raise _bad(path, expected, value)
        return value

    return check


_fence = _int_range(0, None, "a non-negative integer")
_capacity = _int_range(1, MAX_CAPACITY, f"an integer from 1 to {MAX_CAPACITY}")
_version = _int_range(1, None, "a positive integer")
_room = _int_range(0, MAX_CAPACITY, f"an integer from 0 to {MAX_CAPACITY}")


def _seconds(value: Any, path: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _bad(path, "a positive number of seconds", value)
    return float(value)


def _json(value: Any, path: str) -> Any:
    return value  # already parsed JSON: anything goes


def _time(value: Any, path: str) -> str:
    expected = 'an RFC 3339 time with a zone offset like "2026-11-25T02:00:00Z"'
    if not isinstance(value, str):
        raise _bad(path, expected, value)
    try:
        parse_time(value, path)
    except (InvalidArgument, ValueError, OverflowError):
        raise ProtocolError(f"{path}: expected {expected}, got {value!r}", field=path) from None
    return value


def _opt_time(value: Any, path: str) -> str | None:
    return None if value is None else _time(value, path)


def _opt_seconds(value: Any, path: str) -> float | None:
    return None if value is None else _seconds(value, path)


def _url(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise _bad(path, 'an http(s) URL like "http://10.0.0.2:7700" or null', value)
    return value


def _queues(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _bad(path, "a non-empty list of queue names", value)
    return tuple(_id(q, f"{path}[{i}]") for i, q in enumerate(value))


def _tasks(value: Any, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_TASKS:
        raise _bad(path, f"a list of at most {MAX_TASKS} task names, or null", value)
    return tuple(_id(t, f"{path}[{i}]") for i, t in enumerate(value))


def _lease_refs(value: Any, path: str) -> tuple[LeaseRef, ...]:
    if not isinstance(value, list):
        raise _bad(path, "a list of {run_id, fence} objects", value)
    out = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "an object {run_id, fence}", item)
        out.append(_build(LeaseRef, _LEASE_REF, item, where + "."))
    return tuple(out)


# -- the table ---------------------------------------------------------------------------------

Spec = tuple[tuple[str, Check, Any], ...]  # (field, checker, default or _REQUIRED)

_LEASE_REF: Spec = (
    ("run_id", _id, _REQUIRED),
    ("fence", _fence, _REQUIRED),
    ("progress", _json, None),
)

_SPECS: dict[type[Any], Spec] = {
    Hello: (
        ("worker_id", _id, _REQUIRED),
        ("queues", _queues, _REQUIRED),
        ("capacity", _capacity, _REQUIRED),
        ("resume", _lease_refs, ()),
        ("version", _version, PROTOCOL_VERSION),
        ("tasks", _tasks, None),
    ),
    Heartbeat: (("leases", _lease_refs, ()),),
    Complete: (
        ("run_id", _id, _REQUIRED),
        ("fence", _fence, _REQUIRED),
        ("result", _json, None),
        ("progress", _json, None),
    ),
    Fail: (
        ("run_id", _id, _REQUIRED),
        ("fence", _fence, _REQUIRED),
        ("error", _str, _REQUIRED),
        ("retryable", _bool, True),
        ("traceback", _opt_str, None),
        ("progress", _json, None),
    ),
    Drain: (),
    Capacity: (("capacity", _room, _REQUIRED),),
    Welcome: (
        ("node_id", _id, _REQUIRED),
        ("heartbeat_interval", _seconds, _REQUIRED),
        ("lease_timeout", _seconds, _REQUIRED),
    ),
    Redirect: (("leader", _url, None),),
    Lease: (
        ("run_id", _id, _REQUIRED),
        ("job_id", _id, _REQUIRED),
        ("attempt", _fence, _REQUIRED),
        ("fence", _fence, _REQUIRED),
        ("task", _id, _REQUIRED),
        ("payload", _json, None),
        ("scheduled_at", _str, _REQUIRED),  # informational: any string
        ("deadline", _opt_time, None),
        ("idempotency_key", _opt_str, None),
        ("not_before", _opt_time, None),
        ("heartbeat_interval", _opt_seconds, None),
    ),
    Ack: (("run_id", _id, _REQUIRED), ("accepted", _bool, _REQUIRED), ("reason", _opt_str, None)),
    Cancel: (("run_id", _id, _REQUIRED), ("fence", _fence, _REQUIRED)),
    Error: (("code", _str, _REQUIRED), ("message", _str, _REQUIRED)),
}

_BY_TYPE: dict[str, type[Any]] = {cls.TYPE: cls for cls in _SPECS}
MESSAGE_TYPES = frozenset(_BY_TYPE)


def _build(cls: type[Any], spec: Spec, obj: dict[str, Any], prefix: str) -> Any:
    kwargs: dict[str, Any] = {}
    for name, check, default in spec:
        path = prefix + name
        if name not in obj:
            if default is _REQUIRED:
                raise ProtocolError(f"{path}: missing (required)", field=path)
            kwargs[name] = default
        else:
            kwargs[name] = check(obj[name], path)
    return cls(**kwargs)


def decode(text: str | bytes) -> Message:
    """Parse one frame.  Raises :class:`ProtocolError` (and nothing else) when it is not valid."""
    if not isinstance(text, str | bytes | bytearray | memoryview):
        raise ProtocolError(f"frame: expected JSON text, got {type(text).__name__}", field="frame")
    try:
        obj = orjson.loads(text)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise ProtocolError(
            f"frame: expected one JSON object, got invalid JSON ({exc})", field="frame"
        ) from None
    if not isinstance(obj, dict):
        raise _bad("frame", 'a JSON object with a "type"', obj)
    kind = obj.get("type")
    cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if cls is None:
        shown = (
            repr(kind)
            if isinstance(kind, str)
            else ("missing" if kind is None else type(kind).__name__)
        )
        raise ProtocolError(
            f"type: expected one of {', '.join(sorted(_BY_TYPE))}; got {shown}", field="type"
        )
    msg: Message = _build(cls, _SPECS[cls], obj, f"{kind}.")
    return msg


def progress_json(value: Any) -> bytes | None:
    """``value`` as canonical JSON (keys sorted, so equal values encode alike: what tells a
    changed progress from a repeated one), or None when it is not JSON."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def traceback_tail(text: str) -> str:
    """The end of a formatted traceback: its last ``TRACEBACK_LINES`` lines, at most
    ``TRACEBACK_BYTES`` bytes, after a line ``…`` when anything was cut (the innermost frames
    and the exception are at the end)."""
    lines = text.rstrip("\n").splitlines()
    cut = len(lines) > TRACEBACK_LINES
    tail = "\n".join(lines[-TRACEBACK_LINES:])
    budget = TRACEBACK_BYTES - len("…\n".encode())
    data = tail.encode("utf-8", "replace")
    if len(data) > budget:
        tail, cut = data[-budget:].decode("utf-8", "ignore"), True
    return "…\n" + tail if cut else tail


def _wire(value: Any) -> Any:
    if isinstance(value, LeaseRef):
        ref: dict[str, Any] = {"run_id": value.run_id, "fence": value.fence}
        if value.progress is not None:
            ref["progress"] = value.progress
        return ref
    if isinstance(value, tuple):
        return [_wire(v) for v in value]
    return value


def to_dict(msg: Message) -> dict[str, Any]:
    """The JSON object for ``msg`` (``"type"`` first)."""
    out: dict[str, Any] = {"type": msg.TYPE}
    for name, _check, _default in _SPECS[type(msg)]:
        out[name] = _wire(getattr(msg, name))
    return out


def encode(msg: Message) -> str:
    """The text frame for ``msg``.  Raises :class:`ProtocolError` if a value is not JSON."""
    try:
        return orjson.dumps(to_dict(msg)).decode()
    except (TypeError, KeyError) as exc:
        raise ProtocolError(f"{getattr(msg, 'TYPE', '?')}: cannot encode as JSON ({exc})") from None
