"""The worker wire protocol: every message round-trips, every bad frame names its field."""

from __future__ import annotations

import orjson
import pytest

from schedd.errors import Code, InvalidArgument
from schedd.protocol.messages import (
    MAX_PROGRESS_BYTES,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    TRACEBACK_BYTES,
    Ack,
    Cancel,
    Capacity,
    Complete,
    Drain,
    Error,
    Fail,
    Heartbeat,
    Hello,
    Lease,
    LeaseRef,
    Message,
    ProtocolError,
    Redirect,
    Welcome,
    decode,
    encode,
    progress_json,
    to_dict,
    traceback_tail,
)

T0 = "2026-11-25T02:00:00.000Z"

ROUND_TRIPS: list[Message] = [
    Hello("w1", ("default",), 8),
    Hello("w1", ("a", "b"), 10_000, (LeaseRef("j@1", 3), LeaseRef("j@2", 0, {"pct": 50})), 1),
    Heartbeat(()),
    Heartbeat((LeaseRef("j@1", 7, progress=[1, "two", None]),)),
    Complete("j@1", 7),
    Complete("j@1", 7, {"rows": 12, "nested": {"ok": True, "xs": [1.5, None, "ü"]}}),
    Complete("j@1", 0, "just a string"),
    Fail("j@1", 7, "ValueError: boom"),
    Fail("j@1", 7, "", retryable=False),
    Complete("j@1", 7, None, {"done": 3, "of": 10}),
    Fail("j@1", 7, "ValueError: boom", True, 'File "t.py", line 1, in f\nValueError: boom', 0.5),
    Drain(),
    Capacity(0),
    Capacity(10_000),
    Welcome("n1", 5.0, 60.0),
    Welcome("n1", 0.25, 1.5),
    Redirect("http://10.0.0.2:7700"),
    Redirect(None),
    Lease("j@1", "j", 1, 42, "reports.generate", {"report": "sales"}, T0, None, None),
    Lease("j@1", "j", 3, 42, "t", [1, 2], T0, "2026-11-25T02:30:00Z", "invoice-7"),
    Lease("j@1", "j", 1, 42, "t", None, T0),
    Ack("j@1", True),
    Ack("j@1", False, "stale fence: 41 < 42"),
    Cancel("j@1", 42),
    Error("invalid_argument", "hello.capacity: expected an integer from 1 to 10000, got 0"),
]


@pytest.mark.parametrize("msg", ROUND_TRIPS, ids=lambda m: type(m).__name__.lower())
def test_round_trip(msg: Message) -> None:
    text = encode(msg)
    assert isinstance(text, str)
    assert decode(text) == msg
    assert decode(text.encode()) == msg  # bytes too (binary frames)
    obj = orjson.loads(text)
    assert next(iter(obj)) == "type" and obj["type"] == msg.TYPE


def test_every_type_is_covered() -> None:
    assert {m.TYPE for m in ROUND_TRIPS} == MESSAGE_TYPES
    assert MESSAGE_TYPES == {
        "hello",
        "heartbeat",
        "complete",
        "fail",
        "drain",
        "capacity",
        "welcome",
        "redirect",
        "lease",
        "ack",
        "cancel",
        "error",
    }


# Frozen samples of the version-1 wire format: if one of these stops decoding to the same
# message, old workers or servers break.
V1_SAMPLES: list[tuple[str, Message]] = [
    (
        '{"type":"hello","worker_id":"w1","queues":["default"],"capacity":8,'
        '"resume":[{"run_id":"j@1","fence":3}],"version":1}',
        Hello("w1", ("default",), 8, (LeaseRef("j@1", 3),), 1),
    ),
    (
        '{"type":"hello","worker_id":"w1","queues":["q"],"capacity":1}',
        Hello("w1", ("q",), 1, (), PROTOCOL_VERSION),
    ),
    (
        '{"type":"heartbeat","leases":[{"run_id":"j@1","fence":3,"progress":0.5}]}',
        Heartbeat((LeaseRef("j@1", 3, 0.5),)),
    ),
    ('{"type":"complete","run_id":"j@1","fence":3}', Complete("j@1", 3, None)),
    ('{"type":"fail","run_id":"j@1","fence":3,"error":"boom"}', Fail("j@1", 3, "boom", True)),
    (
        '{"type":"fail","run_id":"j@1","fence":3,"error":"boom","traceback":"tb","progress":[1]}',
        Fail("j@1", 3, "boom", True, "tb", [1]),
    ),
    (
        '{"type":"complete","run_id":"j@1","fence":3,"result":1,"progress":{"n":2}}',
        Complete("j@1", 3, 1, {"n": 2}),
    ),
    ('{"type":"drain"}', Drain()),
    (
        '{"type":"welcome","node_id":"n1","heartbeat_interval":5,"lease_timeout":60}',
        Welcome("n1", 5.0, 60.0),
    ),
    ('{"type":"redirect","leader":"http://127.0.0.1:7710"}', Redirect("http://127.0.0.1:7710")),
    ('{"type":"redirect","leader":null}', Redirect(None)),
    ('{"type":"redirect"}', Redirect(None)),
    (
        '{"type":"lease","run_id":"j@1","job_id":"j","attempt":1,"fence":9,"task":"t",'
        '"payload":{"a":1},"scheduled_at":"2026-11-25T02:00:00.000Z","deadline":null,'
        '"idempotency_key":null}',
        Lease("j@1", "j", 1, 9, "t", {"a": 1}, T0, None, None),
    ),
    ('{"type":"ack","run_id":"j@1","accepted":true}', Ack("j@1", True, None)),
    ('{"type":"cancel","run_id":"j@1","fence":9}', Cancel("j@1", 9)),
    (
        '{"type":"error","code":"invalid_argument","message":"bad"}',
        Error("invalid_argument", "bad"),
    ),
    # unknown fields are ignored (forward compatibility)
    (
        '{"type":"ack","run_id":"j@1","accepted":false,"reason":"r","extra":{"x":1}}',
        Ack("j@1", False, "r"),
    ),
]


