"""The rows' bodies: jobs, runs and remembered results as compact orjson objects.

A body holds every field of its record; the columns beside it in the table only index it.
Field names are short and a field at its default is left out, so a field added with a default
reads old rows as they were.  Each body is decoded exactly as it was encoded: ``decode(encode(x))
== x`` for every record the core makes (a property test holds it).  The job spec inside a job is
the versioned wire form of :func:`schedd.core.commands.spec_to_dict`, the same as in commands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from schedd.core.commands import spec_from_dict, spec_to_dict
from schedd.core.model import (
    Attempt,
    AttemptOutcome,
    Job,
    JobSpec,
    JobStatus,
    Refusal,
    Run,
    RunState,
)
from schedd.core.state import Ok, Rejected, Result, reject_code

_dumps = orjson.dumps
_loads = orjson.loads


class CorruptRow(ValueError):
    """A row whose body cannot be decoded: the database was changed outside schedd, or is
    damaged."""


# -- jobs ---------------------------------------------------------------------------------------

#: how a writer gives the encoding of a job's spec it already has (see :func:`spec_json`)
SpecOf = Callable[[Job], Any]


def spec_json(spec: JobSpec) -> orjson.Fragment:
    """A spec's wire form, encoded: what ``job_body`` and ``result_body`` embed as it is.  The
    spec of a job rarely changes while its status and times do, so a writer keeps this beside
    the job and passes it back (``spec_of``) instead of encoding the spec on every change."""
    return orjson.Fragment(_dumps(spec_to_dict(spec)))


def job_body(job: Job, spec_of: SpecOf | None = None) -> bytes:
    return _dumps(_job_dict(job, spec_of))


def _job_dict(job: Job, spec_of: SpecOf | None = None) -> dict[str, Any]:
    spec = spec_to_dict(job.spec) if spec_of is None else spec_of(job)
    out: dict[str, Any] = {
        "s": spec,
        "st": job.status.value,
        "c": job.created_ms,
        "u": job.updated_ms,
    }
    if job.next_run_at_ms is not None:
        out["n"] = job.next_run_at_ms
    if job.last_run_id is not None:
        out["l"] = job.last_run_id
    if job.next_run_id is not None:
        out["x"] = job.next_run_id
    if job.anchor_ms is not None:
        out["a"] = job.anchor_ms
    return out


def job_from_body(job_id: str, body: bytes) -> Job:
    try:
        return _job_from(job_id, _loads(body))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRow(f"job {job_id}: {exc}") from None


def _job_from(job_id: str, d: dict[str, Any]) -> Job:
    return Job(
        job_id,
        spec_from_dict(d["s"]),
        JobStatus(d["st"]),
        d["c"],
        d["u"],
        d.get("n"),
        d.get("l"),
        d.get("x"),
        d.get("a"),
    )


# -- runs ---------------------------------------------------------------------------------------


def _attempt(a: Attempt) -> list[Any]:
    out = [
        a.number,
        a.fence,
        a.worker_id,
        a.leased_ms,
        a.deadline_ms,
        a.ended_ms,
        None if a.outcome is None else a.outcome.value,
        a.error,
    ]
    # later fields, written only when set: an attempt without them is stored as before
    if a.progress is not None or a.progress_ms is not None or a.traceback is not None:
        out += [a.progress, a.progress_ms, a.traceback]
    return out


def _attempt_from(v: list[Any]) -> Attempt:
    number, fence, worker, leased, deadline, ended, outcome, error, *later = v
    progress, progress_ms, traceback = later if later else (None, None, None)
    return Attempt(
        number,
        fence,
        worker,
        leased,
        deadline,
        ended,
        None if outcome is None else AttemptOutcome(outcome),
        error,
        progress,
        progress_ms,
        traceback,
    )


def run_body(run: Run) -> bytes:
    return _dumps(_run_dict(run))


def _run_dict(run: Run) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ns": run.namespace,
        "d": run.due_ms,
        "st": run.state.value,
        "c": run.created_ms,
        "u": run.updated_ms,
    }
    if run.attempts:
        out["at"] = [_attempt(a) for a in run.attempts]
    if run.result is not None:
        out["r"] = run.result
    if run.error is not None:
        out["e"] = run.error
    if run.reason is not None:
        out["why"] = run.reason
    if run.origin != "schedule":
        out["o"] = run.origin
    if run.attempt_base:
        out["b"] = run.attempt_base
    if run.refused:
        out["rf"] = [
            [f.fence, f.worker_id, f.outcome.value, f.at_ms, f.reason] for f in run.refused
        ]
    return out


def run_from_body(job_id: str, scheduled_ms: int, body: bytes) -> Run:
    try:
        return _run_from(job_id, scheduled_ms, _loads(body))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRow(f"run {job_id}@{scheduled_ms}: {exc}") from None


def _run_from(job_id: str, scheduled_ms: int, d: dict[str, Any]) -> Run:
    return Run(
        f"{job_id}@{scheduled_ms}",
        job_id,
        d["ns"],
        scheduled_ms,
        d["d"],
        RunState(d["st"]),
        d["c"],
        d["u"],
        tuple(_attempt_from(a) for a in d.get("at", ())),
        d.get("r"),
        d.get("e"),
        d.get("why"),
        d.get("o", "schedule"),
        d.get("b", 0),
        tuple(_refusal_from(f) for f in d.get("rf", ())),
    )


def _refusal_from(v: list[Any]) -> Refusal:
    fence, worker, outcome, at_ms, reason = v
    return Refusal(fence, worker, AttemptOutcome(outcome), at_ms, reason)


def split_run_id(run_id: str) -> tuple[str, int] | None:
    """``(job id, scheduled ms)`` of a run id ``<job>@<ms>``; None when it is not one."""
    job_id, at, ms = run_id.rpartition("@")
    if not at or not job_id or not ms.isdigit() or not ms.isascii() or str(int(ms)) != ms:
        return None
    return job_id, int(ms)


# -- results (remembered by request id) --------------------------------------------------------
# A result is what apply answered a client command: Ok or Rejected, whose value is built of
# None, booleans, numbers, strings, lists, tuples, jobs, runs and attempts.  Tagged so that it decodes to
# the same Python values (a tuple stays a tuple, a job a Job).


def _value(v: Any, spec_of: SpecOf | None) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, Job):
        return {"J": [v.id, _job_dict(v, spec_of)]}
    if isinstance(v, Run):
        return {"R": [v.job_id, v.scheduled_ms, _run_dict(v)]}
    if isinstance(v, Attempt):
        return {"A": _attempt(v)}
    if isinstance(v, tuple):
        return {"T": [_value(x, spec_of) for x in v]}
    if isinstance(v, list):
        return [_value(x, spec_of) for x in v]
    if isinstance(v, Ok | Rejected):
        return {"X": _result(v, spec_of)}
    raise TypeError(f"cannot keep a {type(v).__name__} in a result")


def _value_from(v: Any) -> Any:
    if isinstance(v, list):
        return [_value_from(x) for x in v]
    if not isinstance(v, dict):
        return v
    ((tag, inner),) = v.items()
    if tag == "J":
        return _job_from(inner[0], inner[1])
    if tag == "R":
        return _run_from(inner[0], inner[1], inner[2])
    if tag == "A":
        return _attempt_from(inner)
    if tag == "T":
        return tuple(_value_from(x) for x in inner)
    if tag == "X":
        return _result_from(inner)
    raise ValueError(f"unknown tag {tag!r}")


def _result(r: Result, spec_of: SpecOf | None) -> Any:
    if isinstance(r, Ok):
        return {"ok": _value(r.value, spec_of)}
    return {"no": [r.code, r.message, r.field]}


def _result_from(d: Any) -> Result:
    if "ok" in d:
        return Ok(_value_from(d["ok"]))
    code, message, field = d["no"]
    return Rejected(reject_code(code), message, field)


def result_body(r: Result, spec_of: SpecOf | None = None) -> bytes:
    return _dumps(_result(r, spec_of))


def result_from_body(rid: str, body: bytes) -> Result:
    try:
        return _result_from(_loads(body))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRow(f"result of request {rid}: {exc}") from None
