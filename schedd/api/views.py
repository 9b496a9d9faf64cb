"""Model objects rendered as the API's JSON.

Pure.  Times are RFC 3339 in UTC (``format_time``); durations are numbers of seconds (an ``int``
when whole, a ``float`` otherwise); enums are their plain string values.
"""

from __future__ import annotations

from typing import Any

from schedd.core.durations import format_time
from schedd.core.model import (
    Attempt,
    Job,
    RecurringOptions,
    RetryPolicy,
    Run,
    Schedule,
    ScheduleKind,
)

__all__ = ["attempt_view", "job_view", "retry_view", "run_view", "schedule_view", "seconds"]


def seconds(ms: int) -> int | float:
    """Milliseconds → seconds: ``90000`` → ``90``, ``1500`` → ``1.5``."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _opt_seconds(ms: int | None) -> int | float | None:
    return None if ms is None else seconds(ms)


def schedule_view(schedule: Schedule) -> dict[str, Any] | None:
    """The schedule as it was given; ``None`` for run-now.  ``in`` also shows the resolved time."""
    kind = schedule.kind
    if kind is ScheduleKind.AT:
        return {"at": format_time(schedule.at_ms)}
    if kind is ScheduleKind.IN:
        return {"in": _opt_seconds(schedule.in_ms), "at": format_time(schedule.at_ms)}
    if kind is ScheduleKind.EVERY:
        return {
            "every": _opt_seconds(schedule.every_ms),
            "timezone": schedule.timezone,
            **_options_view(schedule),
        }
    if kind is ScheduleKind.CRON:
        return {"cron": schedule.cron, "timezone": schedule.timezone, **_options_view(schedule)}
    return None


def _options_view(schedule: Schedule) -> dict[str, Any]:
    """The recurring options as the API takes them (so a client reads back what it set)."""
    o = schedule.options or RecurringOptions()
    return {
        "jitter": seconds(o.jitter_ms),
        "misfire": o.misfire.value,
        "catchup_window": _opt_seconds(o.catchup_window_ms),
        "overlap": o.overlap.value,
        "dst": {"gap": o.dst_gap.value, "repeat": o.dst_repeat.value},
        "start_at": format_time(o.start_at_ms),
        "end_at": format_time(o.end_at_ms),
    }


def retry_view(retry: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": retry.max_attempts,
        "initial": seconds(retry.initial_ms),
        "max": seconds(retry.max_ms),
        "multiplier": retry.multiplier,
        "jitter": retry.jitter,
    }


def attempt_view(a: Attempt) -> dict[str, Any]:
    return {
        "attempt": a.number,
        "fence": a.fence,
        "worker_id": a.worker_id,
        "started_at": format_time(a.leased_ms),
        "deadline": format_time(a.deadline_ms),
        "ended_at": format_time(a.ended_ms),
        "outcome": None if a.outcome is None else a.outcome.value,
        "error": a.error,
    }


def run_view(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "job_id": run.job_id,
        "namespace": run.namespace,
        "state": run.state.value,
        "scheduled_at": format_time(run.scheduled_ms),
        "due_at": format_time(run.due_ms),
        "created_at": format_time(run.created_ms),
        "updated_at": format_time(run.updated_ms),
        "attempts": [attempt_view(a) for a in run.attempts],
        "result": run.result,
        "error": run.error,
        "reason": run.reason,
    }


def job_view(job: Job, latest: Run | None) -> dict[str, Any]:
    spec = job.spec
    return {
        "id": job.id,
        "task": spec.task,
        "name": spec.name,
        "namespace": spec.namespace,
        "queue": spec.queue,
        "payload": spec.payload,
        "schedule": schedule_view(spec.schedule),
        "priority": spec.priority.value,
        "retry": retry_view(spec.retry),
        "timeout": _opt_seconds(spec.timeout_ms),
        "heartbeat_timeout": seconds(spec.heartbeat_timeout_ms),
        "depends_on": list(spec.depends_on),
        "idempotency_key": spec.idempotency_key,
        "status": job.status.value,
        "created_at": format_time(job.created_ms),
        "updated_at": format_time(job.updated_ms),
        "next_run_at": format_time(job.next_run_at_ms),
        "latest_run": None if latest is None else run_view(latest),
    }