@pytest.mark.parametrize("text,expected", V1_SAMPLES, ids=lambda v: str(v)[:40])
def test_v1_samples(text: str, expected: Message) -> None:
    assert decode(text) == expected


def test_leaseref_progress_is_omitted_when_none() -> None:
    wire = to_dict(Heartbeat((LeaseRef("j@1", 3),)))
    assert wire == {"type": "heartbeat", "leases": [{"run_id": "j@1", "fence": 3}]}


HELLO = {"type": "hello", "worker_id": "w", "queues": ["q"], "capacity": 1}
LEASE = {
    "type": "lease",
    "run_id": "r",
    "job_id": "j",
    "attempt": 1,
    "fence": 1,
    "task": "t",
    "payload": None,
    "scheduled_at": T0,
}


def _with(base: dict[str, object], **changes: object) -> str:
    obj = {**base, **changes}
    return orjson.dumps({k: v for k, v in obj.items() if v is not _DROP}).decode()


_DROP = object()

# (frame, the field the error must name, a word the message must contain)
ERRORS: list[tuple[str | bytes, str, str]] = [
    ("", "frame", "JSON"),
    ("{", "frame", "JSON"),
    (b"\xff\xfe", "frame", "JSON"),
    ("NaN", "frame", "JSON"),
    ("[1, 2]", "frame", "object"),
    ('"hello"', "frame", "object"),
    ("null", "frame", "object"),
    ("{}", "type", "missing"),
    ('{"type": "nope"}', "type", "'nope'"),
    ('{"type": 7}', "type", "int"),
    (_with(HELLO, worker_id=_DROP), "hello.worker_id", "missing"),
    (_with(HELLO, worker_id=""), "hello.worker_id", "non-empty string"),
    (_with(HELLO, worker_id=5), "hello.worker_id", "string"),
    (_with(HELLO, queues=[]), "hello.queues", "non-empty list"),
    (_with(HELLO, queues="q"), "hello.queues", "list"),
    (_with(HELLO, queues=["a", 3]), "hello.queues[1]", "string"),
    (_with(HELLO, capacity=0), "hello.capacity", "1 to 10000"),
    (_with(HELLO, capacity=10_001), "hello.capacity", "1 to 10000"),
    (_with(HELLO, capacity=2.5), "hello.capacity", "integer"),
    (_with(HELLO, capacity=True), "hello.capacity", "boolean"),
    (_with(HELLO, capacity="8"), "hello.capacity", "integer"),
    ('{"type": "capacity", "capacity": -1}', "capacity.capacity", "0 to 10000"),
    ('{"type": "capacity", "capacity": 10001}', "capacity.capacity", "0 to 10000"),
    ('{"type": "capacity"}', "capacity.capacity", "missing"),
    (_with(HELLO, resume={}), "hello.resume", "list"),
    (_with(HELLO, resume=[1]), "hello.resume[0]", "object"),
    (_with(HELLO, resume=[{"run_id": "r"}]), "hello.resume[0].fence", "missing"),
    (
        _with(HELLO, resume=[{"run_id": "r", "fence": 1}, {"run_id": "r", "fence": -1}]),
        "hello.resume[1].fence",
        "non-negative",
    ),
    (_with(HELLO, version=0), "hello.version", "positive"),
    ('{"type": "heartbeat", "leases": [{"fence": 1}]}', "heartbeat.leases[0].run_id", "missing"),
    ('{"type": "heartbeat", "leases": null}', "heartbeat.leases", "list"),
    ('{"type": "complete", "fence": 1}', "complete.run_id", "missing"),
    ('{"type": "complete", "run_id": "r", "fence": -3}', "complete.fence", "non-negative"),
    ('{"type": "complete", "run_id": "r", "fence": "3"}', "complete.fence", "integer"),
    ('{"type": "complete", "run_id": "r", "fence": 1e30}', "complete.fence", "integer"),
    ('{"type": "fail", "run_id": "r", "fence": 1}', "fail.error", "missing"),
    ('{"type": "fail", "run_id": "r", "fence": 1, "error": 3}', "fail.error", "string"),
    (
        '{"type": "fail", "run_id": "r", "fence": 1, "error": "e", "traceback": 3}',
        "fail.traceback",
        "string",
    ),
    (
        '{"type": "fail", "run_id": "r", "fence": 1, "error": "e", "retryable": "yes"}',
        "fail.retryable",
        "true or false",
    ),
    (
        '{"type": "welcome", "node_id": "n", "heartbeat_interval": 0, "lease_timeout": 1}',
        "welcome.heartbeat_interval",
        "positive",
    ),
    (
        '{"type": "welcome", "node_id": "n", "heartbeat_interval": 1, "lease_timeout": "60s"}',
        "welcome.lease_timeout",
        "seconds",
    ),
    (
        '{"type": "welcome", "heartbeat_interval": 1, "lease_timeout": 1}',
        "welcome.node_id",
        "missing",
    ),
    ('{"type": "redirect", "leader": "10.0.0.2:7700"}', "redirect.leader", "URL"),
    ('{"type": "redirect", "leader": 3}', "redirect.leader", "URL"),
    (_with(LEASE, run_id=_DROP), "lease.run_id", "missing"),
    (_with(LEASE, job_id=None), "lease.job_id", "null"),
    (_with(LEASE, attempt=-1), "lease.attempt", "non-negative"),
    (_with(LEASE, fence=None), "lease.fence", "non-negative integer"),
    (_with(LEASE, task=""), "lease.task", "non-empty"),
    (_with(LEASE, scheduled_at=_DROP), "lease.scheduled_at", "missing"),
    (_with(LEASE, scheduled_at=5), "lease.scheduled_at", "string"),
    (_with(LEASE, deadline="tomorrow"), "lease.deadline", "RFC 3339"),
    (_with(LEASE, deadline="2026-11-25T02:00:00"), "lease.deadline", "zone offset"),
    (_with(LEASE, idempotency_key=5), "lease.idempotency_key", "string"),
    ('{"type": "ack", "run_id": "r"}', "ack.accepted", "missing"),
    ('{"type": "ack", "run_id": "r", "accepted": 1}', "ack.accepted", "true or false"),
    ('{"type": "ack", "run_id": "r", "accepted": true, "reason": []}', "ack.reason", "string"),
    ('{"type": "cancel", "run_id": "r"}', "cancel.fence", "missing"),
    ('{"type": "error", "code": "x"}', "error.message", "missing"),
]


