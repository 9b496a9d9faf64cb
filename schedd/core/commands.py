"""Replicated commands and their versioned codec.

A Raft entry is one orjson object ``{"v": 1, "c": [cmd, ...]}``: many commands in one entry.
Each command is an object with a tag ``t``, a request id ``rid`` (deduplicated by ``apply``)
and the time ``now`` (Unix ms) stamped by the node that created it: ``apply`` never reads a
clock.  Commands issued by the leader also carry ``lf``, the leader fence (the log index of the
leader's claim for its term); ``apply`` rejects them when a newer leader has claimed since.

Decoding never raises: a malformed command decodes to :class:`Undecodable`, which ``apply``
rejects as a value.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Final, TypeVar

import orjson

from schedd.core.model import (
    AttemptOutcome,
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

CODEC_VERSION = 1


@dataclass(frozen=True, slots=True)
class Claim:
    """A new leader claims its term; the entry's index becomes the leader fence."""

    rid: str
    now: int
    node: str
    term: int
    http: str = ""


@dataclass(frozen=True, slots=True)
class Submit:
    """Create jobs (all or nothing).  Ids are chosen by the submitting node."""

    rid: str
    now: int
    jobs: tuple[tuple[str, JobSpec], ...]


@dataclass(frozen=True, slots=True)
class CancelJob:
    rid: str
    now: int
    job_id: str


@dataclass(frozen=True, slots=True)
class UpdateJob:
    """Pause/resume and/or replace the spec (already merged and validated by the API node)."""

    rid: str
    now: int
    job_id: str
    paused: bool | None = None
    spec: JobSpec | None = None


@dataclass(frozen=True, slots=True)
class Trigger:
    """Run a job now, respecting its overlap policy or overriding it."""

    rid: str
    now: int
    job_id: str
    override: bool = False


@dataclass(frozen=True, slots=True)
class CancelRun:
    rid: str
    now: int
    run_id: str


@dataclass(frozen=True, slots=True)
class Replay:
    """A dead-lettered run goes back to the queue with a fresh set of attempts."""

    rid: str
    now: int
    run_id: str


@dataclass(frozen=True, slots=True)
class DropDead:
    """Remove a run from the dead-letter queue (it stays failed in the history)."""

    rid: str
    now: int
    run_id: str


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """Replay or drop (``action``) the runs of ``run_ids`` that are in the dead-letter queue,
    all in one entry.  The node that took the request resolved its filter to these ids: what
    is committed is the list, so every node acts on the same runs."""

    rid: str
    now: int
    action: str  # replay | drop
    run_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Heal:
    """Re-materialise the next occurrence of a recurring job that has none (leader)."""

    rid: str
    now: int
    lf: int
    job_id: str


@dataclass(frozen=True, slots=True)
class Fire:
    """Due runs become queued."""

    rid: str
    now: int
    lf: int
    run_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LeaseRuns:
    """Queued runs are leased to workers; each lease's fence is this entry's index."""

    rid: str
    now: int
    lf: int
    grants: tuple[tuple[str, str], ...]  # (run_id, worker_id)


@dataclass(frozen=True, slots=True)
class CompleteRun:
    rid: str
    now: int
    lf: int
    run_id: str
    fence: int
    result: Any = None
    progress: Any = None  # the worker's last progress, recorded with the end (None: keep)


@dataclass(frozen=True, slots=True)
class FailRun:
    """An attempt failed (``outcome`` failed), was lost, or timed out.

    ``rand`` in [0, 1) is drawn by the leader for the backoff jitter.
    """

    rid: str
    now: int
    lf: int
    run_id: str
    fence: int
    error: str
    retryable: bool = True
    outcome: AttemptOutcome = AttemptOutcome.FAILED
    rand: float = 0.5
    traceback: str | None = None  # the tail of the task's traceback (bounded by the leader)
    progress: Any = None  # the worker's last progress, recorded with the end (None: keep)


@dataclass(frozen=True, slots=True)
class Progress:
    """The latest progress workers reported for running attempts: ``(run_id, fence, value)``
    each.  The leader sends it only for a changed value, at most once per lease per
    ``schedd.leader.progress.PROGRESS_PERIOD_S``, many leases in one command."""

    rid: str
    now: int
    lf: int
    updates: tuple[tuple[str, int, Any], ...]


