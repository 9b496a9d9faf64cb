"""What the HTTP API and the worker endpoint use of the rest of the node: one narrow, typed port
per service, each kept in the aiohttp application under its own key.

The API is the node's outer layer.  It imports neither the Raft node, the leader nor the
runtime that wires them together: each thing it uses is described here, as a ``Protocol`` that
says exactly what is called (or a concrete class from a lower layer: the state reader, the
config, the tokens), and :func:`schedd.api.app.make_app` stores the object that provides it
under its key.  ``schedd/runtime.py`` builds the :class:`Ports`.

Also here: what every handler module shares about a request (the path prefix, the caller's
token, the JSON response), so the handler modules do not import one another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web

from schedd import auth
from schedd.api.views import Role
from schedd.config import Config
from schedd.core.commands import Command
from schedd.core.events import Pulled
from schedd.core.fairness import TokenBucket
from schedd.core.state import Committed, Result, State
from schedd.errors import InvalidArgument, SchedError
from schedd.leader.workers import WorkerConn
from schedd.metrics import Metrics
from schedd.protocol import messages
from schedd.storage.reader import Reader
from schedd.storage.snapshots import ImageSource


class PeerView(Protocol):
    """Another node as this one sees it (``schedd.raft.node.PeerStatus``)."""

    @property
    def addr(self) -> str: ...

    @property
    def connected(self) -> bool: ...

    @property
    def match_index(self) -> int | None: ...

    @property
    def role(self) -> str:
        """``voter`` or ``learner``."""

    @property
    def answered_at(self) -> float | None:
        """When it last answered this node, the leader (``clock.mono``); None: not known."""


class StatusView(Protocol):
    """This node's Raft state as last published (``schedd.raft.node.RaftStatus``)."""

    @property
    def role(self) -> Role: ...

    @property
    def term(self) -> int: ...

    @property
    def leader(self) -> str | None: ...

    @property
    def commit_index(self) -> int: ...

    @property
    def peers(self) -> Sequence[PeerView]: ...

    @property
    def leader_heard_at(self) -> float | None:
        """When this follower last heard from its leader (``clock.mono``)."""


