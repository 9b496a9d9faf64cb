"""History retention: what the cluster forgets, decided here like every other transition.

Finished runs are kept for the leader's ``[history] retention`` and, per job, only the newest
``[history] max_runs_per_job`` of them.  Both limits come in the log (the ``Purge`` command the
leader sends every few seconds), so every node forgets exactly the same rows:

* **age**: :func:`purge` forgets the finished runs last changed before ``before_ms``, oldest
  first, at most ``limit`` per command (the leader sends another while a purge is full), then
  the finished (done or cancelled) jobs last changed before it that have no run left and no
  dependant: their idempotency keys are forgotten with them;
* **count**: when a run finishes (:func:`trim`), runs of its job beyond the newest ``keep``
  finished ones are forgotten at once, so an every-second job never holds more than ``keep``.

A run in the dead-letter queue is never forgotten (replay or drop it); it counts towards
``keep``.  What a job's view shows as its latest run, and what dependencies are judged on (the
latest finished run), is always kept.
"""

from __future__ import annotations

from schedd.core.model import Run
from schedd.core.state import Ok, Rejected, Result, State
from schedd.errors import Code


def purge(state: State, before_ms: int, keep: int, limit: int) -> Result:
    if not all(type(v) is int for v in (before_ms, keep, limit)) or keep < 1 or limit < 1:
        return Rejected(Code.INVALID_ARGUMENT, "purge: expected integers, keep and limit >= 1")
    state.history_keep = keep
    runs = state.finished_runs_before(before_ms, limit)
    for run in runs:
        state.delete_run(run)
    jobs = state.forgettable_jobs(before_ms, limit)
    for job in jobs:
        state.delete_job(job)
    return Ok([len(runs), len(jobs)])


def trim(state: State, finished: Run) -> None:
    """``finished`` just finished: forget its job's finished runs beyond the newest
    ``state.history_keep`` (never ``finished`` itself, whose outcome is being reported)."""
    for run in state.finished_runs_beyond(finished.job_id, state.history_keep):
        if run.id != finished.id:
            state.delete_run(run)
