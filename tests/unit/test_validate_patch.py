"""``PATCH /jobs/{id}`` bodies (docs/api.md): only the given fields change, ``retry`` replaces
the whole policy, ``timeout: null`` removes the timeout, ``schedule: null`` means run now; and
the ``namespace``/``queue`` filters of ``GET /jobs``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from schedd.core.model import (
    JobSpec,
    Overlap,
    Priority,
    RecurringOptions,
    RetryPolicy,
    Schedule,
    ScheduleKind,
)
from schedd.core.validate import Defaults, parse_ident, parse_patch
from schedd.errors import InvalidArgument, PayloadTooLarge

NOW = 1_764_000_000_000
DEFAULTS = Defaults(max_attempts=7, heartbeat_timeout_ms=5000, max_payload=100)

CURRENT = JobSpec(
    task="t",
    payload={"a": 1},
    schedule=Schedule(kind=ScheduleKind.EVERY, every_ms=3_600_000, options=RecurringOptions()),
    priority=Priority.LOW,
    retry=RetryPolicy(5, 2000, 60_000, 3.0, False),
    timeout_ms=60_000,
)

# (id, body, paused, the new spec or None when the spec does not change)
PATCHES: list[tuple[str, dict[str, Any], bool | None, JobSpec | None]] = [
    ("pause", {"paused": True}, True, None),
    ("resume", {"paused": False}, False, None),
    ("paused-null-changes-nothing", {"paused": None}, None, None),
    (
        "schedule",
        {"schedule": {"cron": "0 3 * * *", "overlap": "allow"}},
        None,
        replace(
            CURRENT,
            schedule=Schedule(
                kind=ScheduleKind.CRON,
                cron="0 3 * * *",
                options=RecurringOptions(overlap=Overlap.ALLOW),
            ),
        ),
    ),
    (
        "schedule-in-from-now",
        {"schedule": {"in": "5s"}},
        None,
        replace(CURRENT, schedule=Schedule(kind=ScheduleKind.IN, in_ms=5000, at_ms=NOW + 5000)),
    ),
    ("schedule-null-runs-now", {"schedule": None}, None, replace(CURRENT, schedule=Schedule())),
    ("payload", {"payload": {"b": [2]}}, None, replace(CURRENT, payload={"b": [2]})),
    ("payload-null", {"payload": None}, None, replace(CURRENT, payload=None)),
    ("priority", {"priority": "high"}, None, replace(CURRENT, priority=Priority.HIGH)),
    ("priority-null-changes-nothing", {"priority": None}, None, None),
    (
        "retry-replaces-the-whole-policy",
        {"retry": {"initial": "3s"}},
        None,
        replace(CURRENT, retry=RetryPolicy(max_attempts=7, initial_ms=3000)),
    ),
    (
        "retry-empty-is-the-defaults",
        {"retry": {}},
        None,
        replace(CURRENT, retry=RetryPolicy(max_attempts=7)),
    ),
    ("retry-null-changes-nothing", {"retry": None}, None, None),
    ("timeout", {"timeout": "5m"}, None, replace(CURRENT, timeout_ms=300_000)),
    ("timeout-null-removes-it", {"timeout": None}, None, replace(CURRENT, timeout_ms=None)),
    (
        "several",
        {"paused": True, "priority": "normal", "timeout": 10},
        True,
        replace(CURRENT, priority=Priority.NORMAL, timeout_ms=10_000),
    ),
]


@pytest.mark.parametrize(
    ("body", "paused", "spec"), [p[1:] for p in PATCHES], ids=[p[0] for p in PATCHES]
)
def test_a_patch_changes_only_what_it_names(
    body: dict[str, Any], paused: bool | None, spec: JobSpec | None
) -> None:
    assert parse_patch(body, CURRENT, now_ms=NOW, defaults=DEFAULTS) == (paused, spec)


FIELDS = "paused, schedule, payload, priority, retry, timeout"

BAD_PATCHES: list[tuple[str, Any, str | None, str]] = [
    ("not-an-object", 5, "body", "body: expected an object, got 5"),
    ("empty", {}, None, f"expected at least one of {FIELDS}, got an empty object"),
    (
        "name-cannot-change",
        {"name": "x"},
        "name",
        f"name: unknown field 'name'; expected one of: {FIELDS}",
    ),
    ("paused", {"paused": "yes"}, "paused", "paused: expected true or false, got 'yes'"),
    (
        "schedule",
        {"schedule": {"every": "1ms"}},
        "schedule.every",
        "schedule.every: expected a duration of at least 1s, got '1ms'",
    ),
    (
        "payload",
        {"payload": [float("inf")]},
        "payload",
        "payload: expected a JSON value with finite numbers only, got inf",
    ),
    (
        "priority",
        {"priority": "urgent"},
        "priority",
        "priority: expected one of high | normal | low, got 'urgent'",
    ),
    (
        "retry",
        {"retry": {"max_attempts": 0}},
        "retry.max_attempts",
        "retry.max_attempts: expected an integer from 1 to 100, got 0",
    ),
    ("timeout", {"timeout": "0s"}, "timeout", "timeout: expected a positive duration, got '0s'"),
]


@pytest.mark.parametrize(
    ("body", "field", "message"), [b[1:] for b in BAD_PATCHES], ids=[b[0] for b in BAD_PATCHES]
)
def test_a_bad_patch_names_the_field_and_what_was_expected(
    body: Any, field: str | None, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_patch(body, CURRENT, now_ms=NOW, defaults=DEFAULTS)
    assert (info.value.field, info.value.message) == (field, message)


def test_a_patched_payload_has_the_submit_limit() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        parse_patch({"payload": "x" * 100}, CURRENT, now_ms=NOW, defaults=DEFAULTS)
    assert (info.value.field, info.value.message) == (
        "payload",
        "payload: expected at most 100 bytes of JSON, got 102",
    )


def test_namespace_and_queue_filters() -> None:
    assert parse_ident("team-a_1", "namespace") == "team-a_1"
    with pytest.raises(InvalidArgument) as info:
        parse_ident("Team", "queue")
    assert (info.value.field, info.value.message) == (
        "queue",
        "queue: expected 1 to 64 characters of lowercase letters, digits, - and _, got 'Team'",
    )
