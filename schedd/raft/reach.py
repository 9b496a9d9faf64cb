"""Saying, every few seconds, that this node cannot reach a peer or knows no leader.

A node cut off from its peers otherwise logs nothing after ``node.started`` (only ``/readyz``
says it is not ready), and an operator reading its log cannot tell a dead peer from a wrong
address.  :class:`Reachability` looks at the node's published Raft status once a period and
returns what to log: ``raft.peer_unreachable`` for each peer not connected for a whole period
(with how long; the daemon adds the error a plain TCP connect to it gets), and
``cluster.no_leader`` while no leader has been known for a whole period, naming the peers it
does reach.  Both repeat every period for as long as it lasts, as Consul's and Nomad's
"failed to contact" and "no cluster leader" lines do; ``raft.peer_reachable`` and
``cluster.leader_known`` say when it ends.  :class:`Reachability` is pure (the status and the
clock come in); :func:`tcp_error` asks the network.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

PERIOD_S = 5.0  # between two looks (and two lines about one problem)


class PeerLike(Protocol):
    @property
    def addr(self) -> str: ...

    @property
    def connected(self) -> bool: ...


class StatusLike(Protocol):
    @property
    def leader(self) -> str | None: ...

    @property
    def peers(self) -> Sequence[PeerLike]: ...


@dataclass
class Reachability:
    period: float = field(default_factory=lambda: PERIOD_S)  # (read when made: tests set it)
    down_since: dict[str, float] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)
    no_leader_since: float | None = None
    no_leader_reported: bool = False

    def look(self, status: StatusLike, now: float) -> list[tuple[str, dict[str, Any]]]:
        """What to log now: (event, fields), the problems first."""
        out: list[tuple[str, dict[str, Any]]] = []
        members = {peer.addr for peer in status.peers}
        for gone in [a for a in self.down_since if a not in members]:  # removed from the cluster
            del self.down_since[gone]
            self.reported.discard(gone)
        for peer in status.peers:
            if peer.connected:
                self.down_since.pop(peer.addr, None)
                if peer.addr in self.reported:
                    self.reported.discard(peer.addr)
                    out.append(("raft.peer_reachable", {"peer": peer.addr}))
                continue
            since = self.down_since.setdefault(peer.addr, now)
            if now - since >= self.period:
                self.reported.add(peer.addr)
                out.append(
                    ("raft.peer_unreachable", {"peer": peer.addr, "for_s": round(now - since)})
                )
        if status.leader is not None:
            self.no_leader_since = None
            if self.no_leader_reported:
                self.no_leader_reported = False
                out.append(("cluster.leader_known", {"leader": status.leader}))
        elif status.peers:
            since = self.no_leader_since = self.no_leader_since or now
            if now - since >= self.period:
                self.no_leader_reported = True
                reached = sorted(p.addr for p in status.peers if p.connected)
                out.append(
                    (
                        "cluster.no_leader",
                        {
                            "for_s": round(now - since),
                            "peers": len(status.peers),
                            "reached": ",".join(reached) or "none",
                            "hint": "a leader needs a majority of the nodes connected",
                        },
                    )
                )
        return out


async def tcp_error(address: str, timeout: float = 1.0) -> str:
    """What a plain TCP connect to ``address`` (host:port) gets: an error, or that it connects
    (then Raft itself refuses: see ``raft.peer_refused`` on either node).  Nothing is sent."""
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout
        )
    except TimeoutError:
        return f"no answer within {timeout:g}s (host down, or a firewall drops it)"
    except OSError as exc:  # asyncio words it "Connect call failed": say what the errno says
        return (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
    except ValueError:
        return "not a host:port"
    writer.close()
    return "TCP connects, but Raft does not: see raft.peer_refused in either node's log"