class Raft(Protocol):
    """This node's Raft replica: its role and indexes as it sees them, a read of the state it
    applied, and the way to commit a command."""

    @property
    def raft_status(self) -> StatusView: ...

    @property
    def commit_index(self) -> int: ...

    @property
    def applied_index(self) -> int: ...

    @property
    def state_index(self) -> int:
        """The last entry the API's reads see."""

    @property
    def state_position(self) -> int:
        """Where the API's reads are in the change feed: ``state_index``, or in a cluster of
        several shards that entry's stamp."""

    def has_quorum(self) -> bool: ...

    def read(self) -> AbstractContextManager[State]:
        """The applied state, under the lock the Raft thread applies under (keep it short)."""

    @property
    def leader_addr(self) -> str | None:
        """The Raft address of the leader this node follows (or is), if it knows one."""

    @property
    def is_leader(self) -> bool: ...

    def is_ready(self) -> bool:
        """Whether this node has applied what the leader had committed when it joined."""

    def leader_reachable(self) -> bool:
        """Whether the leader it names is this node or a peer it is connected to."""

    def voting(self) -> bool:
        """False while this node abstains from elections until caught up with a leader."""

    def peer_hellos(self) -> dict[str, dict[str, Any]]:
        """What each peer said of itself over Raft (its id, API URL and version), by address."""

    async def submit_indexed(self, cmd: Command, timeout: float = 5.0) -> Committed:
        """Commit ``cmd`` through the leader: its result as applied, and the entry's index."""

    async def wait_visible(self, index: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until the API's reads see entry ``index``;
        whether they do."""


class WorkerHub(Protocol):
    """The leader, as the worker endpoint and ``GET /workers`` see it."""

    ready: asyncio.Event  # set once the leader has rebuilt its view and dispatches

    def connect(self, conn: WorkerConn, resume: tuple[messages.LeaseRef, ...]) -> None: ...

    def heartbeat(self, conn: WorkerConn, refs: tuple[messages.LeaseRef, ...]) -> None: ...

    def finish(self, conn: WorkerConn, msg: messages.Complete | messages.Fail) -> None:
        """Commit a worker's result; the ack (or refusal) follows on ``conn``."""

    def disconnect(self, conn: WorkerConn) -> None: ...

    def set_capacity(self, conn: WorkerConn, capacity: int) -> None: ...

    def heard(self, conn: WorkerConn) -> None:
        """A frame came from the worker."""

    def drain(self, worker_id: str) -> WorkerConn | None:
        """Lease the worker nothing more and tell it so (None: it is not connected)."""

    @property
    def workers(self) -> Mapping[str, WorkerConn]:
        """The connected workers, by id."""

    # concurrency caps across shards (schedd.api.caps)
    def caps_view(self) -> dict[str, Any]: ...

    def limit_caps(self, limits: dict[str, int], hold_s: float) -> None: ...

    async def give_caps(self, namespace: str, amount: int, dest: int) -> Result | None: ...

    async def take_caps(self, source: int, seq: int, namespace: str, amount: int) -> Result: ...

    async def caps_delivered(self, dest: int, seq: int) -> Result: ...


class Node(Protocol):
    """The node as a whole: whether it is stopping, its leader (while it leads), and where the
    leader's API is."""

    @property
    def draining(self) -> bool: ...

    @property
    def leader(self) -> WorkerHub | None:
        """This node's leader while it leads (ready or still rebuilding), else None."""

    def leader_url(self) -> str | None:
        """The API address of the leader, if known."""


class EventFeed(Protocol):
    """What this node applied, for ``GET /events`` (``schedd.raft.feed.EventFeed``)."""

    @property
    def closed(self) -> bool:
        """The node stops: every stream ends."""

    @property
    def horizon(self) -> int:
        """Changes of the entries up to this position may be missing here (a position is an
        entry's index, or with several shards its stamp)."""

    def listen(self) -> asyncio.Event:
        """An event set whenever changes arrive (or the feed closes)."""

    def unlisten(self, waiter: asyncio.Event) -> None: ...

    def pull(self, after: int, limit: int) -> Pulled | None:
        """The changes of the entries after position ``after`` (None: older than the
        horizon)."""


class Authenticator(Protocol):
    """Who a request's ``Authorization`` header is (the tokens file may be reloaded meanwhile:
    the answer is from the tokens as they are now)."""

    def authenticate(self, header: str | None) -> auth.Token: ...

    def session(self, token: auth.Token, expires_s: int, read_only: bool) -> str:
        """A dashboard session token for ``token`` (``auth.TokenStore.session``)."""


class LeaderApi(Protocol):
    """The leader's API, asked by a follower (``schedd.api.cluster.LeaderProxy``)."""

    async def get(self, request: web.Request, path: str) -> Any:
        """The leader's answer to ``GET path`` with this request's credentials."""

    async def post(self, request: web.Request, path: str) -> Any:
        """The leader's answer to ``POST path`` (no body) with this request's credentials."""

    async def forward(
        self, request: web.Request, method: str, path: str, body: Any = None, wait: float = 0.0
    ) -> tuple[int, Any]:
        """The leader's status and answer to ``method path`` with ``body``."""

    def versions(self, urls: Sequence[str]) -> dict[str, str | None]:
        """The schedd version of the node at each API URL as last learnt (None: not known
        yet, or it does not answer); stale ones are asked again in the background."""


class StateImages(Protocol):
    """Consistent images of this node's state database (``GET /snapshot``)."""

    def open_image(self) -> ImageSource:
        """Pin a read transaction on the state database and return the image of what it
        holds, paced at ``raft.snapshot_rate``.  Blocks (opening the database, reading ahead):
        call it, and the image's ``read``, in a thread; always ``close`` the image, which lets
        go of the read transaction.  ``SnapshotError`` or ``sqlite3.Error`` when the state
        cannot be read now."""


class Members(Protocol):
    """The cluster's membership and its changes (``schedd.membership.MembershipService``)."""

    def view(self) -> dict[str, Any]:
        """The members with what this node sees of each."""

    async def add(self, raft: str, node_id: str = "", http: str = "") -> Any:
        """Record a learner (this node leads); the new membership."""

    async def remove(self, ref: str) -> Any:
        """Remove a member (this node leads); the new membership, or None when the member is
        this node: it handed its leadership over, and the new leader is to be asked."""

    async def join(self, body: dict[str, Any], remote: str | None) -> Any:
        """A node asks to be added (its request signed with the Raft secret)."""


@dataclass(frozen=True, slots=True)
class Ports:
    """Everything the API is given (:func:`schedd.api.app.make_app`)."""

    config: Config
    raft: Raft
    node: Node
    reader: Reader
    tokens: Authenticator
    rate_limits: Mapping[str, TokenBucket]
    metrics: Metrics
    sockets: set[web.WebSocketResponse]  # open worker websockets (closed first on stop)
    proxy: LeaderApi  # asks the leader's API (GET /workers on a follower)
    events: EventFeed  # the changes this node applied (GET /events)
    images: StateImages  # images of the state database (GET /snapshot)
    members: Members  # the membership and its changes (/cluster/nodes)
    #: the shard this node's Raft group is (a cluster of several shards: its job ids say it)
    shard: int = 0
    #: the Raft secret (raft.secret_file, read at start; None: none), which signs the requests
    #: between nodes that carry no token (schedd.protocol.signed)
    raft_secret: bytes | None = None


CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
RAFT: web.AppKey[Raft] = web.AppKey("raft")
NODE: web.AppKey[Node] = web.AppKey("node")
READER: web.AppKey[Reader] = web.AppKey("reader", Reader)
TOKENS: web.AppKey[Authenticator] = web.AppKey("tokens")
RATE_LIMITS: web.AppKey[Mapping[str, TokenBucket]] = web.AppKey("rate_limits")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
SOCKETS: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("sockets")
PROXY: web.AppKey[LeaderApi] = web.AppKey("proxy")
EVENTS: web.AppKey[EventFeed] = web.AppKey("events")
IMAGES: web.AppKey[StateImages] = web.AppKey("images")
MEMBERS: web.AppKey[Members] = web.AppKey("members")
SHARD: web.AppKey[int] = web.AppKey("shard", int)
RAFT_SECRET: web.AppKey[bytes | None] = web.AppKey("raft_secret")


@dataclass
class Recent:
    """An answer of the leader's kept for a moment (a follower's view of the leader's workers):
    ``at`` (monotonic seconds) and the value."""

    at: float = float("-inf")
    value: Any = None


#: the leader's GET /workers as a follower last read it (a submit and a page of runs on a
#: follower each want it: one request to the leader per second, not one per call)
LEADER_WORKERS: web.AppKey[Recent] = web.AppKey("leader_workers", Recent)
#: the one-time codes that open a dashboard session (``schedctl ui``), this node's
LOGIN_CODES: web.AppKey[auth.LoginCodes] = web.AppKey("login_codes", auth.LoginCodes)


def install(app: web.Application, ports: Ports) -> None:
    app[CONFIG] = ports.config
    app[RAFT] = ports.raft
    app[NODE] = ports.node
    app[READER] = ports.reader
    app[TOKENS] = ports.tokens
    app[RATE_LIMITS] = ports.rate_limits
    app[METRICS] = ports.metrics
    app[SOCKETS] = ports.sockets
    app[PROXY] = ports.proxy
    app[EVENTS] = ports.events
    app[IMAGES] = ports.images
    app[MEMBERS] = ports.members
    app[SHARD] = ports.shard
    app[RAFT_SECRET] = ports.raft_secret
    app[LEADER_WORKERS] = Recent()
    app[LOGIN_CODES] = auth.LoginCodes()


# -- what every handler shares ----------------------------------------------------------------
PREFIX = "/api/v1"
TOKEN: web.RequestKey[auth.Token] = web.RequestKey("token", auth.Token)


def require(request: web.Request, action: str) -> None:
    """403 unless the caller's token may do ``action``."""
    auth.require(request[TOKEN], action)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(err: SchedError) -> web.Response:
    headers = None
    if err.retry_after is not None:
        headers = {"Retry-After": str(max(1, round(err.retry_after)))}
    return json_response(err.to_dict(), err.http_status, headers)


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise InvalidArgument("expected a JSON body, got an empty request")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc}") from None


def peer(request: web.Request) -> str | None:
    """The address the request comes from: in a cluster of several shards, as the node's
    front door saw it (it always sets ``X-Forwarded-For``; this process's socket, which only
    the front door reaches, has no peer address of its own); else the connection's."""
    if request.app[CONFIG].cluster.shards > 1:
        return request.headers.get("X-Forwarded-For") or request.remote
    return request.remote
