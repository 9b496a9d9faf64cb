"""Requests between the nodes of one cluster that carry no token: signed with the Raft secret
(HMAC-SHA256 of their fields, sorted, as JSON), with the sender's clock in ``at``.  A new
node's join (``/cluster/join``), the front doors' moves of concurrency slots between the
shards (``/internal/caps``) and their links to the shards' leaders (``/internal/shard-link``)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any, Final

import orjson

#: how far a sender's clock (a signed request's ``at``) may be from the receiver's
SIGNED_SKEW_MS: Final = 300_000
#: the front doors' requests to the shards' leaders about concurrency caps
CAPS_PATH: Final = "/api/v1/internal/caps"


def proof(secret: bytes | None, fields: Mapping[str, Any]) -> str:
    """The HMAC-SHA256 (hex) of ``fields`` with the Raft secret; "" without one (such a
    cluster takes these requests from its own machine only)."""
    if secret is None:
        return ""
    signed = orjson.dumps(dict(fields), option=orjson.OPT_SORT_KEYS)
    return hmac.new(secret, signed, "sha256").hexdigest()


def caps_proof(secret: bytes | None, body: Mapping[str, Any]) -> str:
    """The proof of a caps request: every field of it but ``proof``."""
    return proof(secret, {k: v for k, v in body.items() if k != "proof"})


#: a node's front door carrying the worker connections of every worker it serves to one
#: shard's leader, on one websocket (a cluster of several shards)
LINK_PATH: Final = "/api/v1/internal/shard-link"
#: on a link's upgrade: ``<at>.<proof>`` (the sender's clock, Unix ms, and the proof of it)
LINK_HEADER: Final = "X-Schedd-Link"
#: the largest message on a link (one loop turn's envelopes: many workers' frames)
MAX_LINK_MESSAGE: Final = 64 << 20


def link_proof(secret: bytes | None, at: int) -> str:
    """The proof of a link's upgrade made at ``at`` (Unix ms)."""
    return proof(secret, {"at": at, "path": LINK_PATH})
