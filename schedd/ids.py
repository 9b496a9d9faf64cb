"""Identifier generation (outside the pure core: it uses randomness).

Job ids and request ids are made *monotonic* within a process, as the ULID specification's
monotonic mode does: the first id of a millisecond draws fresh random bits, and each further id
of the same millisecond is the previous one plus one.  So one process never makes the same id
twice (a wall clock that steps back keeps the last millisecond until it catches up), and two
processes make the same one only by drawing the same 80 (job) or 64 (request) random bits in the
same millisecond.  The cluster therefore does not look a new job id up before storing it, and a
burst of ids costs one ``getrandom`` call per millisecond, not one per id (each such call
releases the GIL)."""

from __future__ import annotations

import os
import secrets
import threading
import time

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # the characters of a job id
JOB_ID_LENGTH = 26
_CHARS = frozenset(CROCKFORD)


def could_be_job_id_prefix(text: str) -> bool:
    """Whether ``text`` (either case) could begin a job id: 1 to 26 Crockford characters."""
    return 1 <= len(text) <= JOB_ID_LENGTH and set(text.upper()) <= _CHARS


def is_job_id(text: str) -> bool:
    """Whether ``text`` (upper case) is a job id: 26 Crockford characters."""
    return len(text) == JOB_ID_LENGTH and set(text) <= _CHARS


_MS_MASK = (1 << 48) - 1


class Monotonic:
    """``(milliseconds, random bits)`` pairs, strictly increasing within this object: a new
    millisecond draws ``bits`` random bits, the same (or an earlier) one adds one to the last
    pair's (carrying into the next millisecond when they are all ones)."""

    __slots__ = ("_bits", "_last_ms", "_last_rand", "_lock", "_max")

    def __init__(self, bits: int) -> None:
        self._bits = bits
        self._max = (1 << bits) - 1
        self._last_ms = -1
        self._last_rand = 0
        self._lock = threading.Lock()

    def next(self, now_ms: int) -> tuple[int, int]:
        now_ms &= _MS_MASK
        with self._lock:
            if now_ms > self._last_ms:
                ms, rand = now_ms, secrets.randbits(self._bits)
            elif self._last_rand < self._max:
                ms, rand = self._last_ms, self._last_rand + 1
            else:  # every id of that millisecond made: borrow the next one
                ms, rand = self._last_ms + 1, secrets.randbits(self._bits)
            self._last_ms, self._last_rand = ms, rand
            return ms, rand


_job_ids = Monotonic(80)
_request_ids = Monotonic(64)


def _forget_in_child() -> None:
    """A forked child starts its own sequences: it would otherwise count up from its parent's
    last id, as the parent does, and make the same ones in the same millisecond."""
    global _job_ids, _request_ids
    _job_ids, _request_ids = Monotonic(80), Monotonic(64)


os.register_at_fork(after_in_child=_forget_in_child)


def new_job_id(now_ms: int) -> str:
    """A 26-character ULID: 48 bits of milliseconds then 80 bits, random for the first id of a
    millisecond and counting up after it (see the module's note); sorts by creation."""
    ms, rand = _job_ids.next(now_ms)
    value = ms << 80 | rand
    out = []
    for _ in range(JOB_ID_LENGTH):
        out.append(CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_request_id() -> str:
    """A request id that sorts by creation: 12 hex digits of milliseconds then 16 of 64 bits,
    random for the first id of a millisecond and counting up after it.

    The cluster keeps the ids of recent requests in a table keyed by id: ids that grow with
    time land on the same few pages of it, where random ones would each dirty a page of their
    own in every commit."""
    ms, rand = _request_ids.next(time.time_ns() // 1_000_000)
    return f"{ms:012x}{rand:016x}"
