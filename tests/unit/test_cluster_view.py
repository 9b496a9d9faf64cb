"""``GET /cluster`` as a node sees it (``schedd.api.cluster.cluster_view``): each node's lag,
last contact and version, from the leader's view and from a follower's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

import schedd
from schedd.api import cluster
from schedd.config import load_config
from schedd.core.state import MemoryState, State

NOW = 1_000.0  # clock.mono in these tests
CONFIG = load_config(
    None,
    env={},
    overrides={
        "node.id": "n1",
        "http.listen": "127.0.0.1:7700",
        "raft.listen": "127.0.0.1:7701",
        "raft.peers": ["127.0.0.1:7711", "127.0.0.1:7721"],
    },
)
N2, N3 = "http://127.0.0.1:7710", "http://127.0.0.1:7720"


@dataclass
class Peer:
    addr: str
    connected: bool = True
    match_index: int | None = None
    answered_at: float | None = None
    role: str = "voter"


@dataclass
class Status:
    role: Any
    leader: str | None
    peers: list[Peer]
    term: int = 3
    commit_index: int = 100
    leader_heard_at: float | None = None


@dataclass
class FakeRaft:
    raft_status: Status
    applied_index: int = 100
    state: State = field(default_factory=MemoryState)
    hellos: dict[str, dict[str, Any]] = field(default_factory=dict)

    def peer_hellos(self) -> dict[str, dict[str, Any]]:
        return self.hellos

    @property
    def commit_index(self) -> int:
        return self.raft_status.commit_index

    @property
    def state_index(self) -> int:
        return self.applied_index

    def has_quorum(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def voting(self) -> bool:
        return True

    @contextmanager
    def read(self) -> Iterator[State]:
        yield self.state


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster.clock, "mono", lambda: NOW)


def nodes(view: Any) -> dict[str, Any]:
    return {n["raft"]: n for n in view["nodes"]}


def test_the_leader_knows_each_followers_lag_and_when_it_last_answered() -> None:
    raft = FakeRaft(
        Status(
            "leader",
            "127.0.0.1:7701",
            [
                Peer("127.0.0.1:7711", match_index=97, answered_at=NOW - 0.0204),
                Peer("127.0.0.1:7721", connected=False, match_index=40, answered_at=NOW - 12.5),
            ],
        )
    )
    view = cluster.cluster_view(CONFIG, raft, "http://127.0.0.1:7700", {N2: "1.2.3"})  # type: ignore[arg-type]
    me, n2, n3 = (nodes(view)[a] for a in ("127.0.0.1:7701", "127.0.0.1:7711", "127.0.0.1:7721"))
    assert (me["version"], me["lag"], me["last_contact"]) == (schedd.__version__, 0, 0.0)
    assert (n2["version"], n2["lag"], n2["last_contact"], n2["match_index"]) == (
        "1.2.3",
        3,
        0.02,
        97,
    )
    assert (n3["version"], n3["lag"], n3["last_contact"]) == (None, 60, 12.5)
    assert not n3["healthy"]


def test_a_learner_is_shown_as_one() -> None:
    raft = FakeRaft(
        Status(
            "leader",
            "127.0.0.1:7701",
            [Peer("127.0.0.1:7711", match_index=97), Peer("127.0.0.1:7731", role="learner")],
        )
    )
    view = cluster.cluster_view(CONFIG, raft, "http://127.0.0.1:7700", {})  # type: ignore[arg-type]
    roles = {a: n["role"] for a, n in nodes(view).items()}
    assert roles == {
        "127.0.0.1:7701": "leader",
        "127.0.0.1:7711": "follower",
        "127.0.0.1:7731": "learner",
    }


def test_a_follower_knows_its_own_lag_and_when_it_last_heard_from_its_leader() -> None:
    raft = FakeRaft(
        Status(
            "follower",
            "127.0.0.1:7711",
            [Peer("127.0.0.1:7711"), Peer("127.0.0.1:7721")],
            leader_heard_at=NOW - 0.25,
        ),
        applied_index=96,
    )
    view = cluster.cluster_view(CONFIG, raft, N2, {N2: "1.2.3", N3: "1.2.4"})  # type: ignore[arg-type]
    me, leader, other = (
        nodes(view)[a] for a in ("127.0.0.1:7701", "127.0.0.1:7711", "127.0.0.1:7721")
    )
    assert (me["lag"], me["last_contact"]) == (4, 0.25)  # the commit index it knows, unapplied
    assert (leader["role"], leader["lag"], leader["last_contact"]) == ("leader", 0, 0.25)
    assert (other["lag"], other["last_contact"], other["version"]) == (None, None, "1.2.4")
    assert "match_index" not in other  # only a leader knows


async def test_versions_are_asked_in_the_background_and_never_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = cluster.LeaderProxy(CONFIG, lambda: None, True)
    asked: list[list[str]] = []
    answers = {N2: "9.9", N3: None}  # n3 does not answer

    async def version_of(session: Any, url: str) -> str | None:
        asked.append([url])
        return answers[url]

    monkeypatch.setattr(proxy, "_version_of", version_of)
    now = [NOW]
    monkeypatch.setattr(cluster.clock, "mono", lambda: now[0])
    assert proxy.versions([N2, N3]) == {N2: None, N3: None}  # not known yet: not waited for
    await asyncio.gather(*proxy._asking)
    assert proxy.versions([N2, N3]) == {N2: "9.9", N3: None}
    assert sorted(asked) == [[N2], [N3]] and not proxy._asking  # fresh: not asked again
    now[0] += cluster.VERSION_RETRY_S  # the one that did not answer is asked again soon
    proxy.versions([N2, N3])
    await asyncio.gather(*proxy._asking)
    assert sorted(asked) == [[N2], [N3], [N3]]
    now[0] += cluster.VERSION_TTL_S  # and a known one once it is old
    proxy.versions([N2, N3])
    await proxy.close()
    assert len(asked) <= 5 and not proxy._asking


def test_every_peer_is_named_by_the_id_and_version_it_said_over_raft() -> None:
    raft = FakeRaft(
        Status(
            "follower",
            "127.0.0.1:7711",
            [Peer("127.0.0.1:7711"), Peer("127.0.0.1:7721", connected=False)],
            leader_heard_at=NOW - 0.25,
        ),
        hellos={
            "127.0.0.1:7711": {"id": "n2", "version": "1.2.3", "http": N2},
            "127.0.0.1:7721": {"id": "n3", "version": "1.2.4", "http": N3},
        },
    )
    view = cluster.cluster_view(CONFIG, raft, N2, {})  # type: ignore[arg-type]
    n2, n3 = (nodes(view)[a] for a in ("127.0.0.1:7711", "127.0.0.1:7721"))
    assert (n2["id"], n2["version"]) == ("n2", "1.2.3")
    assert (n3["id"], n3["version"]) == ("n3", "1.2.4")  # down now: what it said before
    assert view["leader"] == "n2"  # by its id, not its Raft address
