"""decode never raises anything but ProtocolError, whatever arrives; valid messages round-trip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.protocol.messages import (
    MESSAGE_TYPES,
    Ack,
    Cancel,
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
    to_dict,
)

FIELDS = sorted(
    {
        "worker_id",
        "queues",
        "capacity",
        "resume",
        "version",
        "leases",
        "run_id",
        "fence",
        "result",
        "error",
        "retryable",
        "node_id",
        "heartbeat_interval",
        "lease_timeout",
        "leader",
        "job_id",
        "attempt",
        "task",
        "payload",
        "scheduled_at",
        "deadline",
        "idempotency_key",
        "accepted",
        "reason",
        "code",
        "message",
        "progress",
        "traceback",
    }
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
small_values = json_scalars | st.lists(json_scalars, max_size=3)
# objects that look like frames: a real or bogus type and a mix of real and bogus fields
frames = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(MESSAGE_TYPES)) | json_scalars},
    optional={name: small_values for name in FIELDS},
)


def _only_protocol_errors(data: Any) -> None:
    try:
        msg = decode(data)
    except ProtocolError as exc:
        assert exc.field and exc.message.startswith(exc.field)
    else:
        assert msg.TYPE in MESSAGE_TYPES
        assert decode(encode(msg)) == msg


@given(st.text())
def test_any_text(text: str) -> None:
    _only_protocol_errors(text)


@given(st.binary())
def test_any_bytes(data: bytes) -> None:
    _only_protocol_errors(data)


@given(json_values)
def test_any_json(value: Any) -> None:
    _only_protocol_errors(orjson.dumps(value).decode())


@given(frames)
def test_frame_shaped_objects(obj: dict[str, Any]) -> None:
    _only_protocol_errors(orjson.dumps(obj))


# -- valid messages round-trip -----------------------------------------------------------------

ids = st.text(min_size=1, max_size=12)
fences = st.integers(min_value=0, max_value=2**63 - 1)
zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
times = st.datetimes(datetime(1970, 1, 2), datetime(2200, 1, 1), timezones=zones).map(  # noqa: DTZ001 - hypothesis wants naive bounds
    lambda d: d.isoformat()
) | st.just("2026-11-25T02:00:00Z")
refs = st.builds(LeaseRef, ids, fences, json_values)
positive = st.floats(min_value=1e-3, max_value=1e6)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        Hello,
        ids,
        st.lists(ids, min_size=1, max_size=3).map(tuple),
        st.integers(1, 10_000),
        st.lists(refs, max_size=3).map(tuple),
        st.integers(1, 5),
    ),
    st.builds(Heartbeat, st.lists(refs, max_size=3).map(tuple)),
    st.builds(Complete, ids, fences, json_values, json_values),
    st.builds(Fail, ids, fences, st.text(), st.booleans(), st.none() | st.text(), json_values),
    st.just(Drain()),
    st.builds(Welcome, ids, positive, positive),
    st.builds(Redirect, st.none() | st.just("http://127.0.0.1:7710")),
    st.builds(
        Lease,
        ids,
        ids,
        st.integers(0, 100),
        fences,
        ids,
        json_values,
        times,
        st.none() | times,
        st.none() | st.text(),
    ),
    st.builds(Ack, ids, st.booleans(), st.none() | st.text()),
    st.builds(Cancel, ids, fences),
    st.builds(Error, st.text(), st.text()),
)


def _norm(value: Any) -> Any:
    """LeaseRef progress=None is omitted on the wire; JSON has no tuples."""
    return orjson.loads(orjson.dumps(value))


@settings(max_examples=300)
@given(messages)
def test_valid_messages_round_trip(msg: Message) -> None:
    back = decode(encode(msg))
    assert type(back) is type(msg)
    assert _norm(to_dict(back)) == _norm(to_dict(msg))


@given(messages, st.data())
def test_valid_messages_with_one_field_broken(msg: Message, data: st.DataObject) -> None:
    obj = to_dict(msg)
    name = data.draw(st.sampled_from(sorted(obj)))
    if data.draw(st.booleans()):
        del obj[name]
    else:
        obj[name] = data.draw(json_values)
    _only_protocol_errors(orjson.dumps(obj))
