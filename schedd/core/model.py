"""The job, run and attempt model.  Pure: frozen dataclasses and ``StrEnum``s for the wire.

All times are integers of milliseconds since the Unix epoch (UTC); all durations are integer
milliseconds.  Conversion to RFC 3339 strings happens at the edges (API, CLI).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

JSON = Any  # a JSON value: dict, list, str, int, float, bool or None


class JobStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DONE = "done"
    CANCELLED = "cancelled"


class RunState(StrEnum):
    SCHEDULED = "scheduled"
    BLOCKED = "blocked"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


TERMINAL_RUN_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.SKIPPED}
)


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class ScheduleKind(StrEnum):
    NOW = "now"
    AT = "at"
    IN = "in"
    EVERY = "every"
    CRON = "cron"


class AttemptOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"  # heartbeats stopped for heartbeat_timeout
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class Misfire(StrEnum):
    """What to do with fire times missed while no leader was scheduling."""

    SKIP = "skip"
    RUN_ONCE = "run_once"
    RUN_ALL = "run_all"  # bounded by catchup_window


class Overlap(StrEnum):
    """What to do when a fire time comes while the previous run is still going."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    CANCEL_OTHER = "cancel_other"


class DstGap(StrEnum):
    """A local fire time that does not exist (clocks jump forward)."""

    SKIP = "skip"
    SHIFT = "shift"  # run at the first instant after the gap


class DstRepeat(StrEnum):
    """A local fire time that happens twice (clocks fall back)."""

    FIRST = "first"
    BOTH = "both"


class JobSort(StrEnum):
    """The orders of a job listing: by when the job was added, by its next fire time (a job
    with none after every time), or by its latest run's scheduled time (a job not yet run
    before every time); ties in the order the jobs were added."""

    CREATED = "created"
    NEXT_FIRE = "next_fire"
    LATEST_RUN = "latest_run"

    @property
    def descending(self) -> bool:
        """Whether the order goes from the largest down unless asked otherwise: newest first,
        next fire soonest first, the latest run newest first."""
        return self is not JobSort.NEXT_FIRE


class Direction(StrEnum):
    ASC = "asc"
    DESC = "desc"


@dataclass(frozen=True, slots=True)
class RecurringOptions:
    """The options of an ``every``/``cron`` schedule."""

    jitter_ms: int = 0
    misfire: Misfire = Misfire.RUN_ONCE
    catchup_window_ms: int | None = None
    overlap: Overlap = Overlap.SKIP
    dst_gap: DstGap = DstGap.SHIFT
    dst_repeat: DstRepeat = DstRepeat.FIRST
    start_at_ms: int | None = None
    end_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_ms: int = 1_000
    max_ms: int = 600_000
    multiplier: float = 2.0
    jitter: bool = True


@dataclass(frozen=True, slots=True)
class Schedule:
    """What the user asked for.  ``at``/``in`` are resolved to ``first_ms`` at submission."""

    kind: ScheduleKind = ScheduleKind.NOW
    at_ms: int | None = None  # kind AT (and IN, once resolved against the submit time)
    in_ms: int | None = None  # kind IN: the delay as given
    every_ms: int | None = None
    cron: str | None = None
    timezone: str = "UTC"
    options: RecurringOptions | None = None  # every/cron only


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job submission (see ``schedd.core.validate``)."""

    task: str
    name: str | None = None
    namespace: str = "default"
    queue: str = "default"
    payload: JSON = None
    schedule: Schedule = field(default_factory=Schedule)
    priority: Priority = Priority.NORMAL
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_ms: int | None = None
    heartbeat_timeout_ms: int = 60_000
    depends_on: tuple[str, ...] = ()
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    spec: JobSpec
    status: JobStatus
    created_ms: int
    updated_ms: int
    next_run_at_ms: int | None = None
    last_run_id: str | None = None
    next_run_id: str | None = None  # the materialised next occurrence (scheduled, not yet fired)
    anchor_ms: int | None = None  # `every` schedules count from here (default: created_ms)


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int  # 1-based
    fence: int
    worker_id: str
    #: when the attempt starts: its lease, or the run's due time if it was leased ahead of it
    #: (``scheduler.dispatch_ahead``: the worker waits for that instant)
    leased_ms: int
    deadline_ms: int | None = None  # leased_ms + timeout, when the job has a timeout
    ended_ms: int | None = None
    outcome: AttemptOutcome | None = None
    error: str | None = None
    #: the latest progress the worker reported (any JSON value; None: none yet), and when it
    #: was recorded: while running (rate-limited by the leader) and with the attempt's end
    progress: JSON = None
    progress_ms: int | None = None
    #: the tail of the traceback of the exception the task raised (a failed attempt)
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A worker's result refused because its fence is not the run's current lease (the worker
    lost its lease, by a missed heartbeat, a timeout or a cancel, and finished anyway)."""

    fence: int
    worker_id: str  # the attempt's worker ("" when no attempt has that fence)
    outcome: AttemptOutcome  # what the worker reported: succeeded or failed
    at_ms: int  # when the refusing entry was applied (the leader's clock)
    reason: str


#: refusals kept per run (the latest)
MAX_REFUSALS = 10


@dataclass(frozen=True, slots=True)
class Run:
    id: str  # "<job_id>@<scheduled unix ms>"
    job_id: str
    namespace: str
    scheduled_ms: int
    due_ms: int  # when it may next be queued: scheduled_ms, or the end of a retry backoff
    state: RunState
    created_ms: int
    updated_ms: int
    attempts: tuple[Attempt, ...] = ()
    result: JSON = None
    error: str | None = None
    reason: str | None = None  # for skipped / cancelled / blocked runs
    origin: str = "schedule"  # schedule | catchup | trigger
    attempt_base: int = 0  # attempts before the last replay from the dead-letter queue
    refused: tuple[Refusal, ...] = ()  # the latest results refused for a stale fence

    @property
    def attempts_used(self) -> int:
        """Attempts counted against max_attempts (since the last replay)."""
        return len(self.attempts) - self.attempt_base

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def fence(self) -> int | None:
        return self.attempts[-1].fence if self.attempts else None


def run_id_for(job_id: str, scheduled_ms: int) -> str:
    return f"{job_id}@{scheduled_ms}"


_T = TypeVar("_T")
_MISSING: Any = object()
_FIELDS: dict[type, tuple[str, ...]] = {}


def evolve(obj: _T, /, **changes: Any) -> _T:
    """``dataclasses.replace`` for the frozen, slotted records here, about twice as fast (it is
    on every run transition that ``apply`` makes).  No ``__post_init__`` or ``init=False`` field
    exists on them; an unknown field name raises ``TypeError`` like ``replace`` does."""
    cls = type(obj)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    new = object.__new__(cls)
    found = 0
    for name in names:
        value = changes.get(name, _MISSING)
        if value is _MISSING:
            value = getattr(obj, name)
        else:
            found += 1
        object.__setattr__(new, name, value)
    if found != len(changes):
        unknown = sorted(set(changes) - set(names))
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
    return new
