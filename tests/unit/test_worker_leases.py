"""The worker's lease book, frame by frame (no socket, no handler: what each frame decides)."""

from __future__ import annotations

from typing import Any

import pytest

from schedd.protocol.messages import (
    MAX_PROGRESS_BYTES,
    Ack,
    Cancel,
    Complete,
    Fail,
    Lease,
    LeaseRef,
)
from schedd.worker.leases import Acked, LeaseBook
from schedd.worker.registry import Context


def lease(run_id: str = "J1@1", fence: int = 10, **kw: Any) -> Lease:
    return Lease(run_id, "J1", 1, fence, "t", None, "2027-01-15T09:00:00Z", **kw)


def ctx(lz: Lease) -> Context:
    return Context(lz.run_id, lz.job_id, lz.attempt, lz.fence, lz.task, lz.scheduled_at)


def take(book: LeaseBook, lz: Lease, draining: bool = False) -> Any:
    return book.receive(lz, ctx(lz), draining)


def test_a_newer_fence_replaces_the_lease_an_older_or_equal_one_is_a_duplicate() -> None:
    book = LeaseBook(capacity=2)
    first = take(book, lease(fence=10)).held
    assert take(book, lease(fence=10)).held is None
    assert take(book, lease(fence=9)).held is None
    got = take(book, lease(fence=11))
    assert got.replaced is first and got.held is not None
    assert book.refs() == (LeaseRef("J1@1", 11),)
    assert not book.holds(first) and book.holds(got.held)


def test_a_lease_beyond_capacity_is_refused_but_held_until_its_refusal_is_acked() -> None:
    book = LeaseBook(capacity=1)
    take(book, lease("A"))
    got = take(book, lease("B"))
    assert got.refused == "worker at capacity (1 leases held)"
    assert got.held.outcome == Fail("B", 10, got.refused, retryable=True)
    assert [r.run_id for r in book.refs()] == ["A", "B"]  # listed in hello and heartbeats
    assert book.acked(Ack("B", True)) == (Acked.ACCEPTED, got.held)
    assert [r.run_id for r in book.refs()] == ["A"]


def test_a_draining_worker_refuses_every_new_lease() -> None:
    got = take(LeaseBook(capacity=8), lease(), draining=True)
    assert got.refused == "worker is draining" and isinstance(got.held.outcome, Fail)


def test_acks_keep_a_running_lease_revoke_it_or_release_a_finished_one() -> None:
    book = LeaseBook(capacity=4)
    running = take(book, lease("A")).held
    assert book.acked(Ack("A", True)) == (Acked.RUNNING, running)
    assert book.holds(running)
    assert book.acked(Ack("A", False, "stale fence")) == (Acked.REVOKED, running)
    assert not book.holds(running)
    done = take(book, lease("B")).held
    assert book.finished(done, Complete("B", 10))
    assert book.acked(Ack("B", False, "stale")) == (Acked.REFUSED, done)
    assert book.acked(Ack("B", True)) == (Acked.UNKNOWN, None)
    assert len(book) == 0


def test_a_cancel_for_an_older_fence_is_ignored() -> None:
    book = LeaseBook(capacity=4)
    held = take(book, lease(fence=10)).held
    assert book.cancelled(Cancel("J1@1", 9)) is None and book.holds(held)
    assert book.cancelled(Cancel("J1@1", 10)) is held and len(book) == 0
    assert book.cancelled(Cancel("J1@1", 10)) is None


def test_an_outcome_for_a_lease_released_meanwhile_is_dropped() -> None:
    book = LeaseBook(capacity=4)
    held = take(book, lease()).held
    book.cancelled(Cancel("J1@1", 10))
    assert not book.finished(held, Complete("J1@1", 10))
    assert held.outcome is None


def test_heartbeats_carry_json_progress_only_and_come_as_often_as_a_lease_asks() -> None:
    book = LeaseBook(capacity=4)
    a = take(book, lease("A")).held
    b = take(book, lease("B", heartbeat_interval=0.5)).held
    a.ctx.progress = {"done": 3}
    b.ctx.progress = object()  # not JSON: sent without it
    assert book.refs() == (LeaseRef("A", 10, {"done": 3}), LeaseRef("B", 10))
    assert book.beat_period(5.0) == 0.5
    assert book.beat_period(0.01) == 0.05  # never more often than 20 a second


def test_a_progress_too_large_for_the_server_is_not_sent_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = LeaseBook(capacity=1)
    a = take(book, lease("A")).held
    a.ctx.progress = "x" * MAX_PROGRESS_BYTES  # with its quotes, 2 bytes too many
    assert book.refs() == book.refs() == (LeaseRef("A", 10),)
    [warning] = [r.getMessage() for r in caplog.records if "progress_not_sent" in r.getMessage()]
    assert f"the limit is {MAX_PROGRESS_BYTES}" in warning
    a.ctx.progress = "x" * (MAX_PROGRESS_BYTES - 2)
    assert book.refs() == (LeaseRef("A", 10, a.ctx.progress),)
