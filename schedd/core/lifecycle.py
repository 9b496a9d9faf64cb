"""The run lifecycle as one transition table (h11's ``_state.py`` style).

Every change of a run's state goes through :func:`next_state`; an event that is not allowed in
the current state yields a :class:`BadTransition` naming the state and what would have been
allowed, never an exception escaping into Raft's apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from schedd.core.model import RunState


class Event(StrEnum):
    FIRE = "fire"  # due time reached: scheduled/retrying -> queued
    LEASE = "lease"  # handed to a worker
    SUCCEED = "succeed"
    RETRY = "retry"  # attempt failed or lost, attempts left
    GIVE_UP = "give_up"  # attempt failed or lost, none left (or not retryable)
    CANCEL = "cancel"
    SKIP = "skip"
    BLOCK = "block"  # waiting for dependencies, or buffered behind a running one (overlap)
    UNBLOCK = "unblock"
    REPLAY = "replay"  # dead-lettered run sent back to the queue


TRANSITIONS: dict[tuple[RunState, Event], RunState] = {
    (RunState.SCHEDULED, Event.FIRE): RunState.QUEUED,
    (RunState.RETRYING, Event.FIRE): RunState.QUEUED,
    (RunState.QUEUED, Event.LEASE): RunState.RUNNING,
    (RunState.RUNNING, Event.SUCCEED): RunState.SUCCEEDED,
    (RunState.RUNNING, Event.RETRY): RunState.RETRYING,
    (RunState.RUNNING, Event.GIVE_UP): RunState.FAILED,
    (RunState.SCHEDULED, Event.BLOCK): RunState.BLOCKED,
    (RunState.BLOCKED, Event.UNBLOCK): RunState.QUEUED,
    (RunState.FAILED, Event.REPLAY): RunState.QUEUED,
    **{
        (s, Event.CANCEL): RunState.CANCELLED
        for s in (
            RunState.SCHEDULED,
            RunState.BLOCKED,
            RunState.QUEUED,
            RunState.RUNNING,
            RunState.RETRYING,
        )
    },
    **{
        (s, Event.SKIP): RunState.SKIPPED
        for s in (RunState.SCHEDULED, RunState.BLOCKED, RunState.QUEUED, RunState.RETRYING)
    },
}


@dataclass(frozen=True, slots=True)
class BadTransition:
    state: RunState
    event: Event

    @property
    def message(self) -> str:
        allowed = sorted(e for (s, e) in TRANSITIONS if s == self.state)
        hint = ", ".join(allowed) if allowed else "nothing (the run is finished)"
        return f"cannot {self.event} a run that is {self.state}; allowed in that state: {hint}"


def next_state(state: RunState, event: Event) -> RunState | BadTransition:
    target = TRANSITIONS.get((state, event))
    return BadTransition(state, event) if target is None else target
