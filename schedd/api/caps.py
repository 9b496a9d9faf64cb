"""``POST /internal/caps``: the front doors of a cluster of several shards moving the slots of
the namespaces' concurrency caps between the shards' leaders (:mod:`schedd.core.allowances`).

No token: the request is signed with the Raft secret (as a join is), and a cluster without one
answers only its own machine.  A shard process that does not lead asks its leader.  Ops:

* ``view``: each capped namespace's allowance, runs in flight and runs waiting, and the
  transfers given and not yet known to be credited (``outbox``);
* ``limit`` ``{limits: {ns: n}, hold_s}``: lease no more than that for a while;
* ``give`` ``{namespace, amount, dest}``: give unused slots: ``{seq, amount}`` (amount 0:
  none free);
* ``take`` ``{source, seq, namespace, amount}``: credit a transfer: ``{credited}``;
* ``delivered`` ``{dest, seq}``: the transfers to ``dest`` up to ``seq`` are credited there.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from aiohttp import web

from schedd import clock, net
from schedd.api.ports import NODE, PROXY, RAFT_SECRET, json_response, peer, read_json
from schedd.core.state import Ok
from schedd.errors import InvalidArgument, PermissionDenied, Unavailable, from_code
from schedd.protocol.signed import CAPS_PATH, SIGNED_SKEW_MS, caps_proof

HOLD_MAX_S = 30.0  # the longest a soft limit holds without being said again
OPS = ("view", "limit", "give", "take", "delivered")


def _int(body: dict[str, Any], key: str, low: int = 0) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidArgument(f"{key}: expected an integer >= {low}", field=key)
    return value


def _namespace(body: dict[str, Any]) -> str:
    ns = body.get("namespace")
    if not isinstance(ns, str) or not ns:
        raise InvalidArgument("namespace: expected a namespace name", field="namespace")
    return ns


def check_signed(
    request: web.Request,
    at: object,
    proof: object,
    proof_of: Callable[[bytes | None], str],
    field: str,
) -> None:
    """Refuse a request between nodes (no token) unless its ``proof`` is ``proof_of`` the Raft
    secret and its ``at`` (the sender's clock, Unix ms, named ``field``) is within
    ``SIGNED_SKEW_MS`` of this node's; a cluster without a secret takes them from its own
    machine only."""
    if not isinstance(at, int) or abs(clock.wall_ms() - at) > SIGNED_SKEW_MS:
        raise InvalidArgument(
            f"{field}: expected the caller's clock (Unix ms) within 5 minutes of this node's",
            field=field,
        )
    secret = request.app[RAFT_SECRET]
    if not isinstance(proof, str) or not hmac.compare_digest(proof, proof_of(secret)):
        raise PermissionDenied("the request is not signed with this cluster's Raft secret")
    if secret is None and not net.is_loopback(peer(request) or ""):
        raise PermissionDenied("this cluster has no raft.secret_file: only this machine may ask")


async def shard_caps(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict) or body.get("op") not in OPS:
        raise InvalidArgument(f"op: expected one of {', '.join(OPS)}", field="op")
    check_signed(
        request, body.get("at"), body.get("proof"), lambda secret: caps_proof(secret, body), "at"
    )
    leader = request.app[NODE].leader
    if leader is None or not leader.ready.is_set():  # the leader's node answers
        status, answer = await request.app[PROXY].forward(request, "POST", CAPS_PATH, body)
        return json_response(answer, status=status)
    op = body["op"]
    if op == "view":
        return json_response(leader.caps_view())
    if op == "limit":
        limits = body.get("limits")
        hold = body.get("hold_s")
        if not isinstance(limits, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in limits.items()
        ):
            raise InvalidArgument("limits: expected {namespace: integer >= 0}", field="limits")
        if not isinstance(hold, int | float) or not 0 < hold <= HOLD_MAX_S:
            raise InvalidArgument(f"hold_s: expected 0 to {HOLD_MAX_S:g} seconds", field="hold_s")
        leader.limit_caps(limits, float(hold))
        return json_response({})
    if op == "give":
        res = await leader.give_caps(_namespace(body), _int(body, "amount", 1), _int(body, "dest"))
        value = _value(res)
        return json_response({"seq": value[0], "amount": value[1]})
    if op == "take":
        res = await leader.take_caps(
            _int(body, "source"), _int(body, "seq", 1), _namespace(body), _int(body, "amount", 1)
        )
        return json_response({"credited": bool(_value(res))})
    res = await leader.caps_delivered(_int(body, "dest"), _int(body, "seq", 1))
    _value(res)
    return json_response({})


def _value(res: Any) -> Any:
    if isinstance(res, Ok):
        return res.value
    if res is None:
        raise Unavailable("not committed (the shard's leader may have changed)", retry_after=1)
    raise from_code(str(res.code), res.message)
