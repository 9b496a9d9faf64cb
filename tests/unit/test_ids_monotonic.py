"""Job and request ids: strictly increasing within a process, random across processes."""

from __future__ import annotations

import threading
from unittest import mock

from schedd import ids
from schedd.ids import Monotonic, is_job_id, new_job_id, new_request_id


def test_ids_of_one_millisecond_count_up_from_one_random_draw() -> None:
    with mock.patch.object(ids.secrets, "randbits", wraps=ids.secrets.randbits) as draws:
        made = [new_job_id(1_700_000_000_000) for _ in range(1000)]
    assert draws.call_count <= 1  # one draw for the millisecond (none if it was drawn before)
    assert all(is_job_id(i) for i in made)
    assert made == sorted(made) and len(set(made)) == 1000


def test_a_clock_that_steps_back_keeps_the_ids_increasing() -> None:
    gen = Monotonic(80)
    a = gen.next(5_000)
    b = gen.next(4_000)  # the wall clock stepped back a second
    c = gen.next(5_001)
    assert a < b < c and b[0] == 5_000


def test_the_last_id_of_a_millisecond_carries_into_the_next() -> None:
    gen = Monotonic(4)
    with mock.patch.object(ids.secrets, "randbits", return_value=14):
        seen = [gen.next(100) for _ in range(4)]
    assert seen[:2] == [(100, 14), (100, 15)]
    assert seen[2] == (101, 14) and seen[3] == (101, 15)
    assert seen == sorted(set(seen))


def test_ids_made_by_many_threads_at_once_are_all_different() -> None:
    out: list[list[str]] = [[] for _ in range(4)]

    def make(k: int) -> None:
        out[k].extend(new_job_id(1_700_000_000_123) for _ in range(2000))

    threads = [threading.Thread(target=make, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for part in out for i in part]
    assert len(set(every)) == len(every) == 8000


def test_request_ids_sort_by_creation_and_never_repeat() -> None:
    made = [new_request_id() for _ in range(5000)]
    assert len(set(made)) == 5000 and made == sorted(made)
    assert all(len(r) == 28 and int(r, 16) >= 0 for r in made)


def test_a_forked_child_does_not_count_on_from_its_parent() -> None:
    import os

    ids._request_ids.next(5_000)  # the parent's sequence, at a millisecond held still
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next pair in the same millisecond, then out at once
        os.write(write, repr(ids._request_ids.next(5_000)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 128).decode()
    os.close(read)
    parent = repr(ids._request_ids.next(5_000))
    assert child != parent  # the same pair if the child had gone on from the parent's last
