"""Properties of job validation: only our errors escape, and the replicated form round-trips."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedd.core.commands import spec_from_dict, spec_to_dict
from schedd.core.model import JobSpec, Priority, RetryPolicy, Schedule, ScheduleKind
from schedd.core.validate import (
    DEFAULTS,
    JOB_FIELDS,
    SCHEDULE_FIELDS,
    Defaults,
    parse_batch,
    parse_job,
)
from schedd.errors import InvalidArgument, PayloadTooLarge

NOW = 1_764_000_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any JSON value Python's json module could hand us (unbounded ints, NaN, Infinity included).
any_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

# JSON that survives an orjson round trip unchanged (what a valid payload looks like).
clean_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _opt(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


def _with(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=optional)


# ---- valid bodies: every value acceptable -----------------------------------------------------

v_duration = st.sampled_from(["90s", "5m", "1h30m", 1, 2.5, "1d", "2h", 3600, "1.5s"])
v_recurring = {
    "timezone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
    "jitter": st.sampled_from(["0s", "100ms", 0.5, None]),
    "misfire": st.sampled_from(["skip", "run_once", "run_all", None]),
    "catchup_window": v_duration,
    "overlap": st.sampled_from(["allow", "skip", "buffer_one", "cancel_other"]),
    "dst": st.none()
    | _opt(gap=st.sampled_from(["skip", "shift"]), repeat=st.sampled_from(["first", "both"])),
    "start_at": st.sampled_from(["2026-11-25T02:00:00Z", "2026-11-25T02:00:00+05:30", None]),
    "end_at": st.sampled_from(["2027-01-01T00:00:00Z", "2030-06-01T12:00:00-07:00", None]),
}
v_schedule = st.one_of(
    st.none(),
    st.fixed_dictionaries({"at": st.sampled_from(["2026-11-25T02:00:00Z", "2020-01-01T00:00Z"])}),
    st.fixed_dictionaries({"in": v_duration | st.just(0)}),
    _with({"every": v_duration}, v_recurring),
    _with(
        {
            "cron": st.sampled_from(
                ["0 2 * * *", "*/5 * * * * 30", "@daily", "0 9 * jan-mar mon-fri", "0 0 L * *"]
            )
        },
        v_recurring,
    ),
)
valid_bodies = _with(
    {"task": st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True)},
    {
        "name": st.text(min_size=1, max_size=20),
        "namespace": st.from_regex(r"[a-z0-9_-]{1,10}", fullmatch=True),
        "queue": st.from_regex(r"[a-z0-9_-]{1,10}", fullmatch=True),
        "payload": clean_json,
        "schedule": v_schedule,
        "priority": st.sampled_from(["high", "normal", "low", None]),
        "retry": st.none()
        | _opt(
            max_attempts=st.integers(1, 100),
            initial=st.sampled_from(["1s", 2, "500ms"]),
            max=st.sampled_from(["10m", "1h", 60]),
            multiplier=st.floats(1, 10) | st.integers(1, 10),
            jitter=st.booleans(),
        ),
        "timeout": v_duration,
        "heartbeat_timeout": st.sampled_from(["1s", "60s", 90, 1.5]),
        "depends_on": st.lists(st.text(min_size=1, max_size=8), max_size=5, unique=True),
        "idempotency_key": st.text(min_size=1, max_size=20),
    },
)

# ---- one value made wrong (or any JSON), anywhere in the body ---------------------------------

PATHS: list[tuple[str, ...]] = [
    *[(f,) for f in JOB_FIELDS],
    ("bogus",),
    *[("schedule", f) for f in SCHEDULE_FIELDS],
    ("schedule", "bogus"),
    ("schedule", "dst", "gap"),
    ("schedule", "dst", "repeat"),
    ("schedule", "dst", "bogus"),
    *[("retry", f) for f in ("max_attempts", "initial", "max", "multiplier", "jitter", "bogus")],
    ("depends_on", "0"),
]
TRICKY: list[Any] = [
    "",
    "x",
    "a b",
    "HIGH",
    "500ms",
    "0s",
    "-1s",
    "inf",
    "nan",
    "1e400",
    "1" * 70 + "s",
    1e306,
    -1,
    0,
    0.0001,
    True,
    False,
    2.5,
    101,
    2**70,
    float("nan"),
    float("inf"),
    "0 0 31 2 *",
    "R * * * *",
    "H * * * *",
    "@reboot",
    "* *",
    "61 * * * *",
    "Nope/Zone",
    "../x",
    "America",
    "localtime",
    "right/UTC",
    "a\x00b",
    "2026-11-25",
    "2026-11-25T02:00:00",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59-05:00",
    ["a", "a"],
    [""],
    [1],
    {"gap": "x"},
    {},
    [],
    None,
    "x" * 201,
]


def _mutate(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    node: Any = body
    for key in path[:-1]:
        if key == "0" or not isinstance(node.get(key), dict | list):
            node[key] = {} if path[-1] != "0" else []
        node = node[key]
    if isinstance(node, list):
        node.append(value)
    else:
        node[path[-1]] = value
    return body


bad_values = st.sampled_from(TRICKY) | any_json
mutated_bodies = st.builds(_mutate, valid_bodies, st.sampled_from(PATHS), bad_values)
plausible_bodies = valid_bodies | mutated_bodies

_FIELD_RE = re.compile(r"^[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*$")
_KNOWN = set(JOB_FIELDS) | set(SCHEDULE_FIELDS) | {"gap", "repeat"}


def _check(body: Any, defaults: Defaults = DEFAULTS) -> None:
    try:
        spec = parse_job(body, now_ms=NOW, defaults=defaults)
    except (InvalidArgument, PayloadTooLarge) as err:
        assert err.message
        if err.field is not None and all(
            part.split("[")[0] in _KNOWN | {"retry", "max_attempts", "initial", "max", "multiplier"}
            for part in err.field.split(".")
        ):
            assert _FIELD_RE.match(err.field), err.field
            assert err.message.startswith(err.field + ": ")
        return
    assert isinstance(spec, JobSpec)
    wire = orjson.loads(orjson.dumps(spec_to_dict(spec)))
    assert spec_from_dict(wire) == spec


@SETTINGS
@given(any_json)
def test_arbitrary_json_only_raises_our_errors(body: Any) -> None:
    _check(body)


@SETTINGS
@given(valid_bodies)
def test_valid_bodies_parse_and_round_trip(body: dict[str, Any]) -> None:
    spec = parse_job(body, now_ms=NOW)
    assert spec.task == body["task"]
    wire = orjson.loads(orjson.dumps(spec_to_dict(spec)))
    assert spec_from_dict(wire) == spec


@SETTINGS
@given(mutated_bodies)
def test_plausible_bodies_only_raise_our_errors(body: dict[str, Any]) -> None:
    _check(body)
    _check(body, Defaults(max_payload=8))


@SETTINGS
@given(st.lists(plausible_bodies, max_size=3) | any_json)
def test_batches_only_raise_our_errors(jobs: Any) -> None:
    try:
        specs = parse_batch({"jobs": jobs}, now_ms=NOW, max_jobs=2)
    except (InvalidArgument, PayloadTooLarge):
        return
    assert 1 <= len(specs) <= 2


maybe_ms = st.none() | st.integers(min_value=0, max_value=2**53)
specs: st.SearchStrategy[JobSpec] = st.builds(
    JobSpec,
    task=st.text(max_size=10),
    name=st.none() | st.text(max_size=10),
    namespace=st.sampled_from(["default", "a", "team-b"]),
    queue=st.sampled_from(["default", "q"]),
    payload=clean_json,
    schedule=st.builds(
        Schedule,
        kind=st.sampled_from(list(ScheduleKind)),
        at_ms=maybe_ms,
        in_ms=maybe_ms,
        every_ms=maybe_ms,
        cron=st.none() | st.text(max_size=12),
        timezone=st.sampled_from(["UTC", "Europe/Berlin", ""]),
    ),
    priority=st.sampled_from(list(Priority)),
    retry=st.builds(
        RetryPolicy,
        max_attempts=st.integers(1, 100),
        initial_ms=st.integers(1, 10**9),
        max_ms=st.integers(1, 10**9),
        multiplier=st.floats(1, 10),
        jitter=st.booleans(),
    ),
    timeout_ms=maybe_ms,
    heartbeat_timeout_ms=st.integers(1000, 10**9),
    depends_on=st.lists(st.text(max_size=6), max_size=4).map(tuple),
    idempotency_key=st.none() | st.text(max_size=10),
)


@SETTINGS
@given(specs)
def test_spec_dict_round_trip(spec: JobSpec) -> None:
    d = spec_to_dict(spec)
    assert spec_from_dict(d) == spec
    wire = orjson.loads(orjson.dumps(d))
    assert spec_from_dict(wire) == spec
    assert spec_to_dict(spec_from_dict(wire)) == wire  # and the encoding is canonical
