"""Who may talk to this node's Raft port, and saying so when someone may not.

pysyncobj drops two kinds of connection without a word:

* one whose messages do not authenticate with this node's Raft secret (``raft.secret_file``):
  a node with another secret, a node with none, or something that is not a schedd node;
* one from a node that names itself by an address that is not in ``raft.peers``.

and schedd adds a third: a node that speaks another version of schedd's Raft messages (see
:data:`RAFT_PROTOCOL`), such as one without pre-vote.  Mixing the two would let the older node
depose healthy leaders, so each connection starts with a ``schedd.hello`` naming the protocol
both ways; the node's Raft layer hears of the peer only once its hello matches, nothing is sent
to it before, and a peer that speaks another protocol (or Raft without a hello) is refused.

All three are configuration mistakes that leave a node out of its cluster, so an operator must see
them.  :class:`PeerGuard` (mixed into the node's transport) logs each refusal as one
``raft.peer_refused`` line (at most once a minute per remote host and reason, with the number
of refusals since the last line), counts them by reason for ``/metrics``, and tells a node it
refuses as a non-member why, so that node logs ``raft.not_a_member`` too.  A node that every
peer has refused as a non-member before it ever saw a leader cannot join any cluster with its
configuration: :attr:`PeerGuard.fatal` then says why (and ``on_fatal`` is called with it), and
the daemon exits with that line.

Everything here runs on pysyncobj's tick thread, like the transport it extends.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from schedd import __version__, clock
from schedd.logs import log_event
from schedd.raft.patches import peer_address

log = logging.getLogger(__name__)

#: the first element of the notice a node sends before it closes a non-member's connection
NOT_A_MEMBER = "schedd.not_a_member"
WRONG_SECRET = "wrong_secret"
NOT_IN_PEERS = "not_in_peers"
PROTOCOL_VERSION = "protocol_version"
SHARD_LAYOUT = "shard_layout"

#: The version of the Raft messages this node speaks, in its hello.  1 was pysyncobj's own (no
#: hello); 2 adds pre-vote, leader stickiness and the stale-term notice.  Peers must be equal.
RAFT_PROTOCOL = 2
#: what protocol 2 carries beyond pysyncobj's messages (in the hello, for an operator to read)
FEATURES = ("pre_vote", "leader_stickiness", "stale_term_notice", "membership")
#: the feature a node needs before the cluster records a membership change (an older node would
#: not apply it, and would go on counting votes over its raft.peers)
MEMBERSHIP = "membership"
HELLO = "schedd.hello"
REPORT_EVERY = 60.0  # seconds between two lines for the same remote host and reason

CLOSE_GRACE = 1.0
#: how long a peer that spoke this node's protocol may send Raft messages without a hello (its
#: hellos lost) before that counts as a refusal (seconds)
HELLO_MISSING_GRACE = (
    30.0  # seconds a refused connection stays open after the notice, read and ignored
)

_HANDSHAKE_HINT = (
    "it closed the connection during the encryption handshake: it does not accept this node's "
    "raft.secret_file (another secret, or none); every node must use the same secret file"
)
_UPGRADE_HINT = (
    "every node of a cluster must speak the same protocol; upgrade the older nodes one at a time "
    "(docs/operations.md, Upgrades)"
)
_WRONG_SECRET_HINT = (
    "its messages do not authenticate with this node's raft.secret_file: every node must use "
    "the same secret file (or, on loopback only, none)"
)


class _Authenticating:
    """A connection's Fernet encryptor that reports a message failing authentication.

    pysyncobj calls ``extract_timestamp`` (which checks the token's HMAC) and then ``decrypt``
    on every message it reads, and drops the connection when either raises."""

    def __init__(self, fernet: Any, refused: Callable[[], None]) -> None:
        self._fernet = fernet
        self._refused = refused

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return bytes(self._fernet.encrypt_at_time(data, current_time))

    def extract_timestamp(self, token: bytes) -> int:
        try:
            return int(self._fernet.extract_timestamp(token))
        except Exception:
            self._refused()
            raise

    def decrypt(self, token: bytes) -> bytes:
        try:
            return bytes(self._fernet.decrypt(token))
        except Exception:
            self._refused()
            raise


class PeerGuard:
    """Mixed into pysyncobj's ``TCPTransport`` (before it in the bases)."""

    _selfNode: Any
    _nodes: set[Any]
    _nodeAddrToNode: dict[str, Any]
    _unknownConnections: set[Any]
    _connections: dict[Any, Any]
    _syncObj: Any
    #: the Raft protocol this node speaks (a class attribute so a test can build another)
    protocol: int = RAFT_PROTOCOL

    @staticmethod
    def on_fatal(message: str) -> None:
        """Called once, on the tick thread, when :attr:`fatal` is set (replaced by the node)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._guard_lock = threading.Lock()
        self._reported: dict[tuple[str, str], tuple[float, int]] = {}
        #: refusals since start, by reason (read by /metrics from other threads)
        self.refusals: dict[str, int] = {
            WRONG_SECRET: 0,
            NOT_IN_PEERS: 0,
            PROTOCOL_VERSION: 0,
            SHARD_LAYOUT: 0,
        }
        #: connected peers whose hello has not come yet -> until when it may come
        self._awaiting_hello: dict[Any, float] = {}
        self._verified: set[Any] = set()  # connected peers whose hello matched
        self._spoke_ours: set[str] = set()  # peers whose hello matched at least once
        self._missing_since: dict[str, float] = {}  # such a peer's hellos missing since when
        self._handshakes: dict[Any, float] = {}  # outgoing connection -> when it connected
        self._closing: list[tuple[float, Any]] = []  # refused connections, closed after a grace
        self._refused_by: dict[str, list[str]] = {}  # peer -> the peer list it holds
        self._saw_leader = False
        self._hellos: dict[str, dict[str, Any]] = {}  # peer address -> its latest hello
        self._retired: set[Any] = set()  # removed nodes: told so whenever they connect
        #: why this node cannot join any cluster as configured (set once, never cleared)
        self.fatal: str | None = None
        self.removed = False  # a peer said this node was removed from the cluster
        super().__init__(*args, **kwargs)

    # -- pysyncobj hooks ------------------------------------------------------------------------
    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)  # type: ignore[misc]
        if conn.encryptor is not None:
            remote = peer_address(conn)
            conn.encryptor = _Authenticating(
                conn.encryptor, lambda: self._refused(WRONG_SECRET, remote, _WRONG_SECRET_HINT)
            )

    def addNode(self, node: Any) -> None:
        super().addNode(node)  # type: ignore[misc]
        conn = self._connections.get(node)
        if conn is not None and conn.encryptor is not None:
            address = str(node.address)
            conn.encryptor = _Authenticating(
                conn.encryptor,
                lambda: self._refused(WRONG_SECRET, address, _WRONG_SECRET_HINT, peer=address),
            )

    def _onOutgoingConnected(self, conn: Any) -> None:
        if self._syncObj.encryptor is not None:
            self._handshakes[conn] = clock.mono()
        super()._onOutgoingConnected(conn)  # type: ignore[misc]

    def _onOutgoingMessageReceived(self, conn: Any, message: Any) -> None:
        self._handshakes.pop(conn, None)
        super()._onOutgoingMessageReceived(conn, message)  # type: ignore[misc]

    def _onDisconnected(self, conn: Any) -> None:
        connected_at = self._handshakes.pop(conn, None)
        # Closed by the peer during the encryption handshake (not timed out, which a stopped
        # or unreachable peer does): it could not authenticate this node's first message.
        if connected_at is not None and clock.mono() - connected_at < self._handshake_timeout():
            node = self._connToNode(conn)  # type: ignore[attr-defined]
            address = "?" if node is None else str(node.address)
            self._refused(WRONG_SECRET, address, _HANDSHAKE_HINT, peer=address)
        super()._onDisconnected(conn)  # type: ignore[misc]

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        handshake = self._syncObj.encryptor is not None and not conn.sendRandKey
        if (
            handshake
            or not isinstance(message, str)
            or message == "readonly"
            or message in self._nodeAddrToNode
        ):
            super()._onIncomingMessageReceived(conn, message)  # type: ignore[misc]
            return
        self._refused(
            NOT_IN_PEERS,
            peer_address(conn),
            f"a node that calls itself {message} connected, but raft.peers does not list it: "
            "every node must list the others by the address each sets in raft.listen",
            peer=message,
        )
        # Tell it why, then read and ignore what it sends until the connection is closed a
        # moment later (closing a socket with unread data resets it, and the notice with it).
        conn.send(
            [
                NOT_A_MEMBER,
                str(self._selfNode.address),
                self._peer_list(),
                self.was_removed(message),
                int(self.members_index()),
            ]
        )
        conn.setOnMessageReceivedCallback(_ignore)
        self._closing.append((clock.mono() + CLOSE_GRACE, conn))

    def _onNodeConnected(self, node: Any) -> None:
        if node in self._retired:
            self._tell_removed(node)
            return
        # The hello goes first on the connection (before pysyncobj hears of the peer, so before
        # any Raft message); the connection may still be CONNECTING, which ``send`` refuses.
        self._verified.discard(node)
        self._awaiting_hello[node] = clock.mono() + float(self._syncObj.conf.connectionTimeout)
        conn = self._connections.get(node)
        if conn is not None:
            # Messages are taken from this connection only: a peer that reconnected may still
            # have an older one open here for a while (pysyncobj replaces it without closing
            # it), and what arrives on that one is neither its hello nor anything to act on.
            conn.setOnMessageReceivedCallback(functools.partial(self._from, conn, node))
            conn.send(self._hello())

    def _from(self, conn: Any, node: Any, message: Any) -> None:
        if self._connections.get(node) is conn:
            self._onMessageReceived(node, message)

    def _onNodeDisconnected(self, node: Any) -> None:
        self._awaiting_hello.pop(node, None)
        self._verified.discard(node)
        super()._onNodeDisconnected(node)  # type: ignore[misc]

    def send(self, node: Any, message: Any) -> bool:
        if node not in self._verified:
            return False  # no Raft message to a peer before its hello matched
        return bool(super().send(node, message))  # type: ignore[misc]

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, list) and message and message[0] == NOT_A_MEMBER:
            self._not_a_member(message)
            return
        if node not in self._verified:
            self._before_hello(node, message)
            return
        if not self._saw_leader and self._syncObj._getLeader() is not None:
            self._saw_leader = True
        super()._onMessageReceived(node, message)  # type: ignore[misc]

    def _onTick(self) -> None:
        super()._onTick()  # type: ignore[misc]
        if self._awaiting_hello:
            now = clock.mono()
            for node, until in list(self._awaiting_hello.items()):
                # No hello in time (it was lost, or the peer is stopped): a new connection, and
                # new hellos both ways.  A peer that speaks Raft without a hello says so.
                if until < now:
                    del self._awaiting_hello[node]
                    conn = self._connections.get(node)
                    if conn is not None:
                        conn.disconnect()
        if self._closing:
            now = clock.mono()
            due = [conn for at, conn in self._closing if at <= now]
            self._closing = [(at, conn) for at, conn in self._closing if at > now]
            for conn in due:
                self._unknownConnections.discard(conn)
                conn.disconnect()

    # -- the hello ------------------------------------------------------------------------------
    #: whether this node's log holds data (an entry a leader wrote), said in its hello
    holds_data: Callable[[], bool] = staticmethod(lambda: False)
    #: a peer's hello said whether its log holds data (``peer address, data``)
    on_peer_data: Callable[[str, bool], None] = staticmethod(lambda peer, data: None)

    #: this node's id and API URL, said in its hello (set by the node)
    node_id: str = ""
    http_url: str = ""
    #: the cluster's shards and the one this Raft group is, said in its hello: a peer of
    #: another layout (or a port wired to another shard's group) is refused
    shards: int = 1
    shard: int = 0
    #: whether an address was removed from the cluster (said to it when it is refused)
    was_removed: Callable[[str], bool] = staticmethod(lambda address: False)
    #: the log index of the membership this node goes by (said with a removal, and compared
    #: with one: a notice from a node that knows less than this one is ignored)
    members_index: Callable[[], int] = staticmethod(lambda: 0)
    #: whether this node waits to be added (it asked to join): refusals are expected meanwhile
    joining: Callable[[], bool] = staticmethod(lambda: False)

    def _hello(self) -> dict[str, Any]:
        return {
            "type": HELLO,
            "raft_protocol": self.protocol,
            "features": list(FEATURES),
            "node": str(self._selfNode.address),
            "version": __version__,
            "data": bool(self.holds_data()),
            "id": self.node_id,
            "http": self.http_url,
            "shards": self.shards,
            "shard": self.shard,
            # how this node names its peers: the leader records no membership that names one
            # of them otherwise (a proxy or NAT on the way: the log's names would bypass it)
            "peers": sorted(str(n.address) for n in self._nodes),
        }

    def retire(self, node: Any) -> None:
        """``node`` was removed from the cluster.  It stays known to the transport, so that
        whichever end connects, this node tells it so (and nothing else), and closes the
        connection a moment later: a removed node that comes back learns why it is refused.
        Tick thread."""
        self._retired.add(node)
        self._verified.discard(node)
        self._awaiting_hello.pop(node, None)
        self._tell_removed(node)

    def unretire(self, node: Any) -> None:
        """``node`` is a member again (added back)."""
        self._retired.discard(node)

    def _tell_removed(self, node: Any) -> None:
        conn = self._connections.get(node)
        if conn is None:
            return
        notice = [NOT_A_MEMBER, str(self._selfNode.address), self._peer_list(), True]
        conn.send([*notice, int(self.members_index())])
        conn.setOnMessageReceivedCallback(_ignore)
        self._closing.append((clock.mono() + CLOSE_GRACE, conn))

    def hellos(self) -> dict[str, dict[str, Any]]:
        """The latest hello of each peer that sent one (any thread: a copy)."""
        with self._guard_lock:
            return dict(self._hellos)

    def _before_hello(self, node: Any, message: Any) -> None:
        """A message from a peer whose hello has not matched yet."""
        if node not in self._awaiting_hello:
            return  # refused, its connection about to close: read and ignored
        address = str(node.address)
        kind = message.get("type") if isinstance(message, dict) else None
        same = kind == HELLO and message.get("raft_protocol") == self.protocol
        if same and not self._same_layout(message):
            del self._awaiting_hello[node]
            conn = self._connections.get(node)
            if conn is not None:
                self._closing.append((clock.mono(), conn))
            self._refused(SHARD_LAYOUT, address, self._layout_hint(address, message), peer=address)
            return
        if same:
            del self._awaiting_hello[node]
            self._verified.add(node)
            self._spoke_ours.add(address)
            self._missing_since.pop(address, None)
            with self._guard_lock:
                self._hellos[address] = message
            if "data" in message:
                self.on_peer_data(address, bool(message["data"]))
            super()._onNodeConnected(node)  # type: ignore[misc]
            return
        del self._awaiting_hello[node]
        conn = self._connections.get(node)
        if conn is not None:
            # What it sends until the connection closes (at the next tick) is dropped above.
            self._closing.append((clock.mono(), conn))
        if kind != HELLO and address in self._spoke_ours:
            # It spoke this protocol before: its hello was lost on the way (a connection that
            # drops messages) - unless that goes on, as with a node downgraded in place.
            # Reconnect, quietly for a while.
            since = self._missing_since.setdefault(address, clock.mono())
            if clock.mono() - since < HELLO_MISSING_GRACE:
                log_event(log, "raft.hello_missing", peer=address)
                return
        if kind == HELLO:
            theirs = f"schedd Raft protocol {message.get('raft_protocol')} (schedd " + (
                f"{message.get('version', '?')})"
            )
        else:  # pysyncobj's messages without a hello: a schedd from before the hello
            theirs = "schedd Raft protocol 1 (a schedd without pre-vote: it sent Raft messages "
            theirs += "without a hello)"
        self._refused(
            PROTOCOL_VERSION,
            address,
            f"{address} speaks {theirs} and this node {self.protocol} (schedd {__version__}): "
            f"{_UPGRADE_HINT}",
            peer=address,
        )
        # Its end logs the refusal too if it has the hello (it refuses this node's).

    def _same_layout(self, hello: dict[str, Any]) -> bool:
        """Whether a hello comes from the same shard of a cluster of as many shards (one
        without the fields is from a schedd before shards: one shard, shard 0)."""
        return bool(hello.get("shards", 1) == self.shards and hello.get("shard", 0) == self.shard)

    def _layout_hint(self, address: str, hello: dict[str, Any]) -> str:
        theirs = (hello.get("shard", 0), hello.get("shards", 1))
        if theirs[1] != self.shards:
            return (
                f"{address} is a node of a cluster of {theirs[1]} shard(s) and this node of "
                f"{self.shards}: every node must have the same [cluster] shards (it is fixed "
                "when the cluster is created)"
            )
        return (
            f"{address} is shard {theirs[0]}'s Raft port and this one shard {self.shard}'s: "
            "shard k listens on the Raft port + k on every node, so raft.listen and "
            "raft.peers must name the same port (shard 0's) on every node"
        )

    # -- reporting ------------------------------------------------------------------------------
    def _handshake_timeout(self) -> float:
        return float(self._syncObj.conf.connectionTimeout) / 2

    def _peer_list(self) -> list[str]:
        return sorted(str(n.address) for n in self._nodes)

    def _refused(self, reason: str, remote: str, hint: str, peer: str | None = None) -> None:
        key = (reason, peer or remote.rsplit(":", 1)[0])  # a connecting port changes each time
        now = clock.mono()
        with self._guard_lock:
            self.refusals[reason] = self.refusals.get(reason, 0) + 1
            last, suppressed = self._reported.get(key, (-REPORT_EVERY, 0))
            if now - last < REPORT_EVERY:
                self._reported[key] = (last, suppressed + 1)
                return
            self._reported[key] = (now, 0)
        fields: dict[str, Any] = {"reason": reason, "remote": remote}
        if peer is not None:
            fields["peer"] = peer
        if suppressed:
            fields["refused_since_last_report"] = suppressed
        log_event(
            log,
            "raft.peer_refused",
            level=logging.ERROR,
            node=str(self._selfNode.address),
            hint=hint,
            **fields,
        )

    def _not_a_member(self, message: list[Any]) -> None:
        refuser = str(message[1]) if len(message) > 1 else "?"
        their_peers = [str(p) for p in message[2]] if len(message) > 2 else []
        removed = len(message) > 3 and message[3] is True
        me = str(self._selfNode.address)
        at = message[4] if len(message) > 4 and isinstance(message[4], int) else 0
        if removed and at <= self.members_index():
            return  # it knows an older membership than this node's (it is catching up)
        if removed:
            self.removed = True
            if self.fatal is None:
                self.fatal = (
                    f"raft.listen: this node ({me}) was removed from its cluster ({refuser} "
                    "says so); it cannot take part again with its old data: empty its data "
                    "directory and add it anew (schedctl node add, or raft.join; "
                    "docs/operations.md, Membership)"
                )
                self.on_fatal(self.fatal)
            return
        with self._guard_lock:
            first = refuser not in self._refused_by
            self._refused_by[refuser] = their_peers
            everyone = {str(n.address) for n in self._nodes} <= set(self._refused_by)
        if self.joining():
            if first:
                log_event(
                    log,
                    "raft.waiting_to_join",
                    node=me,
                    peer=refuser,
                    hint="this node is not a member yet: it is let in once the cluster records "
                    f"it (schedctl node add {me}, or raft.join)",
                )
            return
        if first:
            log_event(
                log,
                "raft.not_a_member",
                level=logging.ERROR,
                node=me,
                peer=refuser,
                its_peers=their_peers,
                hint=f"{refuser} does not list this node's raft.listen ({me}) in its "
                "raft.peers: every node must list the others by the address each "
                "sets in raft.listen",
            )
        if everyone and not self._saw_leader and self.fatal is None:
            listed = "; ".join(
                f"{p} lists {', '.join(ps) or 'no peers'}"
                for p, ps in sorted(self._refused_by.items())
            )
            self.fatal = (
                f"raft.listen: no peer lists this node's address {me} in its "
                f"raft.peers ({listed}); every node must list the others by the "
                "address each sets in raft.listen"
            )
            self.on_fatal(self.fatal)


def _ignore(message: Any) -> None:
    """Message callback of a refused connection waiting to be closed."""
