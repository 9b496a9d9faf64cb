"""``GET /cluster`` (the cluster as this node sees it) and the proxy by which a follower asks
the leader's API what only the leader knows (``GET /workers``) or does (draining a worker)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from schedd.api.ports import Raft
from schedd.api.views import ClusterNodeView, ClusterView
from schedd.config import Config
from schedd.errors import Unavailable, from_code


def cluster_view(config: Config, raft: Raft, leader_url: str | None) -> ClusterView:
    status = raft.raft_status  # one consistent view (published by the Raft thread)
    leader_addr = status.leader
    role = status.role
    with raft.read() as st:
        leader_id = st.leader_node if st.leader_term == status.term else None
    http = config.raft_http_map()
    nodes: list[ClusterNodeView] = [
        {
            "raft": config.raft.listen,
            "http": config.advertise_url(),
            "id": config.node.id,
            "role": role,
            "self": True,
            "healthy": True,
        }
    ]
    for peer in status.peers:
        entry: ClusterNodeView = {
            "id": leader_id if peer.addr == leader_addr else None,
            "raft": peer.addr,
            "http": http.get(peer.addr),
            "role": "leader" if peer.addr == leader_addr else "follower",
            "self": False,
            "connected": peer.connected,
            "healthy": peer.connected,
        }
        if role == "leader":
            match = peer.match_index
            entry["match_index"] = match
            entry["lag"] = None if match is None else max(0, status.commit_index - match)
        nodes.append(entry)
    return {
        "node_id": config.node.id,
        "role": role,
        "leader": leader_id or leader_addr,
        "leader_url": leader_url,
        "term": status.term,
        "commit_index": raft.commit_index,
        "applied_index": raft.applied_index,
        "state_index": raft.state_index,
        "has_quorum": raft.has_quorum(),
        "ready": raft.is_ready(),
        "nodes": nodes,
    }


class LeaderProxy:
    """Asks the leader's API, with the caller's credentials, for what only the leader knows."""

    def __init__(
        self, config: Config, leader_url: Callable[[], str | None], ssl: ssl.SSLContext | bool
    ) -> None:
        self.config = config
        self.leader_url = leader_url
        #: the TLS trust for the leader's https API (``http.tls_ca``, else the system's CAs)
        self.ssl = ssl

    async def get(self, request: web.Request, path: str) -> Any:
        return await self._ask(request, "GET", path)

    async def post(self, request: web.Request, path: str) -> Any:
        return await self._ask(request, "POST", path)

    async def _ask(self, request: web.Request, method: str, path: str) -> Any:
        url = self.leader_url()
        if url is None or url == self.config.advertise_url():
            raise Unavailable("no leader known yet", retry_after=1)
        headers = {"Authorization": request.headers.get("Authorization", "")}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
                s.request(method, url + path, headers=headers, ssl=self.ssl) as resp,
            ):
                body = orjson.loads(await resp.read())
                if resp.status != 200:
                    error = body.get("error", {}) if isinstance(body, dict) else {}
                    raise from_code(
                        str(error.get("code", "unavailable")),
                        f"the leader at {url} answered: {error.get('message', resp.status)}",
                    )
                return body
        except aiohttp.ClientConnectorCertificateError as exc:
            raise Unavailable(
                f"cannot reach the leader at {url}: its TLS certificate was "
                f"refused ({exc.certificate_error}); set http.tls_ca on this node "
                f"to the CA that signed the nodes' certificates",
                retry_after=1,
            ) from None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise Unavailable(f"cannot reach the leader at {url}: {exc}", retry_after=1) from None