@dataclass(frozen=True, slots=True)
class Purge:
    """Forget old history (leader, see :mod:`schedd.core.history`): finished runs last changed
    before ``before_ms``, then finished jobs left without runs, at most ``limit`` of each; and
    from now on keep at most ``keep`` finished runs per job."""

    rid: str
    now: int
    lf: int
    before_ms: int
    keep: int
    limit: int


@dataclass(frozen=True, slots=True)
class Barrier:
    """No effect; committing it proves every earlier entry is applied here."""

    rid: str
    now: int


@dataclass(frozen=True, slots=True)
class Members:
    """A membership change (``op``: add, promote, remove, force) of ``node``, computed by the
    leader from the membership at log index ``base``: ``members`` is the whole new one
    (:meth:`schedd.core.members.Membership.to_json`).  Rejected unless the membership is
    still the one at ``base`` (changes go one at a time)."""

    rid: str
    now: int
    lf: int
    base: int
    op: str
    node: str
    members: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CapsGive:
    """Shard ``dest`` is given ``amount`` of this shard's slots of ``namespace``'s concurrency
    cap (:mod:`schedd.core.allowances`); the entry's index is the transfer's seq."""

    rid: str
    now: int
    lf: int
    namespace: str
    amount: int
    dest: int


@dataclass(frozen=True, slots=True)
class CapsTake:
    """Credit the transfer ``seq`` of ``amount`` slots of ``namespace`` from shard
    ``source``, unless it was credited before."""

    rid: str
    now: int
    lf: int
    source: int
    seq: int
    namespace: str
    amount: int


