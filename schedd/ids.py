"""Identifier generation (outside the pure core: it uses randomness)."""

from __future__ import annotations

import secrets
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


def new_job_id(now_ms: int) -> str:
    """A 26-character ULID: 48 bits of milliseconds then 80 random bits; sorts by creation."""
    value = (now_ms & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    out = []
    for _ in range(JOB_ID_LENGTH):
        out.append(CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_request_id() -> str:
    """A request id that sorts by creation: 12 hex digits of milliseconds then 64 random bits.

    The cluster keeps the ids of recent requests in a table keyed by id: ids that grow with
    time land on the same few pages of it, where random ones would each dirty a page of their
    own in every commit."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}"
