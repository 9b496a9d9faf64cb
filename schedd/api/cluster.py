"""``GET /cluster`` (the cluster as this node sees it) and the proxy by which a follower asks
the leader's API what only the leader knows (``GET /workers``) or does (draining a worker)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web

import schedd
from schedd import clock
from schedd.api.ports import Raft
from schedd.api.views import ClusterNodeView, ClusterView
from schedd.config import Config
from schedd.core.durations import format_time
from schedd.errors import Unavailable, from_code
from schedd.protocol.headers import SHARD_HEADER


def _age(since: float | None, now: float) -> float | None:
    """Seconds since a ``clock.mono`` instant, to the millisecond (None: not known)."""
    return None if since is None else round(max(0.0, now - since), 3)


def cluster_view(
    config: Config, raft: Raft, leader_url: str | None, versions: Mapping[str, str | None]
) -> ClusterView:
    status = raft.raft_status  # one consistent view (published by the Raft thread)
    leader_addr = status.leader
    role = status.role
    now = clock.mono()
    with raft.read() as st:
        leader_id = st.leader_node if st.leader_term == status.term else None
        claims = st.leader_claims
    http = config.raft_http_map()
    leading = role == "leader"
    heard = _age(status.leader_heard_at, now)  # a follower: since it heard from its leader
    nodes: list[ClusterNodeView] = [
        {
            "raft": config.raft.listen,
            "http": config.advertise_url(),
            "id": config.node.id,
            "role": role,
            "self": True,
            "healthy": True,
            "version": schedd.__version__,
            "lag": 0 if leading else max(0, raft.commit_index - raft.applied_index),
            "last_contact": 0.0 if leading else heard,
            "voting": raft.voting(),
        }
    ]
    # what each peer said of itself over Raft when it connected (its hello): id, API, version
    hellos = raft.peer_hellos()
    if leader_id is None and leader_addr in hellos:
        leader_id = str(hellos[leader_addr].get("id") or "") or None
    for peer in status.peers:
        is_leader = peer.addr == leader_addr
        hello = hellos.get(peer.addr, {})
        url = http.get(peer.addr) or (str(hello["http"]) if hello.get("http") else None)
        said_id = str(hello.get("id") or "") or None
        said_version = str(hello.get("version") or "") or None
        entry: ClusterNodeView = {
            "id": said_id or (leader_id if is_leader else None),
            "raft": peer.addr,
            "http": url,
            "role": "leader" if is_leader else "learner" if peer.role == "learner" else "follower",
            "self": False,
            "healthy": peer.connected,
            "version": (None if url is None else versions.get(url)) or said_version,
            "lag": 0 if is_leader else None,
            "last_contact": heard if is_leader else None,
            "connected": peer.connected,
        }
        if leading:
            match = peer.match_index
            entry["match_index"] = match
            entry["lag"] = None if match is None else max(0, status.commit_index - match)
            entry["last_contact"] = _age(peer.answered_at, now)
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
        "leaders": [
            {"term": term, "node": node, "index": index, "at": format_time(at_ms)}
            for term, node, index, at_ms in claims
        ],
    }


#: a peer's version is asked again once it is this old (or, not known, this long after asking)
VERSION_TTL_S = 30.0
VERSION_RETRY_S = 5.0
VERSION_TIMEOUT_S = 2.0
ASK_TIMEOUT_S = 3.0  # a follower's read of what only the leader knows
FORWARD_TIMEOUT_S = 15.0
LEADER_POLL_S = 0.1  # a change forwarded to the leader (it commits before it answers)


class LeaderProxy:
    """Asks the leader's API, with the caller's credentials, for what only the leader knows;
    and the other nodes' ``/healthz`` for their versions."""

    def __init__(
        self,
        config: Config,
        leader_url: Callable[[], str | None],
        ssl: ssl.SSLContext | bool,
        shard: int | None = None,
    ) -> None:
        self.config = config
        #: the shard this node's process serves, named to the leader node's front door (a
        #: cluster of several shards), else None
        self.shard = shard
        self.leader_url = leader_url
        #: the TLS trust for the leader's https API (``http.tls_ca``, else the system's CAs)
        self.ssl = ssl
        self._versions: dict[str, tuple[str | None, float]] = {}  # url -> (version, asked at)
        self._asking: set[asyncio.Task[None]] = set()

    def versions(self, urls: Sequence[str]) -> dict[str, str | None]:
        """The version each node last said (``GET /healthz``), never waiting for one: what is
        not known or is stale is asked in the background, one request per node at a time, so
        ``GET /cluster`` stays quick while a node does not answer."""
        now = clock.mono()
        out: dict[str, str | None] = {}
        stale = []
        for url in urls:
            version, asked = self._versions.get(url, (None, -1e9))
            out[url] = version
            ttl = VERSION_TTL_S if version is not None else VERSION_RETRY_S
            if now - asked >= ttl:
                stale.append(url)
        if stale and not self._asking:
            for url in stale:  # (asked once, whatever comes back)
                self._versions[url] = (self._versions.get(url, (None, 0.0))[0], now)
            task = asyncio.create_task(self._ask_versions(stale))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)
        return out

    async def close(self) -> None:
        """Stop asking (the node stops)."""
        for task in list(self._asking):
            task.cancel()
        await asyncio.gather(*self._asking, return_exceptions=True)

    async def _ask_versions(self, urls: list[str]) -> None:
        timeout = aiohttp.ClientTimeout(total=VERSION_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            answers = await asyncio.gather(
                *(self._version_of(s, url) for url in urls), return_exceptions=True
            )
        for url, answer in zip(urls, answers, strict=True):
            version = answer if isinstance(answer, str) else None
            self._versions[url] = (version, clock.mono())

    async def _version_of(self, s: aiohttp.ClientSession, url: str) -> str | None:
        async with s.get(url + "/healthz", ssl=self.ssl) as resp:
            body = orjson.loads(await resp.read())
        version = body.get("version") if isinstance(body, dict) else None
        return version if isinstance(version, str) else None

    async def get(self, request: web.Request, path: str) -> Any:
        return await self._ask(request, "GET", path)

    async def post(self, request: web.Request, path: str) -> Any:
        return await self._ask(request, "POST", path)

    async def forward(
        self, request: web.Request, method: str, path: str, body: Any = None, wait: float = 0.0
    ) -> tuple[int, Any]:
        """The leader's status and answer to ``method path`` with this request's credentials
        and ``body`` (JSON), whatever the status; waits up to ``wait`` seconds for a leader
        other than this node to be known."""
        deadline = clock.mono() + wait
        # The leader becomes known to this node through the Raft thread's view and its claim's
        # apply: nothing here to await, so it is looked at again every LEADER_POLL_S.
        while clock.mono() < deadline and self._leader() is None:  # noqa: ASYNC110
            await asyncio.sleep(LEADER_POLL_S)
        _, status, answer = await self._request(request, method, path, body, FORWARD_TIMEOUT_S)
        return status, answer

    async def _ask(self, request: web.Request, method: str, path: str) -> Any:
        url, status, body = await self._request(request, method, path, None, ASK_TIMEOUT_S)
        if status != 200:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            raise from_code(
                str(error.get("code", "unavailable")),
                f"the leader at {url} answered: {error.get('message', status)}",
            )
        return body

    def _leader(self) -> str | None:
        """The leader's API URL, unless unknown or this node."""
        url = self.leader_url()
        return None if url is None or url == self.config.advertise_url() else url

    async def _request(
        self, request: web.Request, method: str, path: str, body: Any, timeout: float
    ) -> tuple[str, int, Any]:
        """``method path`` of the leader's API with this request's credentials: the leader's
        URL, the status and the decoded answer; :class:`Unavailable` when it cannot be asked."""
        url = self._leader()
        if url is None:
            raise Unavailable("no leader known yet", retry_after=1)
        headers = {"Authorization": request.headers.get("Authorization", "")}
        if self.shard is not None:
            headers[SHARD_HEADER] = str(self.shard)
        data = None if body is None else orjson.dumps(body)
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s,
                s.request(method, url + path, headers=headers, data=data, ssl=self.ssl) as resp,
            ):
                return url, resp.status, orjson.loads(await resp.read())
        except aiohttp.ClientConnectorCertificateError as exc:
            raise Unavailable(
                f"cannot reach the leader at {url}: its TLS certificate was "
                f"refused ({exc.certificate_error}); set http.tls_ca on this node "
                f"to the CA that signed the nodes' certificates",
                retry_after=1,
            ) from None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise Unavailable(f"cannot reach the leader at {url}: {exc}", retry_after=1) from None