@dataclass(frozen=True, slots=True)
class CapsDelivered:
    """The transfers to shard ``dest`` up to ``seq`` are credited there: out of the outbox."""

    rid: str
    now: int
    lf: int
    dest: int
    seq: int


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A command (or a whole entry) that does not decode; ``reason`` says why, for the
    rejection that ``apply`` returns in its place."""

    reason: str


Command = (
    Claim
    | Submit
    | CancelJob
    | UpdateJob
    | Trigger
    | CancelRun
    | Replay
    | DropDead
    | DeadLetters
    | Heal
    | Fire
    | LeaseRuns
    | CompleteRun
    | FailRun
    | Progress
    | Purge
    | Barrier
    | Members
    | CapsGive
    | CapsTake
    | CapsDelivered
)

_TAGS: dict[type[Any], str] = {
    Claim: "claim",
    Submit: "submit",
    CancelJob: "cancel_job",
    UpdateJob: "update_job",
    Trigger: "trigger",
    CancelRun: "cancel_run",
    Replay: "replay",
    DropDead: "drop_dead",
    DeadLetters: "dead_letters",
    Heal: "heal",
    Fire: "fire",
    LeaseRuns: "lease",
    CompleteRun: "complete",
    FailRun: "fail",
    Progress: "progress",
    Purge: "purge",
    Barrier: "barrier",
    Members: "members",
    CapsGive: "caps_give",
    CapsTake: "caps_take",
    CapsDelivered: "caps_delivered",
}
_BY_TAG = {tag: cls for cls, tag in _TAGS.items()}
#: fields added after version 1 of the codec: left out of an entry when None (their default),
#: so an entry that does not use them is written exactly as before
_LATER_FIELDS = frozenset({"traceback", "progress"})


def _to_wire(cmd: Command) -> dict[str, Any]:
    out: dict[str, Any] = {"t": _TAGS[type(cmd)]}
    for name in cmd.__dataclass_fields__:
        value = getattr(cmd, name)
        if value is None and name in _LATER_FIELDS:
            continue
        if name == "jobs":
            value = [[job_id, spec_to_dict(spec)] for job_id, spec in value]
        elif name == "spec" and value is not None:
            value = spec_to_dict(value)
        out[name] = value
    return out


def _from_wire(obj: Any) -> Command | Undecodable:
    if not isinstance(obj, dict):
        return Undecodable("a command must be an object")
    tag = obj.get("t")
    cls = _BY_TAG.get(tag) if isinstance(tag, str) else None
    if cls is None:
        return Undecodable(f"unknown command type {obj.get('t')!r}")
    kwargs = {k: v for k, v in obj.items() if k != "t"}
    try:
        if cls is Submit:
            kwargs["jobs"] = tuple((str(j), spec_from_dict(s)) for j, s in kwargs["jobs"])
        elif cls is UpdateJob and kwargs.get("spec") is not None:
            kwargs["spec"] = spec_from_dict(kwargs["spec"])
        elif cls is Fire or cls is DeadLetters:
            kwargs["run_ids"] = tuple(str(r) for r in kwargs["run_ids"])
        elif cls is LeaseRuns:
            kwargs["grants"] = tuple((str(r), str(w)) for r, w in kwargs["grants"])
        elif cls is Progress:
            kwargs["updates"] = tuple((str(r), int(f), v) for r, f, v in kwargs["updates"])
        elif cls is FailRun and "outcome" in kwargs:
            kwargs["outcome"] = AttemptOutcome(kwargs["outcome"])
        cmd: Command = cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 - a decode error is a value, never an escape
        return Undecodable(f"malformed {cls.__name__}: {exc}")
    if not isinstance(cmd.rid, str) or not isinstance(cmd.now, int):
        return Undecodable(f"malformed {cls.__name__}: rid and now are required")
    return cmd


def encode_entry(cmds: list[Command]) -> bytes:
    return orjson.dumps({"v": CODEC_VERSION, "c": [_to_wire(c) for c in cmds]})


def decode_entry(blob: object) -> list[Command | Undecodable]:
    """Decode one Raft entry; never raises."""
    try:
        obj = orjson.loads(blob)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        return [Undecodable("entry is not valid JSON")]
    if (
        not isinstance(obj, dict)
        or obj.get("v") != CODEC_VERSION
        or not isinstance(obj.get("c"), list)
    ):
        version = obj.get("v") if isinstance(obj, dict) else None
        return [Undecodable(f"unsupported entry (version {version!r}, expected {CODEC_VERSION})")]
    return [_from_wire(c) for c in obj["c"]]


# -- the replicated form of a job spec (in Submit and UpdateJob, and in the state database) --


SPEC_VERSION: Final = 1

# (dict key, JobSpec attribute) for the fields stored as they are.
_PLAIN: Final = (
    ("name", "name"),
    ("ns", "namespace"),
    ("queue", "queue"),
    ("payload", "payload"),
    ("timeout_ms", "timeout_ms"),
    ("hb_ms", "heartbeat_timeout_ms"),
    ("idem", "idempotency_key"),
)
_SPEC_KEYS: Final = frozenset(
    {"v", "task", "sched", "prio", "retry", "deps"} | {k for k, _ in _PLAIN}
)
# (dict key, Schedule attribute)
_SCHED: Final = (
    ("kind", "kind"),
    ("at_ms", "at_ms"),
    ("in_ms", "in_ms"),
    ("every_ms", "every_ms"),
    ("cron", "cron"),
    ("tz", "timezone"),
)
# (dict key, RetryPolicy attribute)
_RETRY: Final = (
    ("attempts", "max_attempts"),
    ("initial_ms", "initial_ms"),
    ("max_ms", "max_ms"),
    ("mult", "multiplier"),
    ("jitter", "jitter"),
)
_DEFAULT_SPEC: Final = JobSpec(task="")
_DEFAULT_SCHEDULE: Final = Schedule()
_DEFAULT_RETRY: Final = RetryPolicy()
_DEFAULT_OPTIONS: Final = RecurringOptions()
_OPTION_ENUMS: Final = {
    "misfire": Misfire,
    "overlap": Overlap,
    "dst_gap": DstGap,
    "dst_repeat": DstRepeat,
}


def _options_from(raw: object) -> RecurringOptions:
    if not isinstance(raw, Mapping):
        raise ValueError("job spec: 'opts' must be an object")
    names = {f.name for f in fields(RecurringOptions)}
    unknown = set(raw) - names
    if unknown:
        raise ValueError(f"job spec: unknown keys in 'opts': {sorted(map(str, unknown))}")
    kwargs: dict[str, Any] = {
        k: (_OPTION_ENUMS[k](v) if k in _OPTION_ENUMS else v) for k, v in raw.items()
    }
    return RecurringOptions(**kwargs)


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """The compact plain-dict form of ``spec``: ``{"v": 1, "task": …}`` plus non-defaults.

    Defaults are the model's (not the server's :class:`Defaults`), so the form does not depend
    on the config.  JSON-serialisable; :func:`spec_from_dict` inverts it exactly.
    """
    out: dict[str, Any] = {"v": SPEC_VERSION, "task": spec.task}
    for key, attr in _PLAIN:
        value = getattr(spec, attr)
        if value != getattr(_DEFAULT_SPEC, attr):
            out[key] = value
    if spec.schedule != _DEFAULT_SCHEDULE:
        sched: dict[str, Any] = {}
        for key, attr in _SCHED:
            value = getattr(spec.schedule, attr)
            if value != getattr(_DEFAULT_SCHEDULE, attr):
                sched[key] = value.value if isinstance(value, StrEnum) else value
        opts = spec.schedule.options
        if opts is not None:
            sched["opts"] = {
                f.name: (v.value if isinstance(v, StrEnum) else v)
                for f in fields(opts)
                if (v := getattr(opts, f.name)) != getattr(_DEFAULT_OPTIONS, f.name)
            }
        out["sched"] = sched
    if spec.priority != _DEFAULT_SPEC.priority:
        out["prio"] = spec.priority.value
    if spec.retry != _DEFAULT_RETRY:
        out["retry"] = {
            key: getattr(spec.retry, attr)
            for key, attr in _RETRY
            if getattr(spec.retry, attr) != getattr(_DEFAULT_RETRY, attr)
        }
    if spec.depends_on:
        out["deps"] = list(spec.depends_on)
    return out


def _sub(d: Mapping[str, Any], key: str, keys: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The keyword arguments encoded in ``d[key]`` (a mapping of short keys)."""
    sub = d.get(key, {})
    if not isinstance(sub, Mapping):
        raise ValueError(f"job spec: {key!r} must be an object")
    names = dict(keys)
    unknown = set(sub) - set(names)
    if unknown:
        raise ValueError(f"job spec: unknown keys in {key!r}: {sorted(map(str, unknown))}")
    return {names[k]: v for k, v in sub.items()}


def spec_from_dict(d: Mapping[str, Any]) -> JobSpec:
    """The inverse of :func:`spec_to_dict`.  Raises ``ValueError`` on a malformed dict."""
    if not isinstance(d, Mapping) or d.get("v") != SPEC_VERSION:
        raise ValueError(f"job spec: expected an object with v={SPEC_VERSION}")
    unknown = set(d) - _SPEC_KEYS
    if unknown or not isinstance(d.get("task"), str):
        raise ValueError(f"job spec: missing task or unknown keys {sorted(map(str, unknown))}")
    kwargs: dict[str, Any] = {attr: d[key] for key, attr in _PLAIN if key in d}
    sched = _sub(d, "sched", (*_SCHED, ("opts", "options")))
    if "kind" in sched:
        sched["kind"] = ScheduleKind(sched["kind"])
    if "options" in sched:
        sched["options"] = _options_from(sched["options"])
    retry = _sub(d, "retry", _RETRY)
    if "multiplier" in retry:
        retry["multiplier"] = float(retry["multiplier"])
    deps = d.get("deps", [])
    if not isinstance(deps, list | tuple) or not all(isinstance(x, str) for x in deps):
        raise ValueError("job spec: 'deps' must be a list of strings")
    for name in ("namespace", "queue"):
        if isinstance(kwargs.get(name), str):
            kwargs[name] = sys.intern(kwargs[name])
    if isinstance(sched.get("timezone"), str):
        sched["timezone"] = sys.intern(sched["timezone"])
    schedule = Schedule(**sched)
    return JobSpec(
        task=sys.intern(d["task"]),
        schedule=_shared(schedule) if schedule.at_ms is None else schedule,
        priority=Priority(d.get("prio", Priority.NORMAL.value)),
        retry=_shared(RetryPolicy(**retry)),
        depends_on=tuple(deps),
        **kwargs,
    )


_H = TypeVar("_H", bound=Hashable)
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 4096


def _shared(value: _H) -> _H:
    """One instance of each equal frozen record: the state holds a spec per job, and most jobs
    share their retry policy (and recurring ones their schedule), which then costs nothing per
    job (about 15 % of a pending job's memory)."""
    found = _SHARED.get(value)
    if found is not None:
        return found  # type: ignore[no-any-return]
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    _SHARED[value] = value
    return value
