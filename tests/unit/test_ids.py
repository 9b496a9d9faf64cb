"""Identifiers: job ids and request ids sort by creation time and do not collide."""

from __future__ import annotations

import pytest

from schedd import ids
from schedd.ids import new_job_id, new_request_id


def test_request_ids_sort_by_creation_and_are_unique(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cluster keys its table of recent requests by id: ids that grow with time keep the
    # inserts of a commit on the same pages.
    ms = 1_800_000_000_000
    monkeypatch.setattr(ids.time, "time_ns", lambda: ms * 1_000_000 + 999_999)
    first = [new_request_id() for _ in range(2000)]
    ms += 1  # a later millisecond
    later = new_request_id()
    assert len(set(first)) == len(first)
    assert all(rid < later for rid in first)
    assert all(len(rid) == 28 and int(rid, 16) >= 0 for rid in [*first, later])
    assert {rid[:12] for rid in first} == {f"{ms - 1:012x}"} and later[:12] == f"{ms:012x}"


def test_job_ids_sort_by_their_millisecond() -> None:
    ids_ = [new_job_id(ms) for ms in (1_800_000_000_000, 1_800_000_000_001, 1_800_000_060_000)]
    assert ids_ == sorted(ids_) and len(set(ids_)) == 3 and all(len(i) == 26 for i in ids_)
