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

from dataclasses import dataclass
from typing import Any

import orjson

from schedd.core.model import JobSpec
from schedd.core.validate import spec_from_dict, spec_to_dict

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
class Lease:
    """Queued runs are leased to workers; each lease's fence is this entry's index."""

    rid: str
    now: int
    lf: int
    grants: tuple[tuple[str, str], ...]  # (run_id, worker_id)


@dataclass(frozen=True, slots=True)
class Complete:
    rid: str
    now: int
    lf: int
    run_id: str
    fence: int
    result: Any = None


@dataclass(frozen=True, slots=True)
class Fail:
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
    outcome: str = "failed"
    rand: float = 0.5


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
    | Heal
    | Fire
    | Lease
    | Complete
    | Fail
    | Purge
    | Barrier
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
    Heal: "heal",
    Fire: "fire",
    Lease: "lease",
    Complete: "complete",
    Fail: "fail",
    Purge: "purge",
    Barrier: "barrier",
}
_BY_TAG = {tag: cls for cls, tag in _TAGS.items()}


def _to_wire(cmd: Command) -> dict[str, Any]:
    out: dict[str, Any] = {"t": _TAGS[type(cmd)]}
    for name in cmd.__dataclass_fields__:
        value = getattr(cmd, name)
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
        elif cls is Fire:
            kwargs["run_ids"] = tuple(kwargs["run_ids"])
        elif cls is Lease:
            kwargs["grants"] = tuple((str(r), str(w)) for r, w in kwargs["grants"])
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
