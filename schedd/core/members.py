"""The cluster's membership, as the log records it.

A cluster starts with the members its nodes' ``raft.peers`` name.  The first change made through
the API (``schedctl node add/remove``) records the whole membership in the replicated state, and
from then on the log is what counts: every node applies each change at the same index, and a
node whose ``raft.peers`` says otherwise follows the log.

Changes go one at a time, each one server (Raft's single-server changes, applied when committed,
as etcd does):

* **add** records a *learner*: the leader replicates to it, but it neither votes nor counts
  towards a majority, so a node that loads the state for minutes lowers nothing;
* **promote** makes the learner a voter once the leader has seen it catch up;
* **record** writes down the membership the nodes' configuration gives, with the cluster's
  id, once every voter can take part in changes (the leader does it by itself);
* **remove** drops a voter or the learner.  Its address is remembered, so that a removed node
  that comes back is told so.

There is at most one learner, and no other change while it is there except removing it: two
changes in flight at once could leave two majorities that do not overlap.

Pure: no clock, no I/O; :func:`plan_add`, :func:`plan_promote` and :func:`plan_remove` raise
:class:`~schedd.errors.SchedError` subclasses whose message names what is wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from schedd.errors import Conflict, InvalidArgument, NotFound

#: removed addresses remembered (the newest), to tell a removed node that comes back why it is
#: refused
REMOVED_KEPT = 64
VOTER = "voter"
LEARNER = "learner"


@dataclass(frozen=True, slots=True)
class Member:
    raft: str  # host:port of its Raft listener: how the nodes know each other
    id: str = ""  # its node.id ("" until it has said, for a learner added by address)
    http: str = ""  # its API's URL ("" until known)

    @property
    def name(self) -> str:
        return self.id or self.raft

    def to_wire(self) -> list[str]:
        return [self.raft, self.id, self.http]

    @classmethod
    def from_wire(cls, raw: Any) -> Member:
        raft, node_id, http = (str(v) for v in raw)
        return cls(raft, node_id, http)


@dataclass(frozen=True, slots=True)
class Membership:
    """Who votes, who is learning, who was removed, as of log index ``index`` (0: the
    membership the nodes' configuration gives, never changed through the log)."""

    voters: tuple[Member, ...]
    learner: Member | None = None
    removed: tuple[str, ...] = ()
    index: int = 0
    #: the cluster's id: chosen by the leader when it first records the membership, kept by
    #: every change after ("": not recorded yet)
    cluster: str = ""

    def addresses(self) -> set[str]:
        out = {m.raft for m in self.voters}
        if self.learner is not None:
            out.add(self.learner.raft)
        return out

    def voter_addresses(self) -> set[str]:
        return {m.raft for m in self.voters}

    def find(self, ref: str) -> Member | None:
        """The member named ``ref``: its node id or its Raft address."""
        every = self.voters if self.learner is None else (*self.voters, self.learner)
        return next((m for m in every if ref in (m.raft, m.id)), None)

    def role(self, raft: str) -> str | None:
        if raft in self.voter_addresses():
            return VOTER
        if self.learner is not None and self.learner.raft == raft:
            return LEARNER
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "voters": [m.to_wire() for m in self.voters],
            "learner": None if self.learner is None else self.learner.to_wire(),
            "removed": list(self.removed),
            "cluster": self.cluster,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Membership:
        learner = raw.get("learner")
        return cls(
            voters=tuple(Member.from_wire(m) for m in raw["voters"]),
            learner=None if learner is None else Member.from_wire(learner),
            removed=tuple(str(a) for a in raw.get("removed", ())),
            index=int(raw.get("index", 0)),
            cluster=str(raw.get("cluster", "")),
        )

    def with_known(self, known: Iterable[Member]) -> Membership:
        """The same membership with ids and URLs filled in from ``known`` where they are
        missing (by Raft address)."""
        by_addr = {m.raft: m for m in known}

        def fill(m: Member) -> Member:
            k = by_addr.get(m.raft)
            if k is None:
                return m
            return Member(m.raft, m.id or k.id, m.http or k.http)

        return replace(
            self,
            voters=tuple(fill(m) for m in self.voters),
            learner=None if self.learner is None else fill(self.learner),
        )


def _in_flight(current: Membership) -> str | None:
    if current.learner is None:
        return None
    return (
        f"a membership change is in flight: {current.learner.name} is joining as a learner "
        "(it becomes a voter once it has caught up); wait for it (schedctl node list), or "
        f"remove it first (schedctl node remove {current.learner.name})"
    )


def plan_add(current: Membership, raft: str, node_id: str = "", http: str = "") -> Membership:
    """``current`` with a new learner at Raft address ``raft``."""
    clash = current.find(raft) or (current.find(node_id) if node_id else None)
    if clash is not None:
        role = current.role(clash.raft)
        raise Conflict(
            f"{raft if clash.raft == raft else node_id} is already a member of this cluster "
            f"({clash.name} at {clash.raft}, a {role}); to replace a node, remove the old one "
            "first (schedctl node remove ID)",
            field="raft" if clash.raft == raft else "id",
        )
    busy = _in_flight(current)
    if busy is not None:
        raise Conflict(busy)
    return replace(
        current,
        learner=Member(raft, node_id, http),
        removed=tuple(a for a in current.removed if a != raft),
    )


def plan_promote(current: Membership, raft: str, node_id: str, http: str) -> Membership:
    """``current`` with its learner at ``raft`` made a voter (with the id and URL it gave)."""
    if current.learner is None or current.learner.raft != raft:
        raise Conflict(f"{raft} is not the learner of this cluster: nothing to promote")
    member = Member(raft, node_id or current.learner.id, http or current.learner.http)
    return replace(current, voters=(*current.voters, member), learner=None)


def plan_remove(current: Membership, ref: str) -> Membership:
    """``current`` without the member named ``ref`` (a node id or a Raft address)."""
    member = current.find(ref)
    if member is None:
        known = ", ".join(f"{m.name} ({m.raft})" for m in current.voters)
        hint = " (it was removed before)" if ref in current.removed else ""
        raise NotFound(
            f"no member of this cluster is named {ref!r}{hint}; the members are: {known}",
            field="id",
        )
    removed = (*[a for a in current.removed if a != member.raft], member.raft)[-REMOVED_KEPT:]
    if current.learner is not None and current.learner.raft == member.raft:
        return replace(current, learner=None, removed=removed)
    busy = _in_flight(current)
    if busy is not None:
        raise Conflict(busy)
    if len(current.voters) == 1:
        raise InvalidArgument(
            f"{member.name} is the last voter of this cluster: removing it would leave no one "
            "to decide anything; add another node first (schedctl node add ADDR)",
            field="id",
        )
    voters = tuple(m for m in current.voters if m.raft != member.raft)
    return replace(current, voters=voters, removed=removed)


def check(new: Membership, current: Membership | None = None) -> str | None:
    """Why ``new`` cannot follow ``current`` (None: it can).  ``apply`` checks it again."""
    if current is not None and current.cluster and new.cluster != current.cluster:
        return f"the cluster's id is {current.cluster}, and a membership cannot change it"
    addrs = [m.raft for m in new.voters] + ([new.learner.raft] if new.learner else [])
    if not new.voters:
        return "a membership needs at least one voter"
    if len(set(addrs)) != len(addrs):
        return "a node appears twice in the membership"
    ids = [m.id for m in new.voters if m.id]
    if len(set(ids)) != len(ids):
        return "two voters have the same node id"
    return None
