"""The leases a worker holds, as a pure book: what each lease, ack and cancel frame does to it.

A lease is held from the arrival of its ``lease`` frame until the server acks its result or
cancels it; while held it is listed in every ``hello.resume`` and ``heartbeat`` (the leader ends
a lease a reconnecting worker does not list, as never delivered).  :class:`LeaseBook` decides
what each frame means (a newer fence replaces an older lease, an older or equal one is a
duplicate, a lease beyond capacity or while draining is refused, an ack or a cancel releases)
and answers with what the worker must do; it runs nothing and sends nothing:
:class:`schedd.worker.client.Worker` starts and cancels the handlers and writes the frames.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from schedd.protocol.messages import (
    MAX_PROGRESS_BYTES,
    Ack,
    Cancel,
    Complete,
    Fail,
    Lease,
    LeaseRef,
    progress_json,
)
from schedd.worker.registry import Context

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Held:
    """One lease held, with its handler's context and, once finished, its result."""

    lease: Lease
    ctx: Context
    task: Any = None  # the handler's asyncio task, while the worker runs it
    outcome: Complete | Fail | None = None  # finished, waiting for the server's ack
    sent: bool = False  # outcome sent on the current connection
    warned: bool = False  # a progress that cannot be sent was logged (once per lease)

    def progress(self) -> Any:
        """The handler's ``ctx.progress`` when it can be reported (:func:`progress_to_send`;
        logged once per lease when it cannot)."""
        value = progress_to_send(self.ctx, warn=not self.warned)
        if value is None and self.ctx.progress is not None:
            self.warned = True
        return value


def progress_to_send(ctx: Context, warn: bool = True) -> Any:
    """``ctx.progress`` when it can be reported: JSON, and at most ``MAX_PROGRESS_BYTES`` as
    JSON (the server keeps no larger one); else None (with a warning, when ``warn``)."""
    value = ctx.progress
    if value is None:
        return None
    text = progress_json(value)
    if text is not None and len(text) <= MAX_PROGRESS_BYTES:
        return value
    if warn:
        why = (
            "is not JSON"
            if text is None
            else f"is {len(text)} bytes as JSON; the limit is {MAX_PROGRESS_BYTES}"
        )
        log.warning("worker.progress_not_sent run_id=%s: ctx.progress %s", ctx.run_id, why)
    return None


@dataclass(frozen=True, slots=True)
class Received:
    """What a ``lease`` frame did: ``held`` is the new lease to run, or None for a duplicate;
    ``replaced`` an older lease of the same run to abandon; ``refused`` why the new lease was
    refused at once (its ``fail`` is its outcome, to send)."""

    held: Held | None
    replaced: Held | None = None
    refused: str | None = None


class Acked(enum.Enum):
    UNKNOWN = "unknown"  # not held (already released): nothing to do
    RUNNING = "running"  # an accepted ack of a lease still running: kept
    REVOKED = "revoked"  # a refused ack of a lease still running: no longer ours, abandon it
    ACCEPTED = "accepted"  # its result was applied: released
    REFUSED = "refused"  # its result was refused (stale fence): released


class LeaseBook:
    """The leases held, by run id (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        return iter(list(self._held.values()))

    def run_ids(self) -> list[str]:
        return list(self._held)

    def holds(self, held: Held) -> bool:
        """Whether ``held`` is still the lease held for its run (not released or replaced)."""
        return self._held.get(held.lease.run_id) is held

    def refs(self) -> tuple[LeaseRef, ...]:
        """Every lease held, with its latest progress when that can be sent (for hello and
        heartbeat: :meth:`Held.progress`)."""
        return tuple(
            LeaseRef(h.lease.run_id, h.lease.fence, h.progress()) for h in self._held.values()
        )

    def beat_period(self, interval: float) -> float:
        """Seconds between heartbeats: the welcome's ``interval``, or less when a lease held
        asks for less (its job's heartbeat timeout is short)."""
        asked = [
            h.lease.heartbeat_interval
            for h in self._held.values()
            if h.lease.heartbeat_interval is not None
        ]
        return max(0.05, min([interval, *asked]))

    def receive(self, lease: Lease, ctx: Context, draining: bool) -> Received:
        """A ``lease`` frame arrived."""
        old = self._held.get(lease.run_id)
        if old is not None:
            if lease.fence <= old.lease.fence:
                return Received(None)
            del self._held[lease.run_id]
        held = Held(lease, ctx)
        self._held[lease.run_id] = held
        if draining or len(self._held) > self.capacity:
            why = (
                "worker is draining"
                if draining
                else f"worker at capacity ({self.capacity} leases held)"
            )
            held.outcome = Fail(lease.run_id, lease.fence, why, retryable=True)
            return Received(held, old, why)
        return Received(held, old)

    def finished(self, held: Held, outcome: Complete | Fail) -> bool:
        """``held``'s handler returned ``outcome``: False when the lease was released or
        replaced meanwhile (the outcome is dropped)."""
        if not self.holds(held):
            return False
        held.outcome = outcome
        return True

    def acked(self, ack: Ack) -> tuple[Acked, Held | None]:
        """An ``ack`` frame arrived; the lease is released unless it is still running and the
        ack accepted it."""
        held = self._held.get(ack.run_id)
        if held is None:
            return Acked.UNKNOWN, None
        if held.outcome is None:
            if ack.accepted:
                return Acked.RUNNING, held
            kind = Acked.REVOKED
        else:
            kind = Acked.ACCEPTED if ack.accepted else Acked.REFUSED
        del self._held[ack.run_id]
        return kind, held

    def cancelled(self, cancel: Cancel) -> Held | None:
        """A ``cancel`` frame arrived: the lease it names, released (None when not held, or
        held with a newer fence than the cancel's)."""
        held = self._held.get(cancel.run_id)
        if held is None or cancel.fence < held.lease.fence:
            return None
        del self._held[cancel.run_id]
        return held

    def clear(self) -> None:
        self._held.clear()