@pytest.mark.parametrize("frame,field,word", ERRORS, ids=lambda v: str(v)[:50])
def test_bad_frames_name_the_field(frame: str | bytes, field: str, word: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    err = info.value
    assert err.field == field
    assert err.message.startswith(field + ":"), err.message
    assert word in err.message, err.message
    assert err.code is Code.INVALID_ARGUMENT
    assert isinstance(err, InvalidArgument)


def test_decode_rejects_non_text() -> None:
    with pytest.raises(ProtocolError, match="frame: expected JSON text"):
        decode(12)  # type: ignore[arg-type]


def test_encode_refuses_values_that_are_not_json() -> None:
    with pytest.raises(ProtocolError, match="complete: cannot encode"):
        encode(Complete("r", 1, {1, 2}))
    with pytest.raises(ProtocolError, match="complete: cannot encode"):
        encode(Complete("r", 1, 2**70))


def test_messages_are_frozen() -> None:
    msg = Ack("r", True)
    with pytest.raises(AttributeError):
        msg.accepted = False  # type: ignore[misc]


def test_a_traceback_is_kept_as_its_tail() -> None:
    short = 'Traceback (most recent call last):\n  File "t.py", line 3, in load\nKeyError: 1\n'
    assert traceback_tail(short) == short.rstrip("\n")  # whole, when it fits
    long = "\n".join(f"line {i}" for i in range(50))
    assert traceback_tail(long).splitlines() == ["…", *(f"line {i}" for i in range(30, 50))]
    wide = "\n".join("é" * 1000 for _ in range(10))  # 2 bytes a character
    tail = traceback_tail(wide)
    assert tail.startswith("…\n") and len(tail.encode()) <= TRACEBACK_BYTES
    assert wide.endswith(tail[2:])  # the end, not a character cut in half
    assert traceback_tail(tail) == tail  # the server's bound keeps what the SDK sent


def test_progress_json_tells_changed_values_from_repeated_ones() -> None:
    assert progress_json({"a": 1, "b": [2]}) == progress_json({"b": [2], "a": 1})
    assert progress_json(1) != progress_json(True) != progress_json(1.0)
    assert progress_json(object()) is None
    assert len(progress_json("x" * MAX_PROGRESS_BYTES) or b"") > MAX_PROGRESS_BYTES
