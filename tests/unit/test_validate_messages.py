"""The exact 400 a bad job body gets: ``<field>: expected <what>, got <the value>``.

The message is the product here (a user fixes the body from it): one representative case per
kind of check, asserted whole, including how the offending value is shown (strings quoted,
numbers as written, other JSON values by type, long values cut after 57 characters, integers
over 64 bits by size only).
"""

from __future__ import annotations

from typing import Any

import pytest

from schedd.core.validate import parse_batch, parse_job, parse_job_and_options, parse_schedule
from schedd.errors import InvalidArgument

NOW = 1_764_000_000_000  # 2025-11-24T16:00:00Z

CRON_EXPECTED = (
    'a cron expression of 5 fields like "0 2 * * *" (minute hour day-of-month month '
    "day-of-week), 6 with seconds as the last field, or one of @yearly, @annually, @monthly, "
    "@weekly, @daily, @midnight, @hourly"
)
ZONE_EXPECTED = 'an IANA time zone like "Europe/Berlin" or "UTC"'
TIME_EXPECTED = "an RFC 3339 time between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z"
IDENT_EXPECTED = "1 to 64 characters of lowercase letters, digits, - and _"
DURATION_EXPECTED = 'a duration like "90s", "5m", "1h30m" or a number of seconds'


def t(**kw: Any) -> dict[str, Any]:
    return {"task": "t", **kw}


def cron(**kw: Any) -> dict[str, Any]:
    return t(schedule={"cron": "0 2 * * *", **kw})


# (id, body, field, the whole message)
MESSAGES: list[tuple[str, Any, str | None, str]] = [
    # the body and how values are shown
    ("body-number", 5, None, "job: expected a JSON object with at least a task, got 5"),
    ("body-string", "t", None, "job: expected a JSON object with at least a task, got 't'"),
    ("body-array", [], None, "job: expected a JSON object with at least a task, got array"),
    (
        "value-60-chars-shown-whole",
        t(namespace="A" * 58),
        "namespace",
        f"namespace: expected {IDENT_EXPECTED}, got '{'A' * 58}'",
    ),
    (
        "value-61-chars-cut",
        t(namespace="A" * 59),
        "namespace",
        f"namespace: expected {IDENT_EXPECTED}, got '{'A' * 56}...",
    ),
    ("value-number", t(namespace=5), "namespace", f"namespace: expected {IDENT_EXPECTED}, got 5"),
    (
        "integer-of-64-bits-shown",
        t(retry={"max_attempts": 2**64 - 1}),
        "retry.max_attempts",
        "retry.max_attempts: expected an integer from 1 to 100, got 18446744073709551615",
    ),
    (
        "integer-over-64-bits-by-size",
        t(retry={"max_attempts": 2**64}),
        "retry.max_attempts",
        "retry.max_attempts: expected an integer from 1 to 100, got an integer beyond 64 bits",
    ),
    ("object", t(schedule="now"), "schedule", "schedule: expected an object, got 'now'"),
    (
        "choice",
        t(priority="urgent"),
        "priority",
        "priority: expected one of high | normal | low, got 'urgent'",
    ),
    (
        "number-as-string",
        t(retry={"multiplier": "2"}),
        "retry.multiplier",
        "retry.multiplier: expected a number from 1 to 10, got '2'",
    ),
    ("bool", t(retry={"jitter": 1}), "retry.jitter", "retry.jitter: expected true or false, got 1"),
    (
        "text",
        t(name=""),
        "name",
        "name: expected a non-empty string of at most 200 characters, got ''",
    ),
    (
        "depends-on",
        t(depends_on="a"),
        "depends_on",
        "depends_on: expected a list of at most 100 job ids, got 'a'",
    ),
    # durations
    (
        "duration-text-too-long",
        t(timeout="1" * 65),
        "timeout",
        f"timeout: expected {DURATION_EXPECTED}, got '{'1' * 56}...",
    ),
    (
        "duration-text-with-spaces-too-long",
        t(timeout="1s" + " " * 63),
        "timeout",
        f"timeout: expected {DURATION_EXPECTED}, got '1s{' ' * 54}...",
    ),
    (
        "duration-below-minimum",
        t(heartbeat_timeout="500ms"),
        "heartbeat_timeout",
        "heartbeat_timeout: expected a duration of at least 1s, got '500ms'",
    ),
    (
        "retry-max-below-initial",
        t(retry={"initial": "1m", "max": 30}),
        "retry.max",
        "retry.max: expected a duration of at least retry.initial (1m), got 30",
    ),
    (
        "retry-default-max-below-initial",
        t(retry={"initial": "2h"}),
        "retry.max",
        "retry.max: expected a duration of at least retry.initial (2h), got '10m'",
    ),
    # times
    (
        "time-before-1970",
        t(schedule={"at": "1969-12-31T23:59:59Z"}),
        "schedule.at",
        f"schedule.at: expected {TIME_EXPECTED}, got '1969-12-31T23:59:59Z'",
    ),
    (
        "time-after-9999",
        t(schedule={"at": "9999-12-31T23:59:59-00:01"}),
        "schedule.at",
        f"schedule.at: expected {TIME_EXPECTED}, got '9999-12-31T23:59:59-00:01'",
    ),
    (
        "end-before-start",
        t(
            schedule={
                "every": "1h",
                "start_at": "2026-11-25T02:00:00Z",
                "end_at": "2026-11-25T01:00:00Z",
            }
        ),
        "schedule.end_at",
        "schedule.end_at: expected a time after schedule.start_at (2026-11-25T02:00:00.000Z), "
        "got '2026-11-25T01:00:00Z'",
    ),
    # time zones
    (
        "zone-not-a-name",
        cron(timezone="../etc/passwd"),
        "schedule.timezone",
        f"schedule.timezone: expected {ZONE_EXPECTED}, got '../etc/passwd'",
    ),
    (
        "zone-unknown",
        cron(timezone="Mars/Olympus"),
        "schedule.timezone",
        f"schedule.timezone: expected {ZONE_EXPECTED}, got 'Mars/Olympus'",
    ),
    (
        "zone-posix-copy",
        cron(timezone="posix/UTC"),
        "schedule.timezone",
        f"schedule.timezone: expected {ZONE_EXPECTED}, got 'posix/UTC'",
    ),
    (
        "zone-right-copy",
        cron(timezone="right/UTC"),
        "schedule.timezone",
        f"schedule.timezone: expected {ZONE_EXPECTED}, got 'right/UTC'",
    ),
    # cron
    (
        "cron-not-text",
        t(schedule={"cron": 5}),
        "schedule.cron",
        f"schedule.cron: expected {CRON_EXPECTED}, got 5",
    ),
    (
        "cron-too-long",
        t(schedule={"cron": "0 2 * * *" + " " * 192}),
        "schedule.cron",
        f"schedule.cron: expected {CRON_EXPECTED}, got '0 2 * * *{' ' * 47}...",
    ),
    (
        "cron-unknown-alias",
        t(schedule={"cron": "@reboot"}),
        "schedule.cron",
        f"schedule.cron: expected {CRON_EXPECTED}, got '@reboot'",
    ),
    (
        "cron-4-fields",
        t(schedule={"cron": "* * * *"}),
        "schedule.cron",
        f"schedule.cron: expected {CRON_EXPECTED}, got '* * * *'",
    ),
    (
        "cron-bad-field",
        t(schedule={"cron": "60 * * * *"}),
        "schedule.cron",
        "schedule.cron: the minute field '60' is out of range: expected 0-59, in '60 * * * *'",
    ),
    (
        "cron-random",
        t(schedule={"cron": "R * * * *"}),
        "schedule.cron",
        "schedule.cron: expected a cron expression without random (R) or hashed (H) fields, "
        "got 'R * * * *'",
    ),
    (
        "cron-never",
        t(schedule={"cron": "0 0 31 2 *"}),
        "schedule.cron",
        "schedule.cron: expected a cron expression that matches at least one date, "
        "got '0 0 31 2 *'",
    ),
    # recurring options
    (
        "jitter-not-shorter",
        t(schedule={"every": "1m", "jitter": 60}),
        "schedule.jitter",
        "schedule.jitter: expected a jitter shorter than the interval (1m), got 60",
    ),
    # payload
    (
        "payload-big-int",
        t(payload=2**70),
        "payload",
        "payload: expected a JSON value (integers within 64 bits, string keys, depth ≤ 255), "
        "got an integer beyond 64 bits",
    ),
    (
        "payload-nan",
        t(payload={"a": [1, float("nan")]}),
        "payload",
        "payload: expected a JSON value with finite numbers only, got nan",
    ),
]


