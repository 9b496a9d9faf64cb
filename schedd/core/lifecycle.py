"""The run lifecycle as one transition table (h11's ``_state.py`` style).

Every change of a run's state goes through :func:`next_state`; an event that is not allowed in
the current state yields a :class:`BadTransition` naming the state and what would have been
allowed, never an exception escaping into Raft's apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from schedd.core.model import RunState as S


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


TRANSITIONS: dict[tuple[S, Event], S] = {
    (S.SCHEDULED, Event.FIRE): S.QUEUED,
    (S.RETRYING, Event.FIRE): S.QUEUED,
    (S.QUEUED, Event.LEASE): S.RUNNING,
    (S.RUNNING, Event.SUCCEED): S.SUCCEEDED,
    (S.RUNNING, Event.RETRY): S.RETRYING,
    (S.RUNNING, Event.GIVE_UP): S.FAILED,
    (S.SCHEDULED, Event.BLOCK): S.BLOCKED,
    (S.BLOCKED, Event.UNBLOCK): S.QUEUED,
    (S.FAILED, Event.REPLAY): S.QUEUED,
    **{
        (s, Event.CANCEL): S.CANCELLED
        for s in (S.SCHEDULED, S.BLOCKED, S.QUEUED, S.RUNNING, S.RETRYING)
    },
    **{(s, Event.SKIP): S.SKIPPED for s in (S.SCHEDULED, S.BLOCKED, S.QUEUED, S.RETRYING)},
}


@dataclass(frozen=True, slots=True)
class BadTransition:
    state: S
    event: Event

    @property
    def message(self) -> str:
        allowed = sorted(e for (s, e) in TRANSITIONS if s == self.state)
        hint = ", ".join(allowed) if allowed else "nothing (the run is finished)"
        return f"cannot {self.event} a run that is {self.state}; allowed in that state: {hint}"


def next_state(state: S, event: Event) -> S | BadTransition:
    target = TRANSITIONS.get((state, event))
    return BadTransition(state, event) if target is None else target
