"""Identifiers: job ids and request ids sort by creation time and do not collide."""

from __future__ import annotations

import time

from schedd.ids import new_job_id, new_request_id


def test_request_ids_sort_by_creation_and_are_unique() -> None:
    # The cluster keys its table of recent requests by id: ids that grow with time keep the
    # inserts of a commit on the same pages.
    first = [new_request_id() for _ in range(2000)]
    time.sleep(0.002)  # a later millisecond
    later = new_request_id()
    assert len(set(first)) == len(first)
    assert all(rid < later for rid in first)
    assert all(len(rid) == 28 and int(rid, 16) >= 0 for rid in first + [later])
    assert int(later[:12], 16) >= time.time_ns() // 1_000_000 - 60_000


def test_job_ids_sort_by_their_millisecond() -> None:
    ids = [new_job_id(ms) for ms in (1_800_000_000_000, 1_800_000_000_001, 1_800_000_060_000)]
    assert ids == sorted(ids) and len(set(ids)) == 3 and all(len(i) == 26 for i in ids)
