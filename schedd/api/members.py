"""``/cluster/nodes`` (list, add, remove) and ``/cluster/join``: the membership through the log.

Changes are made by the leader (``schedd.membership``); a follower forwards them to it with the
caller's credentials, and answers with the leader's answer.  Removing the leader itself makes it
hand its leadership over first; the new leader then removes it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from schedd import clock
from schedd.api.ports import MEMBERS, PREFIX, PROXY, RAFT, json_response, peer, read_json
from schedd.config import split_hostport
from schedd.errors import InvalidArgument, SchedError

NODES = f"{PREFIX}/cluster/nodes"


def check_address(raft: object, field: str = "raft") -> str:
    """``raft`` as a Raft address (``host:port``), or :class:`InvalidArgument` naming it."""
    if not isinstance(raft, str) or not raft:
        raise InvalidArgument(
            f"{field}: expected the node's Raft address as host:port (its raft.listen)",
            field=field,
        )
    try:
        host, port = split_hostport(raft)
    except (ValueError, SchedError):
        raise InvalidArgument(
            f"{field}: expected host:port (the node's raft.listen), got {raft!r}", field=field
        ) from None
    if not 1 <= port <= 65535 or not host or host in ("0.0.0.0", "::", "[::]"):
        raise InvalidArgument(
            f"{field}: expected an address the other nodes can reach (host:port, port 1-65535),"
            f" got {raft!r}",
            field=field,
        )
    return raft


#: how long a removed leader waits for the next one to be known before it forwards
HAND_OVER_WAIT_S = 10.0
#: how soon a removed leader asks the next one again while that one is starting
HAND_OVER_RETRY_S = 0.2
RESOLVE_TIMEOUT_S = 5.0


async def _forwarded(
    request: web.Request, method: str, path: str, body: Any = None, wait: float = 0.0
) -> web.Response:
    status, answer = await request.app[PROXY].forward(request, method, path, body, wait)
    return json_response(answer, status=status)


async def _to_next_leader(request: web.Request, path: str) -> web.Response:
    """``DELETE path`` asked of the leader that this node handed over to: until
    :data:`HAND_OVER_WAIT_S`, again while it answers 503 - elected a moment ago, it changes
    nothing until its claim is committed ("just elected and is starting")."""
    deadline = clock.mono() + HAND_OVER_WAIT_S
    while True:
        left = max(0.0, deadline - clock.mono())
        status, answer = await request.app[PROXY].forward(request, "DELETE", path, None, left)
        if status != 503 or clock.mono() + HAND_OVER_RETRY_S > deadline:
            return json_response(answer, status=status)
        await asyncio.sleep(HAND_OVER_RETRY_S)


async def cluster_nodes(request: web.Request) -> web.Response:
    return json_response(request.app[MEMBERS].view())


def _node_body(body: Any) -> tuple[str, str, str]:
    if not isinstance(body, dict) or not body.keys() <= {"raft", "id", "http"}:
        raise InvalidArgument(
            "body: expected an object with raft (the new node's raft.listen, host:port) and "
            "optionally id and http",
            field="body",
        )
    raft, node_id, http = body.get("raft"), body.get("id", ""), body.get("http", "")
    if raft is None:
        raise InvalidArgument(
            "raft: required; expected the new node's Raft address host:port (its raft.listen)",
            field="raft",
        )
    raft = check_address(raft)
    if not isinstance(node_id, str) or len(node_id) > 64:
        raise InvalidArgument("id: expected the new node's node.id (a string)", field="id")
    if not isinstance(http, str) or (http and not http.startswith(("http://", "https://"))):
        raise InvalidArgument(
            "http: expected the new node's API URL (http:// or https://)", field="http"
        )
    return raft, node_id, http


async def _resolvable(raft: str) -> None:
    """400 unless ``raft``'s host resolves (the Raft thread would otherwise wait on a name
    that never does, every time it tries to connect)."""
    host, port = split_hostport(raft)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.getaddrinfo(host, port), RESOLVE_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise InvalidArgument(
            f"raft: cannot resolve {host!r} here ({exc or 'timed out'}): give an address every "
            "node can resolve, or an IP address",
            field="raft",
        ) from None


async def add_node(request: web.Request) -> web.Response:
    body = await read_json(request)
    raft, node_id, http = _node_body(body)
    await _resolvable(raft)
    if not request.app[RAFT].is_leader:
        return await _forwarded(request, "POST", NODES, body)
    await request.app[MEMBERS].add(raft, node_id, http)
    return json_response(request.app[MEMBERS].view(), status=201)


async def remove_node(request: web.Request) -> web.Response:
    ref = request.match_info["node"]
    path = f"{NODES}/{ref}"
    if not request.app[RAFT].is_leader:
        return await _forwarded(request, "DELETE", path)
    done = await request.app[MEMBERS].remove(ref)
    if done is None:  # this node: it handed over, and the new leader removes it
        return await _to_next_leader(request, path)
    return json_response(request.app[MEMBERS].view())


async def join_cluster(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidArgument("body: expected an object (a join request)", field="body")
    await _resolvable(check_address(body.get("raft")))
    if not request.app[RAFT].is_leader:
        return await _forwarded(request, "POST", f"{PREFIX}/cluster/join", body)
    members = await request.app[MEMBERS].join(body, peer(request))
    return json_response({"members": members.to_json()})
