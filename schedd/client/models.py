"""What the client returns: :class:`Job`, :class:`Run` and :class:`Attempt`, typed views of the
API's JSON (``docs/api.md``).  Each keeps the whole answer in ``raw`` for fields not lifted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

FINISHED_STATES = frozenset({"succeeded", "failed", "cancelled", "skipped"})


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int
    fence: int
    worker_id: str
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    error: str | None
    progress: Any = None
    traceback: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Attempt:
        return cls(
            number=int(d.get("attempt") or 0),
            fence=int(d.get("fence") or 0),
            worker_id=str(d.get("worker_id") or ""),
            started_at=_time(d.get("started_at")),
            ended_at=_time(d.get("ended_at")),
            outcome=_str(d.get("outcome")),
            error=_str(d.get("error")),
            progress=d.get("progress"),
            traceback=_str(d.get("traceback")),
        )


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    job_id: str
    state: str
    scheduled_at: datetime | None
    attempts: tuple[Attempt, ...]
    result: Any
    error: str | None
    reason: str | None
    waiting: str | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """Succeeded, failed, cancelled or skipped: it will not change again."""
        return self.state in FINISHED_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Run:
        found = d.get("attempts")
        attempts: list[Any] = found if isinstance(found, list) else []
        return cls(
            id=str(d.get("id")),
            job_id=str(d.get("job_id")),
            state=str(d.get("state")),
            scheduled_at=_time(d.get("scheduled_at")),
            attempts=tuple(Attempt.from_json(a) for a in attempts if isinstance(a, Mapping)),
            result=d.get("result"),
            error=_str(d.get("error")),
            reason=_str(d.get("reason")),
            waiting=_str(d.get("waiting")),
            raw=d,
        )


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    task: str
    name: str | None
    namespace: str
    queue: str
    status: str
    payload: Any
    schedule: Mapping[str, Any] | None
    next_run_at: datetime | None
    latest_run: Run | None
    warnings: tuple[str, ...]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Job:
        latest = d.get("latest_run")
        schedule = d.get("schedule")
        return cls(
            id=str(d.get("id")),
            task=str(d.get("task")),
            name=_str(d.get("name")),
            namespace=str(d.get("namespace") or "default"),
            queue=str(d.get("queue") or "default"),
            status=str(d.get("status")),
            payload=d.get("payload"),
            schedule=schedule if isinstance(schedule, Mapping) else None,
            next_run_at=_time(d.get("next_run_at")),
            latest_run=Run.from_json(latest) if isinstance(latest, Mapping) else None,
            warnings=tuple(str(w) for w in d.get("warnings") or ()),
            raw=d,
        )
