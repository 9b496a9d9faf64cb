"""Rendering jobs, runs and attempts as API JSON."""

from __future__ import annotations

import orjson
import pytest

from schedd.api.views import (
    WorkerView,
    attempt_view,
    job_view,
    run_view,
    schedule_view,
    seconds,
    waiting_reason,
)
from schedd.core.model import (
    Attempt,
    AttemptOutcome,
    Job,
    JobSpec,
    JobStatus,
    Priority,
    Refusal,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
    run_id_for,
)

T0 = 1_795_572_000_000  # 2026-11-25T02:00:00.000Z
T0_TEXT = "2026-11-25T02:00:00.000Z"

DEFAULT_OPTIONS = {
    "jitter": 0,
    "misfire": "run_once",
    "catchup_window": None,
    "overlap": "skip",
    "dst": {"gap": "shift", "repeat": "first"},
    "start_at": None,
    "end_at": None,
}


@pytest.mark.parametrize(
    ("ms", "expected"),
    [(0, 0), (1000, 1), (90_000, 90), (1500, 1.5), (1, 0.001), (600_000, 600)],
)
def test_seconds(ms: int, expected: float) -> None:
    value = seconds(ms)
    assert value == expected
    assert isinstance(value, int) == (ms % 1000 == 0)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (Schedule(), None),
        (Schedule(kind=ScheduleKind.AT, at_ms=T0), {"at": T0_TEXT}),
        (
            Schedule(kind=ScheduleKind.IN, in_ms=90_500, at_ms=T0),
            {"in": 90.5, "at": T0_TEXT},
        ),
        (
            Schedule(kind=ScheduleKind.EVERY, every_ms=300_000),
            {"every": 300, "timezone": "UTC", **DEFAULT_OPTIONS},
        ),
        (
            Schedule(kind=ScheduleKind.CRON, cron="0 2 * * *", timezone="Europe/Berlin"),
            {"cron": "0 2 * * *", "timezone": "Europe/Berlin", **DEFAULT_OPTIONS},
        ),
        (
            Schedule(kind=ScheduleKind.CRON, cron="@daily"),
            {"cron": "@daily", "timezone": "UTC", **DEFAULT_OPTIONS},
        ),
    ],
)
def test_schedule_view(schedule: Schedule, expected: object) -> None:
    assert schedule_view(schedule) == expected


def _attempt(**kw: object) -> Attempt:
    base: dict[str, object] = {"number": 1, "fence": 41, "worker_id": "w1", "leased_ms": T0 + 5}
    base.update(kw)
    return Attempt(**base)  # type: ignore[arg-type]


def test_attempt_view_running() -> None:
    assert attempt_view(_attempt()) == {
        "attempt": 1,
        "fence": 41,
        "worker_id": "w1",
        "started_at": "2026-11-25T02:00:00.005Z",
        "deadline": None,
        "ended_at": None,
        "outcome": None,
        "error": None,
        "traceback": None,
        "progress": None,
        "progress_at": None,
    }


def test_attempt_view_shows_the_progress_with_its_time_and_the_traceback() -> None:
    view = attempt_view(
        _attempt(
            progress={"done": 3, "of": 10},
            progress_ms=T0 + 2_000,
            ended_ms=T0 + 3_000,
            outcome=AttemptOutcome.FAILED,
            error="ValueError: bad row",
            traceback='  File "tasks.py", line 9, in load\nValueError: bad row',
        )
    )
    assert view["progress"] == {"done": 3, "of": 10}
    assert view["progress_at"] == "2026-11-25T02:00:02.000Z"
    assert view["traceback"] == '  File "tasks.py", line 9, in load\nValueError: bad row'
    assert view["error"] == "ValueError: bad row"


def test_attempt_view_ended() -> None:
    view = attempt_view(
        _attempt(
            number=2,
            deadline_ms=T0 + 60_000,
            ended_ms=T0 + 61_000,
            outcome=AttemptOutcome.TIMED_OUT,
            error="deadline exceeded",
        )
    )
    assert view["attempt"] == 2
    assert view["deadline"] == "2026-11-25T02:01:00.000Z"
    assert view["ended_at"] == "2026-11-25T02:01:01.000Z"
    assert view["outcome"] == "timed_out"
    assert type(view["outcome"]) is str
    assert view["error"] == "deadline exceeded"


def _run(**kw: object) -> Run:
    base: dict[str, object] = {
        "id": run_id_for("j1", T0),
        "job_id": "j1",
        "namespace": "default",
        "scheduled_ms": T0,
        "due_ms": T0,
        "state": RunState.QUEUED,
        "created_ms": T0 - 1000,
        "updated_ms": T0,
    }
    base.update(kw)
    return Run(**base)  # type: ignore[arg-type]


