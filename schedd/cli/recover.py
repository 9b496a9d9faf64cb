"""``schedd recover --force-new-cluster --config PATH``: a survivor of a lost majority becomes a
one-node cluster from its own state.

When a majority of the voters is gone for good, nothing can be committed, and no election can be
won.  On one survivor (the one with the highest applied index: ``schedd inspect --data-dir``
prints it), stopped, this rewrites the membership its state database records to itself alone,
with the others listed as removed, and records the recovery in the leaders list.  Started again,
the node elects itself and goes on from its own state; new nodes are then added as usual
(``schedctl node add`` or ``raft.join``).  A node of a cluster of several shards recovers every
shard's group of its own (each checked before any is written).

What may be lost: writes that only the lost nodes had acknowledged (committed on a majority
that did not include this node), and whatever this node's log held beyond its commit index is
committed as it stands.  So it refuses while any other voter still answers: with a majority
alive, remove the dead nodes instead; with a minority alive, stop the others first (they are
added back empty afterwards).

Every failure is one line on stderr and a non-zero exit: 2 for the config and the command
line, 1 for the data directory and the cluster.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import orjson

from schedd import clock
from schedd.cli.inspect import lock_holder
from schedd.config import STATE_FILE, Config
from schedd.core.apply import MAX_CLAIMS
from schedd.core.members import Member, Membership
from schedd.shard.layout import shard_config
from schedd.storage.snapshots import SnapshotError, read_meta, write_meta

PREFIX = "schedd recover: "
#: how long another voter has to answer ``GET /healthz`` before it counts as gone
PROBE_TIMEOUT_S = 2.0


class _Refused(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def _answers(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _read(path: Path) -> tuple[int, int, Membership | None, list[list[object]]]:
    """The applied index, the leader term, the recorded membership and the leader claims."""
    try:
        meta = read_meta(path)
    except sqlite3.Error as exc:
        raise _Refused(f"{path}: not a schedd state database: {exc}") from None
    try:
        members = (
            None if "members" not in meta else Membership.from_json(orjson.loads(meta["members"]))
        )
        claims = orjson.loads(meta["leader_claims"]) if "leader_claims" in meta else []
        return int(meta.get("applied_index", 0)), int(meta.get("leader_term", 0)), members, claims
    except (ValueError, KeyError, TypeError) as exc:
        raise _Refused(f"{path}: its membership cannot be read: {exc}") from None


def recover(cfg: Config, probe: bool = True) -> int:
    try:
        return _recover(cfg, probe)
    except _Refused as exc:
        print(f"{PREFIX}{exc.message}", file=sys.stderr)
        return exc.code


@dataclass(frozen=True)
class _Plan:
    """What recovering one Raft group of this node writes, and what it tells."""

    state: Path
    members: Membership
    claims: list[list[object]]
    applied: int
    term: int
    lost: str


def _recover(cfg: Config, probe: bool) -> int:
    shards = cfg.cluster.shards
    if shards == 1:
        plans = [_plan(cfg, probe)]
    else:  # every shard's group of this node, each checked before any is written
        plans = [_plan(shard_config(cfg, k), probe and k == 0) for k in range(shards)]
    for plan in plans:
        try:
            write_meta(
                plan.state,
                {
                    "members": orjson.dumps(plan.members.to_json()).decode(),
                    "leader_claims": orjson.dumps(plan.claims).decode(),
                },
            )
        except (sqlite3.Error, SnapshotError, OSError) as exc:
            raise _Refused(f"{plan.state}: cannot write it: {exc}") from None
    first = plans[0]
    at = (
        f"applied index {first.applied}, term {first.term}"
        if shards == 1
        else "; ".join(f"shard {k}: applied index {p.applied}" for k, p in enumerate(plans))
    )
    print(
        f"WARNING: {cfg.node.id} ({cfg.raft.listen}) now forms a NEW ONE-NODE CLUSTER from its "
        f"own state: {at}. Removed: {first.lost}.\n"
        "WARNING: writes that only the lost nodes had acknowledged are gone (anything committed "
        "after this node's applied index on a majority without it); anything this node's log "
        "held beyond that is kept as it stands. Do not start the removed nodes with their old "
        "data: they are refused.\n"
        f"next: start this node (systemctl start schedd), check it leads (schedctl cluster), "
        "then add new nodes one at a time (raft.join on each, or schedctl node add ADDR). "
        "Update raft.peers in this node's config to match (it logs raft.peers_differ until "
        "then).",
        file=sys.stderr,
    )
    return 0


def _plan(cfg: Config, probe: bool) -> _Plan:
    state = cfg.data_path / "raft" / STATE_FILE
    if not state.is_file():
        raise _Refused(
            f"{state}: no state here: recover a node that held the cluster's data "
            "(node.data_dir of a survivor)"
        )
    try:
        pid = lock_holder([Path(f"{state}-shm"), state])
    except OSError:
        pid = None
    if pid is not None:
        raise _Refused(
            f"{state} is open in a running schedd"
            + (f" (process {pid})" if pid > 0 else "")
            + ": stop it first (systemctl stop schedd)"
        )
    applied, term, recorded, claims = _read(state)
    me = cfg.raft.listen
    current = recorded or Membership(voters=(Member(me), *(Member(p) for p in cfg.raft.peers)))
    if me not in current.voter_addresses():
        raise _Refused(
            f"raft.listen {me} is not a voter of the membership this node recorded "
            f"({', '.join(sorted(current.voter_addresses()))}): recover a voter"
        )
    http = cfg.peer_http_map()
    others = [m for m in current.voters if m.raft != me]
    if probe:
        alive = [m for m in others if _answers(m.http or http.get(m.raft, ""))]
        if alive:
            names = ", ".join(f"{m.name} ({m.http or http.get(m.raft)})" for m in alive)
            majority = len(alive) + 1 > len(current.voters) // 2
            hint = (
                "the cluster still has a majority: remove the dead nodes instead (schedctl node "
                "remove ID)"
                if majority
                else "stop every other survivor first (they are added back, empty, afterwards)"
            )
            raise _Refused(f"{names} still answer: {hint}; nothing was changed")
    new = Membership(
        voters=(Member(me, cfg.node.id, cfg.advertise_url()),),
        removed=tuple(dict.fromkeys((*current.removed, *(m.raft for m in others))))[-64:],
        index=max(applied, current.index),
        cluster=current.cluster,  # the same cluster, with one member
    )
    claim = [term, f"{cfg.node.id} (recover --force-new-cluster)", applied, clock.wall_ms()]
    claims = [*claims, claim][-MAX_CLAIMS:]
    lost = ", ".join(f"{m.name} ({m.raft})" for m in others) or "none"
    return _Plan(state, new, claims, applied, term, lost)


def parse_args(argv: list[str], config_options: object) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="schedd recover",
        description="After a lost majority: make this stopped survivor a one-node cluster from "
        "its own state (the highest applied index among the survivors: schedd inspect "
        "--data-dir). Refused while another voter answers. Then add new nodes.",
    )
    p.add_argument(
        "--force-new-cluster",
        action="store_true",
        required=True,
        help="required: says that writes only the lost nodes acknowledged may be lost",
    )
    assert callable(config_options)
    config_options(p)
    return p.parse_args(argv)