@pytest.mark.parametrize(
    ("body", "field", "message"), [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES]
)
def test_a_bad_body_gets_the_field_what_was_expected_and_what_was_got(
    body: Any, field: str | None, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_job(body, now_ms=NOW)
    assert (info.value.field, info.value.message) == (field, message)


def test_a_bad_job_in_a_batch_is_named_by_its_index() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_batch({"jobs": [{"task": "a"}, {"task": "b"}, {"task": "c"}, None]}, now_ms=NOW)
    assert (info.value.field, info.value.message) == (
        "jobs[3]",
        "jobs[3]: expected a JSON object with at least a task, got null",
    )


def test_a_batch_that_is_not_an_object_shows_what_it_is() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_batch("jobs", now_ms=NOW)
    assert (info.value.field, info.value.message) == (
        None,
        "batch: expected a JSON object like {\"jobs\": [...]}, got 'jobs'",
    )


def test_a_batch_holds_at_most_10000_jobs_by_default() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_batch({"jobs": [{"task": "a"}] * 10_001}, now_ms=NOW)
    assert (info.value.field, info.value.message) == (
        "jobs",
        "jobs: expected a list of 1 to 10000 job objects, got array",
    )


def test_fields_are_named_from_the_top_by_default() -> None:
    """Without a prefix (``parse_job_and_options``) or a field name (``parse_schedule``), the
    fields in errors are the body's own: ``task``, ``schedule.every``."""
    with pytest.raises(InvalidArgument) as info:
        parse_job_and_options({"task": 5}, now_ms=NOW)
    assert info.value.field == "task"
    with pytest.raises(InvalidArgument) as info:
        parse_job_and_options(5, now_ms=NOW)
    assert (info.value.field, info.value.message) == (
        None,
        "job: expected a JSON object with at least a task, got 5",
    )
    with pytest.raises(InvalidArgument) as info:
        parse_schedule({"every": "1ms"}, NOW)
    assert (info.value.field, info.value.message) == (
        "schedule.every",
        "schedule.every: expected a duration of at least 1s, got '1ms'",
    )