def test_run_view() -> None:
    run = _run(
        state=RunState.SUCCEEDED,
        attempts=(
            _attempt(ended_ms=T0 + 10, outcome=AttemptOutcome.LOST, error="lost"),
            _attempt(number=2, fence=57, worker_id="w2", leased_ms=T0 + 20),
        ),
        result={"rows": 3},
        updated_ms=T0 + 30,
        refused=(Refusal(41, "w1", AttemptOutcome.SUCCEEDED, T0 + 25, "stale"),),
    )
    view = run_view(run)
    assert view == {
        "id": f"j1@{T0}",
        "job_id": "j1",
        "job_name": None,  # its job was not given
        "task": None,
        "namespace": "default",
        "state": "succeeded",
        "scheduled_at": T0_TEXT,
        "due_at": T0_TEXT,
        "created_at": "2026-11-25T01:59:59.000Z",
        "updated_at": "2026-11-25T02:00:00.030Z",
        "attempts": [attempt_view(a) for a in run.attempts],
        "result": {"rows": 3},
        "error": None,
        "reason": None,
        "waiting": None,
        "refused": [
            {
                "fence": 41,
                "worker_id": "w1",
                "outcome": "succeeded",
                "at": "2026-11-25T02:00:00.025Z",
                "reason": "stale",
            }
        ],
    }
    assert [a["fence"] for a in view["attempts"]] == [41, 57]
    orjson.dumps(view)


def test_run_view_skipped_has_reason() -> None:
    view = run_view(_run(state=RunState.SKIPPED, reason="overlap"))
    assert (view["state"], view["reason"], view["attempts"]) == ("skipped", "overlap", [])


def _job(spec: JobSpec, **kw: object) -> Job:
    base: dict[str, object] = {
        "id": "j1",
        "spec": spec,
        "status": JobStatus.ACTIVE,
        "created_ms": T0 - 1000,
        "updated_ms": T0,
    }
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def test_job_view_minimal() -> None:
    view = job_view(_job(JobSpec(task="t")), None)
    assert view == {
        "id": "j1",
        "task": "t",
        "name": None,
        "namespace": "default",
        "queue": "default",
        "payload": None,
        "schedule": None,
        "priority": "normal",
        "retry": {"max_attempts": 3, "initial": 1, "max": 600, "multiplier": 2.0, "jitter": True},
        "timeout": None,
        "heartbeat_timeout": 60,
        "depends_on": [],
        "idempotency_key": None,
        "status": "active",
        "created_at": "2026-11-25T01:59:59.000Z",
        "updated_at": T0_TEXT,
        "next_run_at": None,
        "latest_run": None,
    }
    assert list(view) == [
        "id",
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
        "status",
        "created_at",
        "updated_at",
        "next_run_at",
        "latest_run",
    ]


def test_job_view_full() -> None:
    spec = JobSpec(
        task="reports.generate",
        name="nightly",
        namespace="team-a",
        queue="gpu",
        payload={"report": "sales"},
        schedule=Schedule(kind=ScheduleKind.CRON, cron="0 2 * * *", timezone="Europe/Berlin"),
        priority=Priority.HIGH,
        retry=RetryPolicy(5, 1500, 3_600_000, 1.5, False),
        timeout_ms=1_800_000,
        heartbeat_timeout_ms=2500,
        depends_on=("a", "b"),
        idempotency_key="k",
    )
    latest = _run(namespace="team-a")
    view = job_view(_job(spec, status=JobStatus.PAUSED, next_run_at_ms=T0 + 86_400_000), latest)
    assert view["schedule"] == {"cron": "0 2 * * *", "timezone": "Europe/Berlin", **DEFAULT_OPTIONS}
    assert view["priority"] == "high"
    assert view["retry"] == {
        "max_attempts": 5,
        "initial": 1.5,
        "max": 3600,
        "multiplier": 1.5,
        "jitter": False,
    }
    assert view["timeout"] == 1800
    assert view["heartbeat_timeout"] == 2.5
    assert view["depends_on"] == ["a", "b"]
    assert view["status"] == "paused"
    assert view["next_run_at"] == "2026-11-26T02:00:00.000Z"
    assert view["latest_run"] == run_view(latest, _job(spec))  # named by its job
    assert view["latest_run"]["task"] == spec.task
    assert type(view["status"]) is str and type(view["priority"]) is str
    orjson.dumps(view)


def _worker(queues: list[str], tasks: list[str] | None) -> WorkerView:
    return {
        "worker_id": "w",
        "queues": queues,
        "tasks": tasks,
        "capacity": 1,
        "leases": 0,
        "connected_at": T0_TEXT,
        "draining": False,
    }


def test_a_queued_run_says_why_no_worker_takes_it() -> None:
    assert waiting_reason("mail", "q", []) == (
        "no worker is connected: task 'mail' on queue 'q' waits for one"
    )
    assert waiting_reason("mail", "q", [_worker(["other"], None)]) == (
        "no connected worker takes queue 'q' (task 'mail' waits for one)"
    )
    assert waiting_reason("mail", "q", [_worker(["q"], ["reports"])]) == (
        "no connected worker serves task 'mail' on queue 'q'"
    )
    assert waiting_reason("mail", "q", [_worker(["q"], ["reports", "mail"])]) is None
    assert waiting_reason("mail", "q", [_worker(["q"], None)]) is None  # any task


def test_a_queued_run_whose_workers_all_drain_says_so() -> None:
    draining = {**_worker(["q"], ["mail"]), "draining": True}
    assert waiting_reason("mail", "q", [draining]) == (
        "every connected worker that serves task 'mail' on queue 'q' is draining "
        "(it takes no new work)"
    )
    other = _worker(["q"], ["reports"])  # not draining, but it does not serve mail
    assert waiting_reason("mail", "q", [draining, other]) == waiting_reason("mail", "q", [draining])
    assert waiting_reason("mail", "q", [draining, _worker(["q"], None)]) is None
