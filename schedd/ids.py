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

import hashlib
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


# Shards.  A cluster split into shards (Raft groups over the same nodes) keeps each job in one
# shard for its whole life, and the job's id says which: the character after the id's 48 bits
# of milliseconds (its 11th) is the shard, so a cluster has at most 32 shards, the characters
# of the alphabet, and the rest of an id has 75 bits.  A run's id starts with its job's.  With
# one shard (every cluster so far) ids are made as they always were: the 11th character is
# random and every id is in shard 0.
MAX_SHARDS = len(CROCKFORD)
SHARD_CHAR = 10  # the index in a job id of the character that names its shard
_VALUE = {c: i for i, c in enumerate(CROCKFORD)}
_SHARD_BITS = 5
_REST_BITS = 80 - _SHARD_BITS

_job_ids = Monotonic(80)
_sharded_ids = Monotonic(_REST_BITS)
_request_ids = Monotonic(64)


def _forget_in_child() -> None:
    """A forked child starts its own sequences: it would otherwise count up from its parent's
    last id, as the parent does, and make the same ones in the same millisecond."""
    global _job_ids, _sharded_ids, _request_ids
    _job_ids, _sharded_ids, _request_ids = Monotonic(80), Monotonic(_REST_BITS), Monotonic(64)


os.register_at_fork(after_in_child=_forget_in_child)


def new_job_id(now_ms: int, shard: int | None = None) -> str:
    """A 26-character ULID: 48 bits of milliseconds then 80 bits, random for the first id of a
    millisecond and counting up after it (see the module's note); sorts by creation.

    ``shard`` (a sharded cluster's): the 80 bits are the shard's 5 then 75 of that kind, so
    :func:`shard_of_id` reads the shard back; ids of one shard sort by creation."""
    if shard is None:
        ms, rand = _job_ids.next(now_ms)
    else:
        if not 0 <= shard < MAX_SHARDS:
            raise ValueError(f"shard: expected 0 to {MAX_SHARDS - 1}, got {shard}")
        ms, rest = _sharded_ids.next(now_ms)
        rand = shard << _REST_BITS | rest
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


def shard_of_id(job_or_run_id: str, shards: int) -> int | None:
    """The shard of ``shards`` a job id, a run id (``<job id>@<ms>``) or a prefix of 11
    characters or more of either (either case) lives in; None when it names none of them."""
    if shards == 1:
        return 0
    if len(job_or_run_id) <= SHARD_CHAR:
        return None
    value = _VALUE.get(job_or_run_id[SHARD_CHAR].upper())
    return value if value is not None and value < shards else None


def shard_of_key(key: str, shards: int) -> int:
    """The shard of ``shards`` a text that is no job id is routed by (an idempotency key with
    its namespace, a request id): the same in every process on every node (``hash()`` of a
    text is salted per process; this is not)."""
    if shards == 1:
        return 0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards
