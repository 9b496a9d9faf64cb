"""Membership changes as the leader makes them: add (a learner), promote, remove, join.

The rules are in :mod:`schedd.core.members`; this module turns a request into one ``Members``
command computed from the membership the leader goes by, commits it, and waits until this
node applied it.  The leader also promotes a learner once it has caught up
(:meth:`MembershipService.promote_when_ready`, run by the runtime while it leads).

A node started empty with ``raft.join`` asks the cluster to add it (:func:`join_cluster`): the
request is signed with the Raft secret (HMAC-SHA256), so a node with another secret is told
so and nothing changes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import ssl
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import aiohttp
import orjson

from schedd import clock, net
from schedd.core import commands, members
from schedd.core.members import LEARNER, VOTER, Member, Membership
from schedd.core.state import Ok, Rejected, State
from schedd.errors import (
    Conflict,
    InvalidArgument,
    PermissionDenied,
    SchedError,
    Unavailable,
    from_code,
)
from schedd.ids import new_request_id
from schedd.logs import log_event
from schedd.protocol import signed
from schedd.protocol.headers import SHARD_HEADER

log = logging.getLogger(__name__)

#: a learner whose match index is within this many entries of the commit index has caught up
PROMOTE_WITHIN = 64
#: ... and must have stayed so on this many looks in a row (one every PROMOTE_EVERY_S)
PROMOTE_LOOKS = 2
PROMOTE_EVERY_S = 0.5
JOIN_PATH = "/api/v1/cluster/join"
JOIN_TIMEOUT_S = 60.0


class MemberNode(Protocol):
    """What the service uses of the Raft node (``schedd.raft.node.RaftNode``)."""

    members: Membership

    @property
    def raft_self(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def term(self) -> int: ...

    @property
    def raft_status(self) -> Any: ...

    def read(self) -> Any: ...

    def peer_hellos(self) -> dict[str, dict[str, Any]]: ...

    def sending_copies(self) -> set[str]: ...

    async def submit(self, cmd: commands.Command, timeout: float = 5.0) -> Any: ...


def is_loopback(raft: str) -> bool:
    """Whether a (checked) ``host:port`` names this machine."""
    return net.is_loopback(raft.rpartition(":")[0].strip("[]"))


def join_proof(secret: bytes | None, body: dict[str, Any]) -> str:
    """The proof of a join request: its raft, id, http, at and cluster, signed."""
    return signed.proof(secret, {k: body.get(k) for k in ("raft", "id", "http", "at", "cluster")})


class MembershipService:
    def __init__(
        self,
        node: MemberNode,
        node_id: str,
        secret: bytes | None,
        hand_over: Callable[[], Any],
    ) -> None:
        self.node = node
        self.node_id = node_id
        self.secret = secret
        #: hands this node's leadership over (removing the leader); awaited
        self.hand_over = hand_over
        self._lock = asyncio.Lock()  # one change at a time from this node
        self._caught_up = 0  # consecutive looks at which the learner had caught up
        self._misnamed_said = False  # the misnamed peers were logged (not recorded: once)

    # -- reading ------------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The membership with what this node sees of each member."""
        node = self.node
        # ids and URLs the log does not have yet: this node's own, and what each peer said of
        # itself over Raft
        m = node.members.with_known([Member(node.raft_self, self.node_id, ""), *self._said()])
        status = node.raft_status
        leading = status.role == "leader"
        nodes = []
        me = node.raft_self
        every = [(mm, VOTER) for mm in m.voters]
        if m.learner is not None:
            every.append((m.learner, LEARNER))
        for member, role in every:
            peer = status.peer(member.raft)
            is_self = member.raft == me
            entry: dict[str, Any] = {
                "id": member.id or None,
                "raft": member.raft,
                "http": member.http or None,
                "role": role,
                "leader": member.raft == status.leader,
                "self": is_self,
                "connected": True if is_self else (peer is not None and peer.connected),
            }
            if leading:
                match = status.applied_index if is_self else (peer and peer.match_index)
                entry["match_index"] = match
                entry["lag"] = None if match is None else max(0, status.commit_index - match)
            nodes.append(entry)
        return {
            "index": m.index,
            "cluster": m.cluster or None,
            "source": "log" if m.index else "config",
            "nodes": nodes,
            "removed": list(m.removed),
            "quorum": len(m.voters) // 2 + 1,
        }

    def _said(self) -> list[Member]:
        """Each peer as it said itself over Raft (its hello): address, id, API URL."""
        return [
            Member(addr, str(hello.get("id") or ""), str(hello.get("http") or ""))
            for addr, hello in self.node.peer_hellos().items()
        ]

    # -- changing -----------------------------------------------------------------------------
    def _leading(self) -> tuple[int, Membership]:
        """This node's leader fence and the membership, or :class:`Unavailable`."""
        node = self.node
        if not node.is_leader:
            raise Unavailable("this node does not lead (any more): ask the leader", retry_after=1)
        st: State
        with node.read() as st:
            fence, claimed = st.leader_fence, st.leader_node == self.node_id
            fresh = st.leader_term == node.term
        if not (claimed and fresh):
            raise Unavailable("this node was just elected and is starting", retry_after=1)
        return fence, node.members

    def _check_upgraded(self, m: Membership, leaving: str = "") -> None:
        """Every voter but this node (and ``leaving``, the one being removed: it takes no part
        in what follows, and a dead one may never have said hello to this leader) advertises
        membership changes.  Once the membership is recorded (which took every voter's
        hello), a voter never heard from since this node started is not asked: another dead
        node must not keep an operator from removing one."""
        hellos = self.node.peer_hellos()
        old = [
            v.name
            for v in m.voters
            if v.raft not in (self.node.raft_self, leaving)
            and (v.raft in hellos or not m.index)
            and "membership" not in (hellos.get(v.raft, {}).get("features") or ())
        ]
        if old:
            raise Conflict(
                f"{', '.join(old)} run(s) a schedd without membership changes, or is not "
                "connected: upgrade every node (docs/operations.md, Upgrades) and make sure "
                "all voters are up before changing the membership"
            )

    def _misnamed(self, m: Membership) -> list[str]:
        """The voters this node knows by another address than the one they call themselves
        (their raft.listen, said in their hello): a membership recorded with this node's names
        for them would tell each of them that it is not a member, and it would stop.  (Only a
        proxy or a NAT between the nodes does this; pysyncobj itself refuses such a peer.)"""
        hellos = self.node.peer_hellos()
        out = []
        for v in m.voters:
            said = hellos.get(v.raft, {}).get("node")
            if v.raft != self.node.raft_self and said and said != v.raft:
                out.append(f"{v.raft} (its raft.listen is {said})")
        # ... and the peers that know a member by another address (it only shows in their
        # hello's list of peers: an address no member calls itself)
        members = {self.node.raft_self, *(v.raft for v in m.voters), *m.removed}
        if m.learner is not None:
            members.add(m.learner.raft)
        for addr, hello in sorted(hellos.items()):
            for named in hello.get("peers") or ():
                if isinstance(named, str) and named not in members:
                    out.append(f"{named} (how {addr} names a member)")
        return out

    async def _commit(self, op: str, target: str, new: Membership, base: Membership) -> Membership:
        misnamed = self._misnamed(new)
        if misnamed:
            raise Conflict(
                f"this node knows {', '.join(misnamed)} by another address than its "
                "raft.listen: a membership recorded now would name it by an address it does "
                "not know as its own, and it would stop; list every node in raft.peers by its "
                "raft.listen first"
            )
        if not base.cluster:  # recorded for the first time: the cluster gets its id
            new = replace(new, cluster=secrets.token_hex(8))
        # the ids and URLs the members said in their hellos, where the membership has none
        # (one taken from the configuration before they said it): in the log, so that after
        # a restart a member is still known by its id, even one that is down for good
        new = new.with_known(self._said())
        problem = members.check(new, base)
        if problem is not None:
            raise InvalidArgument(problem)
        fence, _ = self._leading()
        cmd = commands.Members(
            new_request_id(), clock.wall_ms(), fence, base.index, op, target, new.to_json()
        )
        res = await self.node.submit(cmd, timeout=10.0)
        if isinstance(res, Rejected):
            raise from_code(res.code, res.message)
        assert isinstance(res, Ok)
        index = int(res.value)
        log_event(
            log,
            "cluster.membership_changed",
            logging.WARNING,
            op=op,
            node=target,
            index=index,
            voters=[v.raft for v in new.voters],
            learner=new.learner.raft if new.learner else None,
        )
        # (the node adopted it on the Raft thread as it applied it, before this answer)
        return self.node.members

    async def add(self, raft: str, node_id: str = "", http: str = "") -> Membership:
        async with self._lock:
            _, m = self._leading()
            same = m.learner
            if same is not None and same.raft == raft and node_id in ("", same.id):
                return m  # asked again (a retry, a joining node restarted): nothing to do
            new = members.plan_add(m, raft, node_id, http)  # (none in flight past this)
            self._check_upgraded(m)
            if self.secret is None and not is_loopback(raft):
                raise InvalidArgument(
                    f"raft: {raft} is not a loopback address, and this cluster has no "
                    "raft.secret_file: Raft traffic beyond loopback must be encrypted; set "
                    "raft.secret_file on every node first",
                    field="raft",
                )
            self._caught_up = 0
            return await self._commit("add", raft, new, m)

    async def remove(self, ref: str) -> Membership | None:
        if not isinstance(ref, str) or not ref:
            raise InvalidArgument("expected a node id or Raft address", field="id")
        async with self._lock:
            _, m = self._leading()
            target = m.find(ref)
            new = members.plan_remove(m, ref)  # the errors first: unknown, in flight, last
            assert target is not None
            if target.raft == self.node.raft_self:
                # the leader: it hands over first, and the new leader removes it
                log_event(log, "cluster.remove_leader", node=target.raft)
                await self.hand_over()
                return None
            self._check_upgraded(m, leaving=target.raft)
            return await self._commit("remove", target.raft, new, m)

    async def join(self, body: dict[str, Any], remote: str | None) -> Membership:
        """A node asks to be added (raft.join): checked against the Raft secret."""
        raft = str(body.get("raft"))  # checked by the API
        node_id, http, at = body.get("id"), body.get("http"), body.get("at")
        if not isinstance(node_id, str) or not node_id:
            raise InvalidArgument("id: expected the joining node's node.id", field="id")
        if not isinstance(http, str):
            raise InvalidArgument("http: expected the joining node's API URL", field="http")
        if not isinstance(at, int) or abs(clock.wall_ms() - at) > signed.SIGNED_SKEW_MS:
            raise InvalidArgument(
                "at: expected the joining node's clock (Unix ms) within 5 minutes of the "
                "cluster's: check both machines' clocks",
                field="at",
            )
        proof = body.get("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(
            proof, join_proof(self.secret, body)
        ):
            raise PermissionDenied(
                "the join request is not signed with this cluster's Raft secret: the joining "
                "node's raft.secret_file must be the cluster's (or, on loopback only, both have "
                "none)"
            )
        if self.secret is None and not (remote is not None and net.is_loopback(remote)):
            raise PermissionDenied(
                "this cluster has no raft.secret_file: only a node on this machine may join it"
            )
        expected = body.get("cluster") or ""
        cluster = self.node.members.cluster
        if not isinstance(expected, str) or (expected and expected != cluster):
            raise Conflict(
                f"the joining node expects cluster {expected!r} (its raft.cluster_id), and this "
                f"is cluster {cluster or '(no id recorded yet)'!r}: check raft.join and "
                "raft.cluster_id on the new node",
                field="cluster",
            )
        if body.get("data"):
            raise Conflict(
                "the joining node holds data (its data directory is from another cluster, or "
                "from before it was removed): only an empty node may join; empty its data "
                "directory first"
            )
        m = self.node.members
        member = m.find(raft)
        if member is not None and m.role(raft) == VOTER:
            if member.id and member.id != node_id:
                raise Conflict(f"{raft} is a member already, as {member.id}", field="raft")
            return m
        return await self.add(raft, node_id, http)

    async def promote_when_ready(self) -> None:
        """The leader's loop: promote the learner once it has caught up."""
        while True:
            await asyncio.sleep(PROMOTE_EVERY_S)
            try:
                await self._maybe_record()
                await self._maybe_promote()
            except SchedError as exc:
                log_event(log, "cluster.promote_retry", logging.WARNING, reason=exc.message)

    async def _maybe_record(self) -> None:
        """Write down the membership the configuration gives (with the cluster's id) once
        every voter can take part in membership changes: from then on the log's membership is
        the one that counts, and the cluster has an id a joining node can be held to."""
        node = self.node
        m = node.members
        if m.index or not node.is_leader:
            return
        status = node.raft_status
        if any(not (p.connected) for p in status.peers):
            return  # every voter connected, its hello heard
        try:
            self._check_upgraded(m)
        except Conflict:
            return  # an older node among them: not yet
        misnamed = self._misnamed(m)
        if misnamed:
            if not self._misnamed_said:
                self._misnamed_said = True
                log_event(
                    log,
                    "cluster.membership_not_recorded",
                    logging.WARNING,
                    misnamed=misnamed,
                    hint="raft.peers names these nodes by other addresses than their "
                    "raft.listen (a proxy or NAT between the nodes?): the membership stays "
                    "the configuration's, and membership changes are refused",
                )
            return
        async with self._lock:
            _, current = self._leading()
            if current.index == 0:
                await self._commit("record", node.raft_self, current, current)

    async def _maybe_promote(self) -> None:
        node = self.node
        m = node.members
        learner = m.learner
        if learner is None or not node.is_leader:
            self._caught_up = 0
            return
        status = node.raft_status
        peer = status.peer(learner.raft)
        ready = (
            peer is not None
            and peer.connected
            and peer.match_index is not None
            and peer.match_index >= status.commit_index - PROMOTE_WITHIN
            and learner.raft not in node.sending_copies()
        )
        self._caught_up = self._caught_up + 1 if ready else 0
        if self._caught_up < PROMOTE_LOOKS:
            return
        hello = node.peer_hellos().get(learner.raft, {})
        node_id = str(hello.get("id") or learner.id)
        http = str(hello.get("http") or learner.http)
        clash = next((v for v in m.voters if node_id and v.id == node_id), None)
        if clash is not None:
            log_event(
                log,
                "cluster.promote_refused",
                logging.ERROR,
                learner=learner.raft,
                id=node_id,
                hint=f"the learner says its node.id is {node_id}, the id of voter "
                f"{clash.raft}: give it another node.id, or remove it",
            )
            return
        async with self._lock:
            _, current = self._leading()
            if current.learner != learner:
                return
            self._caught_up = 0
            await self._commit(
                "promote",
                learner.raft,
                members.plan_promote(current, learner.raft, node_id, http),
                current,
            )


async def join_cluster(
    urls: Sequence[str],
    raft: str,
    node_id: str,
    http: str,
    secret: bytes | None,
    ssl_context: ssl.SSLContext | bool,
    timeout: float = JOIN_TIMEOUT_S,
    cluster: str = "",
    data: bool = False,
    shard: int | None = None,
) -> Membership:
    """Ask the cluster at ``urls`` (any node's API) to add this node; the membership it
    recorded (this node a learner).  Retries while no node answers or there is no leader;
    a refusal is a :class:`SchedError` naming why.  ``shard``: in a cluster of several
    shards, the shard whose group this process joins (named to the node's front door)."""
    headers = {} if shard is None else {SHARD_HEADER: str(shard)}
    deadline = clock.mono() + timeout
    last = "no node answered"
    delay = 0.5
    while True:
        for url in urls:
            body: dict[str, Any] = {
                "raft": raft,
                "id": node_id,
                "http": http,
                "at": clock.wall_ms(),
                "data": data,
                "cluster": cluster,
            }
            body["proof"] = join_proof(secret, body)
            try:
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as s,
                    s.post(
                        url.rstrip("/") + JOIN_PATH, json=body, ssl=ssl_context, headers=headers
                    ) as resp,
                ):
                    answer = orjson.loads(await resp.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
                last = f"{url}: {exc or type(exc).__name__}"
                continue
            if resp.status == 200 and isinstance(answer, dict) and "members" in answer:
                return Membership.from_json(answer["members"])
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            code, message = str(error.get("code", "internal")), str(error.get("message", ""))
            if resp.status == 503:
                last = f"{url}: {message}"
                continue
            raise from_code(code, f"{url} refused to add this node: {message}")
        if clock.mono() > deadline:
            raise Unavailable(f"raft.join: could not join within {timeout:.0f}s: {last}")
        log_event(log, "cluster.join_retry", level=logging.WARNING, reason=last)
        await asyncio.sleep(delay)
        delay = min(5.0, delay * 2)
