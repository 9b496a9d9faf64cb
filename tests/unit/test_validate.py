"""Job body validation: table-driven valid and invalid bodies, batches, the replicated form."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from schedd.core.commands import spec_from_dict, spec_to_dict
from schedd.core.model import JobSpec, Priority, RetryPolicy, Schedule, ScheduleKind
from schedd.core.validate import (
    Defaults,
    DstGap,
    DstRepeat,
    Misfire,
    Overlap,
    RecurringOptions,
    parse_batch,
    parse_dlq_bulk,
    parse_job,
    parse_job_and_options,
    parse_schedule,
)
from schedd.errors import Code, InvalidArgument, PayloadTooLarge, UnknownZone

NOW = 1_764_000_000_000  # 2025-11-24T16:00:00Z
T_2026 = 1_795_572_000_000  # 2026-11-25T02:00:00Z

CONTRACT_EXAMPLE: dict[str, Any] = {
    "task": "reports.generate",
    "name": "nightly-report",
    "namespace": "default",
    "queue": "default",
    "payload": {"report": "sales"},
    "schedule": {
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "jitter": "5m",
        "misfire": "run_once",
        "catchup_window": "1h",
        "overlap": "skip",
        "dst": {"gap": "shift", "repeat": "first"},
        "start_at": None,
        "end_at": None,
    },
    "priority": "high",
    "retry": {"max_attempts": 5, "initial": "1s", "max": "10m", "multiplier": 2, "jitter": True},
    "timeout": "30m",
    "heartbeat_timeout": "60s",
    "depends_on": ["<job id>"],
    "idempotency_key": "invoice-2026-11-25",
}


def t(**kw: Any) -> dict[str, Any]:
    """A body with a valid task plus ``kw``."""
    return {"task": "t", **kw}


# --------------------------------------------------------------------------------------------
# Valid bodies: (id, body, check on the spec)

Check = Callable[[JobSpec], bool]

VALID: list[tuple[str, Any, Check]] = [
    ("minimal", {"task": "t"}, lambda s: s == JobSpec(task="t")),
    ("task-chars", {"task": "a.B-c_d:9"}, lambda s: s.task == "a.B-c_d:9"),
    ("task-200", {"task": "x" * 200}, lambda s: len(s.task) == 200),
    ("name", t(name="nightly"), lambda s: s.name == "nightly"),
    ("name-null", t(name=None), lambda s: s.name is None),
    ("namespace", t(namespace="team-a_1"), lambda s: s.namespace == "team-a_1"),
    ("namespace-64", t(namespace="a" * 64), lambda s: s.namespace == "a" * 64),
    ("namespace-null", t(namespace=None), lambda s: s.namespace == "default"),
    ("queue", t(queue="gpu"), lambda s: s.queue == "gpu"),
    (
        "payload-object",
        t(payload={"a": [1, 2.5, None]}),
        lambda s: s.payload == {"a": [1, 2.5, None]},
    ),
    ("payload-string", t(payload="x"), lambda s: s.payload == "x"),
    ("payload-false", t(payload=False), lambda s: s.payload is False),
    ("payload-at-limit", t(payload="x" * 65534), lambda s: len(s.payload) == 65534),
    ("schedule-null", t(schedule=None), lambda s: s.schedule == Schedule()),
    (
        "at",
        t(schedule={"at": "2026-11-25T02:00:00Z"}),
        lambda s: s.schedule == Schedule(kind=ScheduleKind.AT, at_ms=T_2026),
    ),
    (
        "at-offset",
        t(schedule={"at": "2026-11-25T03:00:00+01:00"}),
        lambda s: s.schedule.at_ms == T_2026,
    ),
    (
        "in-string",
        t(schedule={"in": "1h30m"}),
        lambda s: (
            s.schedule == Schedule(kind=ScheduleKind.IN, in_ms=5_400_000, at_ms=NOW + 5_400_000)
        ),
    ),
    ("in-number", t(schedule={"in": 1.5}), lambda s: s.schedule.in_ms == 1500),
    ("in-zero", t(schedule={"in": 0}), lambda s: s.schedule.at_ms == NOW),
    (
        "in-other-kinds-null",
        t(schedule={"in": "5s", "cron": None, "jitter": None}),
        lambda s: s.schedule.kind is ScheduleKind.IN,
    ),
    (
        "every",
        t(schedule={"every": "5m"}),
        lambda s: (
            replace(s.schedule, options=None) == Schedule(kind=ScheduleKind.EVERY, every_ms=300_000)
        ),
    ),
    ("every-1s", t(schedule={"every": 1}), lambda s: s.schedule.every_ms == 1000),
    (
        "cron",
        t(schedule={"cron": "0 2 * * *"}),
        lambda s: (
            replace(s.schedule, options=None) == Schedule(kind=ScheduleKind.CRON, cron="0 2 * * *")
        ),
    ),
    (
        "cron-spaces-normalised",
        t(schedule={"cron": "  0  2 *\t* * "}),
        lambda s: s.schedule.cron == "0 2 * * *",
    ),
    ("cron-seconds", t(schedule={"cron": "*/5 * * * * 30"}), lambda s: s.schedule.cron is not None),
    ("cron-names", t(schedule={"cron": "0 9 * jan-mar mon-fri"}), lambda s: True),
    ("cron-alias", t(schedule={"cron": "@Daily"}), lambda s: s.schedule.cron == "@daily"),
    ("cron-last-day", t(schedule={"cron": "0 0 L * *"}), lambda s: True),
    ("cron-feb-29", t(schedule={"cron": "0 0 29 2 *"}), lambda s: True),
    # both day fields restricted, the day of week with # or L: either matches
    ("cron-dom-or-nth-weekday", t(schedule={"cron": "0 0 15 * 5#2"}), lambda s: True),
    ("cron-dom-or-last-weekday", t(schedule={"cron": "0 0 13 * L5"}), lambda s: True),
    (
        "cron-timezone",
        t(schedule={"cron": "0 2 * * *", "timezone": "America/New_York"}),
        lambda s: s.schedule.timezone == "America/New_York",
    ),
    ("priority-high", t(priority="high"), lambda s: s.priority is Priority.HIGH),
    ("priority-low", t(priority="low"), lambda s: s.priority is Priority.LOW),
    ("retry-null", t(retry=None), lambda s: s.retry == RetryPolicy()),
    ("retry-empty", t(retry={}), lambda s: s.retry == RetryPolicy()),
    (
        "retry-full",
        t(
            retry={
                "max_attempts": 5,
                "initial": "2s",
                "max": "1h",
                "multiplier": 1.5,
                "jitter": False,
            }
        ),
        lambda s: s.retry == RetryPolicy(5, 2000, 3_600_000, 1.5, False),
    ),
    ("retry-1", t(retry={"max_attempts": 1}), lambda s: s.retry.max_attempts == 1),
    ("retry-100", t(retry={"max_attempts": 100}), lambda s: s.retry.max_attempts == 100),
    ("retry-integral-float", t(retry={"max_attempts": 4.0}), lambda s: s.retry.max_attempts == 4),
    ("multiplier-int", t(retry={"multiplier": 3}), lambda s: s.retry.multiplier == 3.0),
    ("retry-max-equals-initial", t(retry={"initial": "5s", "max": 5}), lambda s: True),
    ("timeout", t(timeout="30m"), lambda s: s.timeout_ms == 1_800_000),
    ("timeout-number", t(timeout=0.5), lambda s: s.timeout_ms == 500),
    ("timeout-null", t(timeout=None), lambda s: s.timeout_ms is None),
    ("heartbeat", t(heartbeat_timeout="90s"), lambda s: s.heartbeat_timeout_ms == 90_000),
    ("heartbeat-1s", t(heartbeat_timeout=1), lambda s: s.heartbeat_timeout_ms == 1000),
    ("depends-on", t(depends_on=["a", "b"]), lambda s: s.depends_on == ("a", "b")),
    ("depends-on-empty", t(depends_on=[]), lambda s: s.depends_on == ()),
    (
        "depends-on-100",
        t(depends_on=[str(i) for i in range(100)]),
        lambda s: len(s.depends_on) == 100,
    ),
    ("idempotency-key", t(idempotency_key="k-1"), lambda s: s.idempotency_key == "k-1"),
    # the exact limits are inside
    ("name-200", t(name="n" * 200), lambda s: s.name == "n" * 200),
    (
        "cron-200-chars",
        t(schedule={"cron": "0 2 * * *" + " " * 191}),
        lambda s: s.schedule.cron == "0 2 * * *",
    ),
    ("timeout-1ms", t(timeout="1ms"), lambda s: s.timeout_ms == 1),
    ("timeout-64-chars", t(timeout="0" * 62 + "1s"), lambda s: s.timeout_ms == 1000),
    ("retry-initial-1ms", t(retry={"initial": "1ms"}), lambda s: s.retry.initial_ms == 1),
    ("multiplier-1", t(retry={"multiplier": 1}), lambda s: s.retry.multiplier == 1.0),
    ("multiplier-10", t(retry={"multiplier": 10}), lambda s: s.retry.multiplier == 10.0),
    ("at-epoch", t(schedule={"at": "1970-01-01T00:00:00Z"}), lambda s: s.schedule.at_ms == 0),
    (
        "at-last-ms",
        t(schedule={"at": "9999-12-31T23:59:59.999Z"}),
        lambda s: s.schedule.at_ms == 253_402_300_799_999,
    ),
    (
        "jitter-zero",
        t(schedule={"every": "1m", "jitter": 0}),
        lambda s: s.schedule.options is not None and s.schedule.options.jitter_ms == 0,
    ),
    (
        "dst-gap-only",
        t(schedule={"cron": "0 2 * * *", "dst": {"gap": "skip"}}),
        lambda s: (
            s.schedule.options is not None
            and (s.schedule.options.dst_gap, s.schedule.options.dst_repeat)
            == (DstGap.SKIP, DstRepeat.FIRST)
        ),
    ),
    (
        "contract-example",
        CONTRACT_EXAMPLE,
        lambda s: (
            replace(s, schedule=replace(s.schedule, options=None))
            == JobSpec(
                task="reports.generate",
                name="nightly-report",
                payload={"report": "sales"},
                schedule=Schedule(
                    kind=ScheduleKind.CRON, cron="0 2 * * *", timezone="Europe/Berlin"
                ),
                priority=Priority.HIGH,
                retry=RetryPolicy(5, 1000, 600_000, 2.0, True),
                timeout_ms=1_800_000,
                heartbeat_timeout_ms=60_000,
                depends_on=("<job id>",),
                idempotency_key="invoice-2026-11-25",
            )
        ),
    ),
]


@pytest.mark.parametrize(("body", "check"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_valid(body: Any, check: Check) -> None:
    spec = parse_job(body, now_ms=NOW)
    assert check(spec), spec
    assert spec_from_dict(orjson.loads(orjson.dumps(spec_to_dict(spec)))) == spec


# --------------------------------------------------------------------------------------------
# Invalid bodies: (body, field, words the message must contain)

INVALID: list[tuple[Any, str | None, str]] = [
    # the body
    ([], None, "expected a JSON object"),
    ("task", None, "expected a JSON object"),
    (None, None, "expected a JSON object"),
    ({"task": "t", "taks": 1}, "taks", "expected one of: task, name"),
    ({"task": "t", "cron": "* * * * *"}, "cron", "unknown field 'cron'"),
    # task
    ({}, "task", "expected a task name"),
    ({"task": None}, "task", "required"),
    ({"task": ""}, "task", "expected a task name of 1 to 200"),
    ({"task": "x" * 201}, "task", "expected a task name of 1 to 200"),
    ({"task": "has space"}, "task", "letters, digits"),
    ({"task": "sl/ash"}, "task", "letters, digits"),
    ({"task": 5}, "task", "got 5"),
    ({"task": ["t"]}, "task", "got array"),
    ({"task": 2**70}, "task", "got an integer beyond 64 bits"),
    # name, namespace, queue
    (t(name=""), "name", "expected a non-empty string of at most 200"),
    (t(name="n" * 201), "name", "at most 200"),
    (t(name=3), "name", "got 3"),
    (t(namespace="Default"), "namespace", "lowercase letters, digits"),
    (t(namespace=""), "namespace", "1 to 64 characters"),
    (t(namespace="a" * 65), "namespace", "1 to 64 characters"),
    (t(namespace="a.b"), "namespace", "lowercase letters"),
    (t(namespace="a\n"), "namespace", "lowercase letters"),
    (t(queue="q q"), "queue", "1 to 64 characters"),
    (t(queue=1), "queue", "got 1"),
    # payload
    (t(payload=float("nan")), "payload", "finite numbers"),
    (t(payload={"a": [1, float("inf")]}), "payload", "finite numbers"),
    (t(payload=2**70), "payload", "expected a JSON value"),
    (t(payload={1: "x"}), "payload", "expected a JSON value"),
    # schedule: shape
    (t(schedule="now"), "schedule", "expected an object"),
    (t(schedule=[]), "schedule", "expected an object"),
    (t(schedule={}), "schedule", "expected exactly one of at, in, every, cron"),
    (t(schedule={"at": None}), "schedule", "got none"),
    (t(schedule={"at": "2026-11-25T02:00:00Z", "in": "5s"}), "schedule", "got at and in"),
    (t(schedule={"every": "5m", "cron": "* * * * *"}), "schedule", "exactly one of"),
    (t(schedule={"cron": "* * * * *", "tz": "UTC"}), "schedule.tz", "expected one of: at, in"),
    (
        t(schedule={"at": "2026-11-25T02:00:00Z", "jitter": "5s"}),
        "schedule.jitter",
        "every or cron",
    ),
    (t(schedule={"in": "5s", "timezone": "UTC"}), "schedule.timezone", "every or cron"),
    # schedule: at / in / every
    (t(schedule={"at": "2026-11-25 02:00:00"}), "schedule.at", "expected an RFC 3339 time"),
    (t(schedule={"at": "2026-11-25T02:00:00"}), "schedule.at", "RFC 3339"),
    (t(schedule={"at": 1764000000}), "schedule.at", "RFC 3339"),
    (t(schedule={"at": "1969-12-31T23:59:59Z"}), "schedule.at", "between 1970"),
    (t(schedule={"at": "9999-12-31T23:59:59-05:00"}), "schedule.at", "9999-12-31"),
    (t(schedule={"in": "soon"}), "schedule.in", 'expected a duration like "90s"'),
    (t(schedule={"in": -1}), "schedule.in", "expected a positive duration"),
    (t(schedule={"in": True}), "schedule.in", "boolean"),
    (t(schedule={"in": 1e306}), "schedule.in", "up to 100 years"),
    (t(schedule={"in": "inf"}), "schedule.in", "expected a duration"),
    (t(schedule={"in": "1" * 65 + "s"}), "schedule.in", "expected a duration"),
    (t(schedule={"in": "101y"}), "schedule.in", "expected a duration"),
    (t(schedule={"every": "500ms"}), "schedule.every", "at least 1s"),
    (t(schedule={"every": 0}), "schedule.every", "positive duration"),
    (t(schedule={"every": "x"}), "schedule.every", "expected a duration"),
    # schedule: cron
    (t(schedule={"cron": "* * * *"}), "schedule.cron", "expected a cron expression of 5 fields"),
    (t(schedule={"cron": "* * * * * * 2020"}), "schedule.cron", "5 fields"),
    (t(schedule={"cron": "60 * * * *"}), "schedule.cron", "minute field '60' is out of range"),
    (t(schedule={"cron": "*/0 * * * *"}), "schedule.cron", "step '0': expected a whole number"),
    (t(schedule={"cron": "bad cron expression x y"}), "schedule.cron", "5 fields"),
    (t(schedule={"cron": "0 0 31 2 *"}), "schedule.cron", "matches at least one date"),
    (t(schedule={"cron": "R * * * *"}), "schedule.cron", "random (R) or hashed (H)"),
    (t(schedule={"cron": "H * * * *"}), "schedule.cron", "random (R) or hashed (H)"),
    (t(schedule={"cron": "@reboot"}), "schedule.cron", "@daily"),
    (t(schedule={"cron": 5}), "schedule.cron", "got 5"),
    (t(schedule={"cron": ""}), "schedule.cron", "5 fields"),
    (t(schedule={"cron": "   "}), "schedule.cron", "5 fields"),
    # schedule: recurring options
    (t(schedule={"cron": "0 2 * * *", "timezone": "Mars/Olympus"}), "schedule.timezone", "IANA"),
    (t(schedule={"cron": "0 2 * * *", "timezone": "europe/berlin"}), "schedule.timezone", "IANA"),
    (t(schedule={"cron": "0 2 * * *", "timezone": "America"}), "schedule.timezone", "IANA"),
    (t(schedule={"cron": "0 2 * * *", "timezone": "../etc/passwd"}), "schedule.timezone", "IANA"),
    (t(schedule={"cron": "0 2 * * *", "timezone": "localtime"}), "schedule.timezone", "IANA"),
    (t(schedule={"cron": "0 2 * * *", "timezone": "right/UTC"}), "schedule.timezone", "IANA"),
    (t(schedule={"cron": "0 2 * * *", "timezone": 1}), "schedule.timezone", "IANA"),
    (t(schedule={"every": "1m", "jitter": "x"}), "schedule.jitter", "expected a duration"),
    (t(schedule={"every": "1m", "jitter": "1m"}), "schedule.jitter", "shorter than the interval"),
    (
        t(schedule={"cron": "0 2 * * *", "misfire": "later"}),
        "schedule.misfire",
        "skip | run_once | run_all",
    ),
    (t(schedule={"cron": "0 2 * * *", "misfire": 1}), "schedule.misfire", "one of"),
    (
        t(schedule={"cron": "0 2 * * *", "overlap": "queue"}),
        "schedule.overlap",
        "allow | skip | buffer_one | cancel_other",
    ),
    (
        t(schedule={"cron": "0 2 * * *", "catchup_window": "-1h"}),
        "schedule.catchup_window",
        "duration",
    ),
    (t(schedule={"cron": "0 2 * * *", "dst": "shift"}), "schedule.dst", "expected an object"),
    (t(schedule={"cron": "0 2 * * *", "dst": {"gap": "run"}}), "schedule.dst.gap", "skip | shift"),
    (
        t(schedule={"cron": "0 2 * * *", "dst": {"repeat": "last"}}),
        "schedule.dst.repeat",
        "first | both",
    ),
    (t(schedule={"cron": "0 2 * * *", "dst": {"fold": 1}}), "schedule.dst.fold", "gap, repeat"),
    (t(schedule={"cron": "0 2 * * *", "start_at": "tomorrow"}), "schedule.start_at", "RFC 3339"),
    (t(schedule={"every": "1h", "end_at": 5}), "schedule.end_at", "RFC 3339"),
    (
        t(
            schedule={
                "every": "1h",
                "start_at": "2026-11-25T02:00:00Z",
                "end_at": "2026-11-25T02:00:00Z",
            }
        ),
        "schedule.end_at",
        "a time after schedule.start_at (2026-11-25T02:00:00.000Z)",
    ),
    # priority
    (t(priority="urgent"), "priority", "high | normal | low"),
    (t(priority="HIGH"), "priority", "high | normal | low"),
    (t(priority=1), "priority", "one of"),
    # retry
    (t(retry=3), "retry", "expected an object"),
    (t(retry={"attempts": 3}), "retry.attempts", "max_attempts, initial, max, multiplier, jitter"),
    (
        t(retry={"max_attempts": True}),
        "retry.max_attempts",
        "an integer from 1 to 100, got boolean",
    ),
    (t(retry={"max_attempts": 0}), "retry.max_attempts", "an integer from 1 to 100"),
    (t(retry={"max_attempts": 101}), "retry.max_attempts", "an integer from 1 to 100"),
    (t(retry={"max_attempts": 2.5}), "retry.max_attempts", "an integer"),
    (t(retry={"max_attempts": "3"}), "retry.max_attempts", "an integer"),
    (t(retry={"initial": "0s"}), "retry.initial", "positive duration"),
    (t(retry={"max": "x"}), "retry.max", "expected a duration"),
    (t(retry={"initial": "1m", "max": "30s"}), "retry.max", "at least retry.initial (1m)"),
    (t(retry={"max": "500ms"}), "retry.max", "at least retry.initial (1s)"),
    (t(retry={"multiplier": 0.5}), "retry.multiplier", "a number from 1 to 10"),
    (t(retry={"multiplier": 11}), "retry.multiplier", "a number from 1 to 10"),
    (t(retry={"multiplier": True}), "retry.multiplier", "got boolean"),
    (t(retry={"multiplier": float("nan")}), "retry.multiplier", "a number from 1 to 10"),
    (t(retry={"jitter": 1}), "retry.jitter", "true or false"),
    (t(retry={"jitter": "yes"}), "retry.jitter", "true or false"),
    # timeouts
    (t(timeout="forever"), "timeout", "expected a duration"),
    (t(timeout=0), "timeout", "positive duration"),
    (t(timeout=True), "timeout", "boolean"),
    (t(heartbeat_timeout="500ms"), "heartbeat_timeout", "at least 1s"),
    (t(heartbeat_timeout=[]), "heartbeat_timeout", "expected a duration"),
    # depends_on
    (t(depends_on="a"), "depends_on", "a list of at most 100 job ids"),
    (t(depends_on={"a": 1}), "depends_on", "a list of at most 100 job ids"),
    (t(depends_on=[str(i) for i in range(101)]), "depends_on", "at most 100"),
    (t(depends_on=["a", "b", ""]), "depends_on[2]", "non-empty string"),
    (t(depends_on=["a", 7]), "depends_on[1]", "non-empty string"),
    (t(depends_on=["a", None]), "depends_on[1]", "non-empty string"),
    (t(depends_on=["x" * 201]), "depends_on[0]", "at most 200"),
    (t(depends_on=["a", "b", "a"]), "depends_on[2]", "each job id once; 'a' is also depends_on[0]"),
    # idempotency_key
    (t(idempotency_key=""), "idempotency_key", "non-empty string"),
    (t(idempotency_key="k" * 201), "idempotency_key", "at most 200"),
    (t(idempotency_key=12), "idempotency_key", "non-empty string"),
]


@pytest.mark.parametrize(
    ("body", "field", "words"), INVALID, ids=[repr(i[0])[:60] for i in INVALID]
)
def test_invalid(body: Any, field: str | None, words: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_job(body, now_ms=NOW)
    err = info.value
    assert err.field == field
    assert err.code is Code.INVALID_ARGUMENT
    assert "expected" in err.message
    assert words in err.message
    if field is not None:
        assert err.message.startswith(f"{field}: ")
        assert err.to_dict() == {
            "error": {"code": "invalid_argument", "message": err.message, "field": field}
        }


def test_a_zone_name_of_up_to_64_characters_is_looked_up_a_longer_one_is_not() -> None:
    """A name that could be a zone is answered as an unknown zone (the API suggests the zone
    it probably means); one longer than 64 characters is refused as it stands."""
    for length, unknown in [(63, True), (64, True), (65, False)]:
        body = t(schedule={"cron": "0 2 * * *", "timezone": "Europe/" + "x" * (length - 7)})
        with pytest.raises(InvalidArgument) as info:
            parse_job(body, now_ms=NOW)
        assert isinstance(info.value, UnknownZone) is unknown, length
        assert info.value.field == "schedule.timezone" and "IANA" in info.value.message


def test_validate_is_pure() -> None:
    import ast

    import schedd.core.validate as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert not imported & {"time", "asyncio", "random", "uuid", "os", "socket", "secrets"}


def test_task_missing_message_says_required() -> None:
    with pytest.raises(InvalidArgument, match=r"^task: required; expected a task name"):
        parse_job({"name": "x"}, now_ms=NOW)


def test_long_bad_values_are_cut_in_messages() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_job({"task": "x" * 5000}, now_ms=NOW)
    assert len(info.value.message) < 300


# --------------------------------------------------------------------------------------------
# Payload size and defaults


def test_payload_too_large() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        parse_job(t(payload="x" * 65535), now_ms=NOW)  # 65537 bytes with the quotes
    assert info.value.field == "payload"
    assert info.value.http_status == 413
    assert "expected at most 65536 bytes" in info.value.message


def test_payload_limit_from_defaults() -> None:
    small = Defaults(max_payload=10)
    assert parse_job(t(payload="12345678"), now_ms=NOW, defaults=small).payload == "12345678"
    with pytest.raises(PayloadTooLarge, match="at most 10 bytes"):
        parse_job(t(payload="123456789"), now_ms=NOW, defaults=small)


def test_defaults_apply() -> None:
    d = Defaults(max_attempts=7, heartbeat_timeout_ms=5000)
    spec = parse_job({"task": "t"}, now_ms=NOW, defaults=d)
    assert spec.retry.max_attempts == 7
    assert spec.heartbeat_timeout_ms == 5000
    spec = parse_job(t(retry={"initial": "2s"}), now_ms=NOW, defaults=d)
    assert spec.retry == RetryPolicy(max_attempts=7, initial_ms=2000)
    spec = parse_job(t(retry={"max_attempts": 2}, heartbeat_timeout=9), now_ms=NOW, defaults=d)
    assert (spec.retry.max_attempts, spec.heartbeat_timeout_ms) == (2, 9000)


def test_field_prefix() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_job(t(schedule={"cron": "nope"}), now_ms=NOW, field_prefix="jobs[3].")
    assert info.value.field == "jobs[3].schedule.cron"
    assert info.value.message.startswith("jobs[3].schedule.cron: expected")
    with pytest.raises(InvalidArgument) as info:
        parse_job(5, now_ms=NOW, field_prefix="jobs[3].")
    assert info.value.field == "jobs[3]"


# --------------------------------------------------------------------------------------------
# parse_schedule and the recurring options


def test_recurring_options_of_the_contract_example() -> None:
    spec, options = parse_job_and_options(CONTRACT_EXAMPLE, now_ms=NOW)
    assert spec == parse_job(CONTRACT_EXAMPLE, now_ms=NOW)
    assert options == RecurringOptions(
        jitter_ms=300_000,
        misfire=Misfire.RUN_ONCE,
        catchup_window_ms=3_600_000,
        overlap=Overlap.SKIP,
        dst_gap=DstGap.SHIFT,
        dst_repeat=DstRepeat.FIRST,
    )


def test_recurring_options_all_set() -> None:
    schedule, options = parse_schedule(
        {
            "every": "1h",
            "timezone": "Asia/Tokyo",
            "jitter": 30,
            "misfire": "run_all",
            "catchup_window": "6h",
            "overlap": "cancel_other",
            "dst": {"gap": "skip", "repeat": "both"},
            "start_at": "2026-11-25T02:00:00Z",
            "end_at": "2026-11-26T02:00:00Z",
        },
        NOW,
        "schedule",
    )
    assert schedule == Schedule(
        kind=ScheduleKind.EVERY, every_ms=3_600_000, timezone="Asia/Tokyo", options=options
    )
    assert options == RecurringOptions(
        jitter_ms=30_000,
        misfire=Misfire.RUN_ALL,
        catchup_window_ms=21_600_000,
        overlap=Overlap.CANCEL_OTHER,
        dst_gap=DstGap.SKIP,
        dst_repeat=DstRepeat.BOTH,
        start_at_ms=T_2026,
        end_at_ms=T_2026 + 86_400_000,
    )


def test_recurring_defaults_and_one_offs() -> None:
    assert parse_schedule({"cron": "* * * * *"}, NOW)[1] == RecurringOptions()
    assert parse_schedule({"every": 60, "dst": None}, NOW)[1] == RecurringOptions()
    assert parse_schedule(None, NOW) == (Schedule(), None)
    assert parse_schedule({"at": "2026-11-25T02:00:00Z"}, NOW)[1] is None
    assert parse_schedule({"in": "1s"}, NOW)[1] is None


def test_parse_schedule_names_its_field() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_schedule({"every": "1ms"}, NOW, "x.schedule")
    assert info.value.field == "x.schedule.every"


# --------------------------------------------------------------------------------------------
# Batches


def test_batch_ok() -> None:
    specs = parse_batch(
        {"jobs": [{"task": "a"}, {"task": "b", "schedule": {"in": 10}}]}, now_ms=NOW
    )
    assert [s.task for s in specs] == ["a", "b"]
    assert specs[1].schedule.at_ms == NOW + 10_000


def test_batch_passes_defaults() -> None:
    specs = parse_batch({"jobs": [{"task": "a"}]}, now_ms=NOW, defaults=Defaults(max_attempts=9))
    assert specs[0].retry.max_attempts == 9


BATCH_INVALID: list[tuple[Any, str | None, str]] = [
    ([{"task": "a"}], None, 'expected a JSON object like {"jobs": [...]}'),
    ({}, "jobs", "expected a list of 1 to 3 job objects, got null"),
    ({"jobs": []}, "jobs", "a list of 1 to 3 job objects"),
    ({"jobs": {"task": "a"}}, "jobs", "got object"),
    ({"jobs": [{"task": "a"}] * 4}, "jobs", "1 to 3"),
    ({"jobs": [{"task": "a"}], "extra": 1}, "extra", "expected one of: jobs"),
    ({"jobs": [{"task": "a"}, 5]}, "jobs[1]", "expected a JSON object"),
    ({"jobs": [{"task": "a"}, {}]}, "jobs[1].task", "required"),
    (
        {"jobs": [{"task": "a"}, {"task": "b", "retry": {"max_attempts": 0}}]},
        "jobs[1].retry.max_attempts",
        "1 to 100",
    ),
    (
        {"jobs": [{"task": "a", "depends_on": ["x", "x"]}]},
        "jobs[0].depends_on[1]",
        "also jobs[0].depends_on[0]",
    ),
    (
        {
            "jobs": [
                {"task": "a", "idempotency_key": "k"},
                {"task": "a", "idempotency_key": "k", "namespace": "other"},
                {"task": "b", "idempotency_key": "k"},
            ]
        },
        "jobs[2].idempotency_key",
        "unique idempotency_key within the batch; jobs[0] has the same",
    ),
]


@pytest.mark.parametrize(("body", "field", "words"), BATCH_INVALID)
def test_batch_invalid(body: Any, field: str | None, words: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_batch(body, now_ms=NOW, max_jobs=3)
    assert info.value.field == field
    assert "expected" in info.value.message
    assert words in info.value.message


def test_batch_payload_too_large_names_the_item() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        parse_batch(
            {"jobs": [{"task": "a"}, {"task": "b", "payload": "xxx"}]},
            now_ms=NOW,
            defaults=Defaults(max_payload=4),
        )
    assert info.value.field == "jobs[1].payload"


# --------------------------------------------------------------------------------------------
# The replicated form


def test_spec_dict_is_compact() -> None:
    assert spec_to_dict(JobSpec(task="t")) == {"v": 1, "task": "t"}
    spec = parse_job(CONTRACT_EXAMPLE, now_ms=NOW)
    assert spec_to_dict(spec) == {
        "v": 1,
        "task": "reports.generate",
        "name": "nightly-report",
        "payload": {"report": "sales"},
        "timeout_ms": 1_800_000,
        "idem": "invoice-2026-11-25",
        "sched": {
            "kind": "cron",
            "cron": "0 2 * * *",
            "tz": "Europe/Berlin",
            "opts": {"jitter_ms": 300_000, "catchup_window_ms": 3_600_000},
        },
        "prio": "high",
        "retry": {"attempts": 5},
        "deps": ["<job id>"],
    }


def test_spec_dict_round_trips_everything() -> None:
    spec = JobSpec(
        task="t",
        name="n",
        namespace="ns",
        queue="q",
        payload=[1, {"a": None}],
        schedule=Schedule(kind=ScheduleKind.IN, at_ms=5, in_ms=3),
        priority=Priority.LOW,
        retry=RetryPolicy(9, 1, 2, 1.25, False),
        timeout_ms=7,
        heartbeat_timeout_ms=8000,
        depends_on=("x", "y"),
        idempotency_key="k",
    )
    d = orjson.loads(orjson.dumps(spec_to_dict(spec)))
    assert spec_from_dict(d) == spec
    assert spec_from_dict(d).retry.multiplier.__class__ is float


def test_a_stored_integral_multiplier_still_decodes_to_a_float() -> None:
    # JSON does not keep 2.0 apart from 2 everywhere (JavaScript writes 2): the spec read back
    # has the float the model declares, so it renders and compares as one.  A policy no other
    # test builds: decoded policies are shared, and an equal one decoded before would hide it.
    policy = RetryPolicy(max_attempts=7, initial_ms=1234, max_ms=56_789, multiplier=3.0)
    d = orjson.loads(orjson.dumps(spec_to_dict(JobSpec(task="t", retry=policy))))
    d["retry"]["mult"] = 3
    multiplier = spec_from_dict(d).retry.multiplier
    assert (multiplier, multiplier.__class__) == (3.0, float)


SPEC = {"v": 1, "task": "t"}

# A malformed replicated spec (a version skew, a damaged journal) raises ValueError; its text
# ends up in the rejection of the command ("undecodable command: malformed Submit: <this>").
MALFORMED_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"task": "t"}, "job spec: expected an object with v=1"),
    ({"v": 2, "task": "t"}, "job spec: expected an object with v=1"),
    ({"v": 1}, "job spec: missing task or unknown keys []"),
    ({"v": 1, "task": 5}, "job spec: missing task or unknown keys []"),
    ({**SPEC, "what": 1, "1": 2}, "job spec: missing task or unknown keys ['1', 'what']"),
    ({**SPEC, "sched": {"kind": "sometimes"}}, "'sometimes' is not a valid ScheduleKind"),
    (
        {**SPEC, "sched": {"kind": "at", "zone": "UTC"}},
        "job spec: unknown keys in 'sched': ['zone']",
    ),
    ({**SPEC, "sched": []}, "job spec: 'sched' must be an object"),
    ({**SPEC, "sched": {"kind": "every", "opts": []}}, "job spec: 'opts' must be an object"),
    (
        {**SPEC, "sched": {"kind": "every", "opts": {"fold": 1, "jitter_ms": 5}}},
        "job spec: unknown keys in 'opts': ['fold']",
    ),
    (
        {**SPEC, "sched": {"kind": "every", "opts": {"misfire": "later"}}},
        "'later' is not a valid Misfire",
    ),
    ({**SPEC, "retry": {"tries": 1}}, "job spec: unknown keys in 'retry': ['tries']"),
    ({**SPEC, "prio": "max"}, "'max' is not a valid Priority"),
    ({**SPEC, "deps": "a"}, "job spec: 'deps' must be a list of strings"),
    ({**SPEC, "deps": [1]}, "job spec: 'deps' must be a list of strings"),
]


@pytest.mark.parametrize(
    ("bad", "message"), MALFORMED_SPECS, ids=[repr(m[0])[:50] for m in MALFORMED_SPECS]
)
def test_spec_from_dict_rejects_malformed(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        spec_from_dict(bad)
    assert str(info.value) == message


def test_a_decoded_multiplier_is_a_float_however_it_is_written() -> None:
    """An encoder that writes 2.0 as 2 (JavaScript, jq) must not change the decoded spec: the
    job view shows ``"multiplier": 3.0`` either way."""
    retry = spec_from_dict({**SPEC, "retry": {"mult": 3}}).retry
    assert retry == RetryPolicy(multiplier=3.0)
    assert type(retry.multiplier) is float


def test_decoded_specs_share_their_equal_records_and_names() -> None:
    """The replicated form decodes to one instance of each equal retry policy and recurring
    schedule, and one string per task/namespace/queue name (memory per pending job)."""

    def decoded(payload: int, schedule: dict[str, Any]) -> JobSpec:
        body = {
            "task": "t.share",
            "namespace": "ns1",
            "queue": "q1",
            "payload": payload,
            "schedule": schedule,
            "retry": {"max_attempts": 7},
        }
        return spec_from_dict(orjson.loads(orjson.dumps(spec_to_dict(parse_job(body, now_ms=0)))))

    a, b = decoded(1, {"every": "5m"}), decoded(2, {"every": "5m"})
    assert a.retry is b.retry and a.retry.max_attempts == 7
    assert a.schedule is b.schedule and a.schedule.every_ms == 300_000
    assert a.task is b.task and a.namespace is b.namespace and a.queue is b.queue
    c, d = decoded(3, {"in": "1h"}), decoded(4, {"in": "1h"})
    assert c.retry is a.retry
    assert c.schedule == d.schedule  # equal (same submit time) but one-off: not shared
    assert a.payload == 1 and b.payload == 2


# -- POST /dlq/replay and /dlq/drop ----------------------------------------------------------------


def test_a_dlq_selection_is_filters_or_run_ids_with_a_required_dry_run() -> None:
    got = parse_dlq_bulk(
        {"dry_run": True, "namespace": "a", "task": "mail.send", "since": "2026-01-01T00:00:00Z"},
        max_runs=10,
    )
    assert got.dry_run and got.run_ids is None
    assert got.filters == {"namespace": "a", "task": "mail.send", "since": 1_767_225_600_000}
    assert parse_dlq_bulk({"dry_run": False, "queue": None}, max_runs=10).filters == {}
    queued = parse_dlq_bulk({"dry_run": False, "queue": "emails"}, max_runs=10)
    assert queued.filters == {"queue": "emails"}
    ids = parse_dlq_bulk({"dry_run": False, "run_ids": ["a@1", "b@2"]}, max_runs=2)
    assert ids.run_ids == ("a@1", "b@2") and not ids.dry_run
    for body, field, says in [
        ({}, "dry_run", "required"),
        ({"dry_run": 1}, "dry_run", "true or false"),
        ({"dry_run": True, "error": ""}, "error", "non-empty"),
        ({"dry_run": True, "run_ids": ["a@1"] * 3}, "run_ids", "1 to 2 run ids"),
        ({"dry_run": True, "run_ids": ["a@1", "a@1"]}, "run_ids[1]", "once"),
        ({"dry_run": True, "run_ids": ["a@1"], "error": "x"}, "run_ids", "not both"),
        (
            {"dry_run": True, "run_ids": ["a@1"], "error": "x", "namespace": "a"},
            "run_ids",
            "got run_ids and namespace, error",
        ),
        ({"dry_run": True, "when": "now"}, "when", "unknown field"),
        ({"dry_run": True, "queue": "no spaces"}, "queue", "expected"),
    ]:
        with pytest.raises(InvalidArgument) as exc:
            parse_dlq_bulk(body, max_runs=2)
        assert exc.value.field == field and says in exc.value.message, (body, exc.value)
