"""Validation of job bodies from the API into :class:`~schedd.core.model.JobSpec`.

Pure: no clocks, no randomness, no I/O beyond loading IANA zones (``zoneinfo``) and checking cron
expressions (``croniter``).  The caller passes ``now_ms`` (for ``{"in": …}`` schedules).

Every problem is an :class:`~schedd.errors.InvalidArgument` whose ``field`` is the dotted path
of the offending value (``schedule.cron``, ``retry.max_attempts``, ``depends_on[2]``, or
``jobs[3].task`` inside a batch) and whose message says what was expected.  A payload over the
limit is a :class:`~schedd.errors.PayloadTooLarge` (413).

Also here: :func:`spec_to_dict` / :func:`spec_from_dict`, the compact versioned plain-dict form
of a :class:`JobSpec` carried inside replicated commands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from croniter import CroniterBadDateError, croniter

from schedd.core.durations import format_duration, format_time, parse_duration, parse_time
from schedd.core.model import (
    JSON,
    DstGap,
    DstRepeat,
    JobSpec,
    Misfire,
    Overlap,
    Priority,
    RecurringOptions,
    RetryPolicy,
    Schedule,
    ScheduleKind,
)
from schedd.core.recurrence import cron_parts
from schedd.errors import InvalidArgument, PayloadTooLarge, UnknownZone

__all__ = [
    "JOB_FIELDS",
    "SCHEDULE_FIELDS",
    "Defaults",
    "DstGap",
    "DstRepeat",
    "Misfire",
    "Overlap",
    "RecurringOptions",
    "parse_batch",
    "parse_job",
    "parse_job_and_options",
    "parse_schedule",
    "parse_text",
]


# --------------------------------------------------------------------------------------------
# Public types


@dataclass(frozen=True)
class Defaults:
    """Server-side defaults and limits that apply to submissions (from the config)."""

    max_attempts: int = 3
    heartbeat_timeout_ms: int = 60000
    max_payload: int = 65536


DEFAULTS: Final = Defaults()


JOB_FIELDS: Final = (
    "task",
    "name",
    "namespace",
    "queue",
    "payload",
    "schedule",
    "priority",
    "retry",
    "timeout",
    "heartbeat_timeout",
    "depends_on",
    "idempotency_key",
)
_KINDS: Final = ("at", "in", "every", "cron")
RECURRING_FIELDS: Final = (
    "timezone",
    "jitter",
    "misfire",
    "catchup_window",
    "overlap",
    "dst",
    "start_at",
    "end_at",
)
SCHEDULE_FIELDS: Final = _KINDS + RECURRING_FIELDS
RETRY_FIELDS: Final = ("max_attempts", "initial", "max", "multiplier", "jitter")
DST_FIELDS: Final = ("gap", "repeat")

MAX_TEXT: Final = 200
MAX_DEPENDS_ON: Final = 100
MAX_ATTEMPTS: Final = 100
MAX_TIME_MS: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_MAX_DURATION_TEXT: Final = 64

# what a task name, a namespace or queue name, and a time zone name look like (also published in
# the OpenAPI document's request schemas, anchored)
TASK_PATTERN: Final = r"[A-Za-z0-9_.:-]{1,200}"
IDENT_PATTERN: Final = r"[a-z0-9_-]{1,64}"
ZONE_PATTERN: Final = r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*"
_TASK_RE: Final = re.compile(TASK_PATTERN)
_IDENT_RE: Final = re.compile(IDENT_PATTERN)
_ZONE_RE: Final = re.compile(ZONE_PATTERN)
NOT_IANA_ZONES: Final = frozenset({"localtime", "posixrules", "Factory"})
_CRON_ALIASES: Final = (
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
)
# croniter's random ("R") and hashed ("H") fields: not deterministic across nodes.
_CRON_RANDOM_RE: Final = re.compile(r"(?<![a-z])[hr](?![a-z])", re.IGNORECASE)
_CRON_PROBE_START: Final = datetime(2000, 1, 1, tzinfo=UTC)  # a leap year: Feb 29 exists

_E = TypeVar("_E", bound=StrEnum)


# --------------------------------------------------------------------------------------------
# Small checkers


def _kind_of(value: object) -> str:
    """The JSON name of the type of a value that :func:`_show` does not print (it prints
    numbers and strings themselves), for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _show(value: object) -> str:
    """A short rendering of a bad value for a message."""
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(value, int) and numeric and value.bit_length() > 64:
        return "an integer beyond 64 bits"
    text = repr(value) if numeric or isinstance(value, str) else _kind_of(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _invalid(field: str, expected: str, value: object) -> InvalidArgument:
    return InvalidArgument(f"{field}: expected {expected}, got {_show(value)}", field=field)


def _object(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _invalid(field, "an object", value)
    return value


def _check_keys(obj: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            name = str(key)
            raise InvalidArgument(
                f"{prefix}{name}: unknown field {_show(name)}; expected one of: "
                f"{', '.join(allowed)}",
                field=f"{prefix}{name}",
            )


def _text(value: object, field: str, *, max_len: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise _invalid(field, f"a non-empty string of at most {max_len} characters", value)
    return value


def parse_text(value: object, field: str) -> str:
    """A free text of 1 to :data:`MAX_TEXT` characters (a filter: an error message's part)."""
    return _text(value, field)


def _opt_text(value: object, field: str) -> str | None:
    return None if value is None else _text(value, field)


def _task(value: object, field: str) -> str:
    if value is None:
        raise InvalidArgument(
            f'{field}: required; expected a task name like "reports.generate"', field=field
        )
    if not isinstance(value, str) or not _TASK_RE.fullmatch(value):
        raise _invalid(
            field,
            f"a task name of 1 to {MAX_TEXT} letters, digits and the characters _ . : -",
            value,
        )
    return value


def parse_ident(value: str, field: str) -> str:
    """A namespace or queue name as a filter (raises ``InvalidArgument`` naming ``field``)."""
    return _ident(value, field)


def _ident(value: object, field: str) -> str:
    if value is None:
        return "default"
    if not isinstance(value, str) or not _IDENT_RE.fullmatch(value):
        raise _invalid(field, "1 to 64 characters of lowercase letters, digits, - and _", value)
    return value


def _choice(value: object, field: str, enum: type[_E], default: _E) -> _E:
    if value is None:
        return default
    for member in enum:
        if value == member.value and isinstance(value, str):
            return member
    options = " | ".join(m.value for m in enum)
    raise _invalid(field, f"one of {options}", value)


def _int_in(value: object, field: str, lo: int, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _invalid(field, f"an integer from {lo} to {hi}", value)
    return value


def _number_in(value: object, field: str, lo: float, hi: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not lo <= value <= hi
    ):
        raise _invalid(field, f"a number from {lo:g} to {hi:g}", value)
    return float(value)


def _bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(field, "true or false", value)
    return value


def _duration(value: object, field: str, *, minimum_ms: int = 1) -> int:
    """``parse_duration`` (which raises nothing but ``InvalidArgument``) with a lower bound."""
    if isinstance(value, str) and len(value) > _MAX_DURATION_TEXT:
        raise _invalid(field, 'a duration like "90s", "5m", "1h30m" or a number of seconds', value)
    ms = parse_duration(value, field, allow_zero=minimum_ms <= 0)
    if ms < minimum_ms:
        raise _invalid(field, f"a duration of at least {format_duration(minimum_ms)}", value)
    return ms


def _opt_duration(value: object, field: str, *, minimum_ms: int = 1) -> int | None:
    return None if value is None else _duration(value, field, minimum_ms=minimum_ms)


def _time(value: object, field: str) -> int:
    ms = parse_time(value, field)  # raises nothing but InvalidArgument
    if not 0 <= ms <= MAX_TIME_MS:
        raise _invalid(
            field,
            "an RFC 3339 time between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
            value,
        )
    return ms


def _opt_time(value: object, field: str) -> int | None:
    return None if value is None else _time(value, field)


def _timezone(value: object, field: str) -> str:
    if value is None:
        return "UTC"
    expected = 'an IANA time zone like "Europe/Berlin" or "UTC"'
    if not isinstance(value, str) or len(value) > 64:
        raise _invalid(field, expected, value)
    if (
        _ZONE_RE.fullmatch(value)
        and value not in NOT_IANA_ZONES
        and not value.startswith(("right/", "posix/"))
    ):
        try:
            ZoneInfo(value)
            return value
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    # (the zone meant is suggested where the error is answered: schedd.api.zones)
    raise UnknownZone(_invalid(field, expected, value).message, field=field, zone=value)


def _cron(value: object, field: str) -> str:
    expected = (
        'a cron expression of 5 fields like "0 2 * * *" (minute hour day-of-month month '
        "day-of-week), 6 with seconds as the last field, or one of " + ", ".join(_CRON_ALIASES)
    )
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _invalid(field, expected, value)
    expr = " ".join(value.split())
    if expr.startswith("@"):
        expr = expr.lower()
        if expr not in _CRON_ALIASES:
            raise _invalid(field, expected, value)
    elif len(expr.split(" ")) not in (5, 6):
        raise _invalid(field, expected, value)
    elif _CRON_RANDOM_RE.search(expr):
        raise _invalid(field, "a cron expression without random (R) or hashed (H) fields", value)
    matches = False
    for part in cron_parts(expr):  # both day fields restricted: either matches
        try:
            croniter(part, _CRON_PROBE_START).get_next(datetime)
            matches = True
        except CroniterBadDateError:
            continue
        except Exception:  # noqa: BLE001 - croniter raises a zoo of types on bad input
            problem = cron_field_problem(expr)
            if problem is not None:
                raise InvalidArgument(f"{field}: {problem}, in {value!r}", field=field) from None
            raise _invalid(field, expected, value) from None
    if not matches:
        raise _invalid(field, "a cron expression that matches at least one date", value)
    return expr


#: each field of a cron expression: its name and the numbers it takes
_CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
    ("second", 0, 59),
)


def cron_field_problem(expr: str) -> str | None:
    """Which field of ``expr`` holds a number out of its range (``61`` as a minute), said so
    that the user can fix it; None when none does (the expression is wrong otherwise)."""
    for (name, lo, hi), part in zip(_CRON_FIELDS, expr.split(" "), strict=False):
        for piece in part.split(","):
            base, _, step = piece.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                return f"the {name} field's step {step!r}: expected a whole number from 1"
            for number in base.split("-"):
                if number.isdigit() and not lo <= int(number) <= hi:
                    return f"the {name} field {part!r} is out of range: expected {lo}-{hi}"
    return None


# --------------------------------------------------------------------------------------------
# Schedule


def parse_schedule(
    obj: object, now_ms: int, field: str = "schedule"
) -> tuple[Schedule, RecurringOptions | None]:
    """A ``schedule`` value → the :class:`Schedule` and, for ``every``/``cron``, its options.

    ``null`` (or absent) means run now.  ``{"in": d}`` is resolved against ``now_ms``.
    """
    if obj is None:
        return Schedule(), None
    sched = _object(obj, field)
    _check_keys(sched, SCHEDULE_FIELDS, f"{field}.")
    given = [k for k in _KINDS if sched.get(k) is not None]
    if len(given) != 1:
        got = " and ".join(given) if given else "none"
        raise InvalidArgument(
            f"{field}: expected exactly one of at, in, every, cron (or a null schedule to run "
            f"now), got {got}",
            field=field,
        )
    kind = given[0]
    if kind in ("at", "in"):
        for extra in RECURRING_FIELDS:
            if sched.get(extra) is not None:
                raise InvalidArgument(
                    f"{field}.{extra}: only allowed with an every or cron schedule, not with "
                    f"{kind}; expected it absent",
                    field=f"{field}.{extra}",
                )
        if kind == "at":
            return Schedule(kind=ScheduleKind.AT, at_ms=_time(sched["at"], f"{field}.at")), None
        delay = _duration(sched["in"], f"{field}.in", minimum_ms=0)
        return Schedule(kind=ScheduleKind.IN, in_ms=delay, at_ms=now_ms + delay), None
    timezone = _timezone(sched.get("timezone"), f"{field}.timezone")
    if kind == "every":
        every = _duration(sched["every"], f"{field}.every", minimum_ms=1000)
        schedule = Schedule(kind=ScheduleKind.EVERY, every_ms=every, timezone=timezone)
    else:
        cron = _cron(sched["cron"], f"{field}.cron")
        schedule = Schedule(kind=ScheduleKind.CRON, cron=cron, timezone=timezone)
    options = _recurring_options(sched, field, schedule.every_ms)
    return replace(schedule, options=options), options


def _recurring_options(
    sched: Mapping[str, Any], field: str, every_ms: int | None
) -> RecurringOptions:
    jitter = _opt_duration(sched.get("jitter"), f"{field}.jitter", minimum_ms=0) or 0
    if every_ms is not None and jitter >= every_ms:
        raise _invalid(
            f"{field}.jitter",
            f"a jitter shorter than the interval ({format_duration(every_ms)})",
            sched.get("jitter"),
        )
    start = _opt_time(sched.get("start_at"), f"{field}.start_at")
    end = _opt_time(sched.get("end_at"), f"{field}.end_at")
    if start is not None and end is not None and end <= start:
        raise _invalid(
            f"{field}.end_at",
            f"a time after {field}.start_at ({format_time(start)})",
            sched.get("end_at"),
        )
    gap, repeat = _dst(sched.get("dst"), f"{field}.dst")
    defaults = RecurringOptions()
    return RecurringOptions(
        jitter_ms=jitter,
        misfire=_choice(sched.get("misfire"), f"{field}.misfire", Misfire, defaults.misfire),
        catchup_window_ms=_opt_duration(sched.get("catchup_window"), f"{field}.catchup_window"),
        overlap=_choice(sched.get("overlap"), f"{field}.overlap", Overlap, defaults.overlap),
        dst_gap=gap,
        dst_repeat=repeat,
        start_at_ms=start,
        end_at_ms=end,
    )


def _dst(value: object, field: str) -> tuple[DstGap, DstRepeat]:
    defaults = RecurringOptions()
    if value is None:
        return defaults.dst_gap, defaults.dst_repeat
    obj = _object(value, field)
    _check_keys(obj, DST_FIELDS, f"{field}.")
    return (
        _choice(obj.get("gap"), f"{field}.gap", DstGap, defaults.dst_gap),
        _choice(obj.get("repeat"), f"{field}.repeat", DstRepeat, defaults.dst_repeat),
    )


# --------------------------------------------------------------------------------------------
# Job


def _payload(value: object, field: str, max_payload: int) -> JSON:
    try:
        encoded = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: big ints, non-string keys, too deep, …
        raise _invalid(
            field, "a JSON value (integers within 64 bits, string keys, depth ≤ 255)", value
        ) from None
    if len(encoded) > max_payload:
        raise PayloadTooLarge(
            f"{field}: expected at most {max_payload} bytes of JSON, got {len(encoded)}",
            field=field,
        )
    stack: list[object] = [value]
    while stack:  # NaN and Infinity are not JSON (orjson would quietly write null)
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise _invalid(field, "a JSON value with finite numbers only", item)
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return value


def _retry(value: object, field: str, max_attempts: int) -> RetryPolicy:
    base = RetryPolicy(max_attempts=max_attempts)
    if value is None:
        return base
    obj = _object(value, field)
    _check_keys(obj, RETRY_FIELDS, f"{field}.")
    attempts, initial, maximum = obj.get("max_attempts"), obj.get("initial"), obj.get("max")
    multiplier, jitter = obj.get("multiplier"), obj.get("jitter")
    policy = RetryPolicy(
        max_attempts=base.max_attempts
        if attempts is None
        else _int_in(attempts, f"{field}.max_attempts", 1, MAX_ATTEMPTS),
        initial_ms=base.initial_ms if initial is None else _duration(initial, f"{field}.initial"),
        max_ms=base.max_ms if maximum is None else _duration(maximum, f"{field}.max"),
        multiplier=base.multiplier
        if multiplier is None
        else _number_in(multiplier, f"{field}.multiplier", 1, 10),
        jitter=base.jitter if jitter is None else _bool(jitter, f"{field}.jitter"),
    )
    if policy.max_ms < policy.initial_ms:
        raise _invalid(
            f"{field}.max",
            f"a duration of at least {field}.initial ({format_duration(policy.initial_ms)})",
            maximum if maximum is not None else format_duration(policy.max_ms),
        )
    return policy


def _depends_on(value: object, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > MAX_DEPENDS_ON:
        raise _invalid(field, f"a list of at most {MAX_DEPENDS_ON} job ids", value)
    return _each_once(value, field, "job id")


def _each_once(items: list[Any] | tuple[Any, ...], field: str, what: str) -> tuple[str, ...]:
    """Texts, each at most once (the second of two equal ones is named)."""
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        text = _text(item, f"{field}[{i}]")
        if text in seen:
            raise InvalidArgument(
                f"{field}[{i}]: expected each {what} once; {text!r} is also {field}[{seen[text]}]",
                field=f"{field}[{i}]",
            )
        seen[text] = i
    return tuple(items)


def parse_job_and_options(
    body: object,
    *,
    now_ms: int,
    defaults: Defaults = DEFAULTS,
    field_prefix: str = "",
) -> tuple[JobSpec, RecurringOptions | None]:
    """Like :func:`parse_job`, also returning the recurring options of the schedule."""
    p = field_prefix
    if not isinstance(body, Mapping):
        where = p.rstrip(".") or "job"
        raise InvalidArgument(
            f"{where}: expected a JSON object with at least a task, got {_show(body)}",
            field=p.rstrip(".") or None,
        )
    _check_keys(body, JOB_FIELDS, p)
    task = _task(body.get("task"), f"{p}task")
    name = _opt_text(body.get("name"), f"{p}name")
    namespace = _ident(body.get("namespace"), f"{p}namespace")
    queue = _ident(body.get("queue"), f"{p}queue")
    payload = _payload(body.get("payload"), f"{p}payload", defaults.max_payload)
    schedule, options = parse_schedule(body.get("schedule"), now_ms, f"{p}schedule")
    priority = _choice(body.get("priority"), f"{p}priority", Priority, Priority.NORMAL)
    retry = _retry(body.get("retry"), f"{p}retry", defaults.max_attempts)
    timeout = _opt_duration(body.get("timeout"), f"{p}timeout")
    heartbeat = _opt_duration(
        body.get("heartbeat_timeout"), f"{p}heartbeat_timeout", minimum_ms=1000
    )
    spec = JobSpec(
        task=task,
        name=name,
        namespace=namespace,
        queue=queue,
        payload=payload,
        schedule=schedule,
        priority=priority,
        retry=retry,
        timeout_ms=timeout,
        heartbeat_timeout_ms=defaults.heartbeat_timeout_ms if heartbeat is None else heartbeat,
        depends_on=_depends_on(body.get("depends_on"), f"{p}depends_on"),
        idempotency_key=_opt_text(body.get("idempotency_key"), f"{p}idempotency_key"),
    )
    return spec, options


def parse_job(
    body: object,
    *,
    now_ms: int,
    defaults: Defaults = DEFAULTS,
    field_prefix: str = "",
) -> JobSpec:
    """A ``POST /jobs`` body → a :class:`JobSpec`; raises ``InvalidArgument``/``PayloadTooLarge``.

    ``null`` for an optional field means the default.  ``field_prefix`` (``"jobs[3]."``) is
    put in front of every ``field`` named in an error.
    """
    spec, _ = parse_job_and_options(
        body, now_ms=now_ms, defaults=defaults, field_prefix=field_prefix
    )
    return spec


def parse_batch(
    body: object,
    *,
    now_ms: int,
    defaults: Defaults = DEFAULTS,
    max_jobs: int = 10_000,
) -> list[JobSpec]:
    """A ``POST /jobs/batch`` body ``{"jobs": [...]}`` → its specs; the first problem raises."""
    if not isinstance(body, Mapping):
        raise InvalidArgument(
            f'batch: expected a JSON object like {{"jobs": [...]}}, got {_show(body)}'
        )
    _check_keys(body, ("jobs",), "")
    jobs = body.get("jobs")
    if not isinstance(jobs, list | tuple) or not 1 <= len(jobs) <= max_jobs:
        raise _invalid("jobs", f"a list of 1 to {max_jobs} job objects", jobs)
    specs: list[JobSpec] = []
    keys: dict[tuple[str, str], int] = {}
    for i, item in enumerate(jobs):
        spec = parse_job(item, now_ms=now_ms, defaults=defaults, field_prefix=f"jobs[{i}].")
        if spec.idempotency_key is not None:
            key = (spec.namespace, spec.idempotency_key)
            if key in keys:
                field = f"jobs[{i}].idempotency_key"
                raise InvalidArgument(
                    f"{field}: expected a unique idempotency_key within the batch; "
                    f"jobs[{keys[key]}] has the same one",
                    field=field,
                )
            keys[key] = i
        specs.append(spec)
    return specs


PATCH_FIELDS: Final = ("paused", "schedule", "payload", "priority", "retry", "timeout")


def parse_patch(
    body: object, current: JobSpec, *, now_ms: int, defaults: Defaults = DEFAULTS
) -> tuple[bool | None, JobSpec | None]:
    """A ``PATCH /jobs/{id}`` body → ``(paused or None, the new spec or None)``.

    Only the given fields change; ``retry`` replaces the whole policy (unset keys take their
    defaults), ``timeout: null`` removes the timeout.
    """
    obj = _object(body, "body")
    _check_keys(obj, PATCH_FIELDS, "")
    if not obj:
        raise InvalidArgument(
            f"expected at least one of {', '.join(PATCH_FIELDS)}, got an empty object"
        )
    paused = None if obj.get("paused") is None else _bool(obj["paused"], "paused")
    changes: dict[str, Any] = {}
    if "schedule" in obj:
        changes["schedule"], _ = parse_schedule(obj["schedule"], now_ms, "schedule")
    if "payload" in obj:
        changes["payload"] = _payload(obj["payload"], "payload", defaults.max_payload)
    if obj.get("priority") is not None:
        changes["priority"] = _choice(obj["priority"], "priority", Priority, Priority.NORMAL)
    if obj.get("retry") is not None:
        changes["retry"] = _retry(obj["retry"], "retry", defaults.max_attempts)
    if "timeout" in obj:
        changes["timeout_ms"] = _opt_duration(obj["timeout"], "timeout")
    return paused, (replace(current, **changes) if changes else None)


# --------------------------------------------------------------------------------------------
# POST /dlq/replay and /dlq/drop

DLQ_FILTER_FIELDS: Final = ("namespace", "queue", "task", "since", "error")
DLQ_BULK_FIELDS: Final = (*DLQ_FILTER_FIELDS, "run_ids", "dry_run")


@dataclass(frozen=True, slots=True)
class DlqBulk:
    """What a bulk replay or drop of the dead-letter queue is about: the runs matching
    ``filters`` (``namespace``, ``queue``, ``task``: equal to; ``since``: failed at or after, in
    ms; ``error``: its error contains this, either case), or the runs ``run_ids`` names."""

    dry_run: bool
    filters: Mapping[str, str | int]
    run_ids: tuple[str, ...] | None


def parse_dlq_bulk(body: object, *, max_runs: int) -> DlqBulk:
    """A ``POST /dlq/replay`` or ``/dlq/drop`` body.  ``dry_run`` is required (a bare request
    must not replay or drop the whole queue by mistake); ``run_ids`` (at most ``max_runs``)
    and the filters exclude each other; neither means every run of the queue."""
    obj = _object(body, "body")
    _check_keys(obj, DLQ_BULK_FIELDS, "")
    if obj.get("dry_run") is None:
        raise InvalidArgument(
            "dry_run: required; expected true (say what would be done) or false (do it)",
            field="dry_run",
        )
    dry_run = _bool(obj["dry_run"], "dry_run")
    filters: dict[str, str | int] = {}
    for key in ("namespace", "queue"):
        if obj.get(key) is not None:
            filters[key] = _ident(obj[key], key)
    if obj.get("task") is not None:
        filters["task"] = _task(obj["task"], "task")
    if obj.get("since") is not None:
        filters["since"] = _time(obj["since"], "since")
    if obj.get("error") is not None:
        filters["error"] = _text(obj["error"], "error")
    if obj.get("run_ids") is None:
        return DlqBulk(dry_run, filters, None)
    if filters:
        raise InvalidArgument(
            f"run_ids: expected either run_ids or filters ({', '.join(DLQ_FILTER_FIELDS)}), "
            f"not both; got run_ids and {', '.join(filters)}",
            field="run_ids",
        )
    ids = obj["run_ids"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= max_runs:
        raise _invalid("run_ids", f"a list of 1 to {max_runs:,} run ids", ids)
    return DlqBulk(dry_run, filters, _each_once(ids, "run_ids", "run id"))
