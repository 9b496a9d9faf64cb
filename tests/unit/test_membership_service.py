"""``MembershipService``'s checks before a change, on a stand-in node: which voters must have
said (in their hello) that they take part in membership changes."""

from __future__ import annotations

from typing import Any

import pytest

from schedd.core.members import Member, Membership
from schedd.errors import Conflict
from schedd.leader.membership import MembershipService

A, B, C, D, E = (f"10.0.0.{i}:7701" for i in range(1, 6))
FIVE = (Member(A, "n1"), Member(B, "n2"), Member(C, "n3"), Member(D, "n4"), Member(E, "n5"))
NEW = {"features": ["pre_vote", "membership"]}


class Node:
    raft_self = A

    def __init__(self, hellos: dict[str, dict[str, Any]]) -> None:
        self.hellos = hellos

    def peer_hellos(self) -> dict[str, dict[str, Any]]:
        return self.hellos


def service(hellos: dict[str, dict[str, Any]]) -> MembershipService:
    return MembershipService(Node(hellos), "n1", None, hand_over=lambda: None)  # type: ignore[arg-type]


def test_before_the_membership_is_recorded_every_voter_must_have_said_so() -> None:
    m = Membership(voters=FIVE)  # index 0: the configuration's
    with pytest.raises(Conflict, match="n5"):
        service({B: NEW, C: NEW, D: NEW})._check_upgraded(m)
    service({B: NEW, C: NEW, D: NEW, E: NEW})._check_upgraded(m)


def test_once_recorded_a_voter_never_heard_from_does_not_block_a_removal() -> None:
    m = Membership(voters=FIVE, index=40)
    # n4 and n5 died before this leader started: n5 can be removed, then n4
    service({B: NEW, C: NEW})._check_upgraded(m, leaving=E)
    # but a voter that said hello without the feature (an older release) still blocks
    with pytest.raises(Conflict, match="n4"):
        service({B: NEW, C: NEW, D: {"features": ["pre_vote"]}})._check_upgraded(m, leaving=E)
