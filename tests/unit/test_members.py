"""The membership rules (``schedd.core.members``) and the ``Members`` command as ``apply`` takes
it: one change at a time, each computed from the membership it replaces; the last voter stays;
a learner may be called off; a removed address is remembered; the state database keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedd.core import commands, members
from schedd.core.members import Member, Membership
from schedd.core.state import Ok, Rejected
from schedd.errors import Conflict, InvalidArgument, NotFound
from schedd.storage.sqlstate import SqlState, apply_entry
from tests.unit.test_state import T0, Harness

A, B, C, D, E = (f"10.0.0.{i}:7701" for i in range(1, 6))
THREE = Membership(voters=(Member(A, "n1"), Member(B, "n2"), Member(C, "n3")))


def test_add_records_a_learner_and_promote_makes_it_a_voter() -> None:
    added = members.plan_add(THREE, D)
    assert added.learner == Member(D) and added.voters == THREE.voters
    assert added.role(D) == "learner" and added.role(A) == "voter" and added.role(E) is None
    promoted = members.plan_promote(added, D, "n4", "http://10.0.0.4:7700")
    assert promoted.learner is None
    assert promoted.voters[-1] == Member(D, "n4", "http://10.0.0.4:7700")
    assert promoted.find("n4") == promoted.find(D) == promoted.voters[-1]


@pytest.mark.parametrize(
    ("raft", "node_id", "field"),
    [(B, "", "raft"), (D, "n2", "id")],
)
def test_adding_a_member_again_is_a_conflict(raft: str, node_id: str, field: str) -> None:
    with pytest.raises(Conflict, match="already a member") as exc:
        members.plan_add(THREE, raft, node_id)
    assert exc.value.field == field  # what names the member already there


def test_removing_who_is_not_a_member_names_the_id() -> None:
    with pytest.raises(NotFound, match="no member of this cluster is named 'n9'") as exc:
        members.plan_remove(THREE, "n9")
    assert exc.value.field == "id"


def test_one_change_at_a_time() -> None:
    added = members.plan_add(THREE, D)
    with pytest.raises(Conflict, match="in flight"):
        members.plan_add(added, E)
    with pytest.raises(Conflict, match="in flight"):
        members.plan_remove(added, "n2")
    with pytest.raises(Conflict, match="not the learner"):
        members.plan_promote(THREE, D, "n4", "")


def test_the_learner_may_be_called_off_and_is_remembered_as_removed() -> None:
    added = members.plan_add(THREE, D)
    off = members.plan_remove(added, D)
    assert off.learner is None and off.voters == THREE.voters and off.removed == (D,)
    # added back later: no longer listed as removed
    assert members.plan_add(off, D).removed == ()


def test_remove_drops_a_voter_but_never_the_last() -> None:
    two = members.plan_remove(THREE, "n3")
    assert [m.raft for m in two.voters] == [A, B] and two.removed == (C,)
    one = members.plan_remove(two, A)
    with pytest.raises(InvalidArgument, match="last voter"):
        members.plan_remove(one, "n2")
    with pytest.raises(NotFound, match="removed before"):
        members.plan_remove(one, C)


def test_removed_addresses_are_bounded() -> None:
    m = THREE
    for i in range(members.REMOVED_KEPT + 5):
        m = members.plan_remove(members.plan_add(m, f"10.1.0.{i}:7701"), f"10.1.0.{i}:7701")
    assert len(m.removed) == members.REMOVED_KEPT
    assert m.removed[-1] == f"10.1.0.{members.REMOVED_KEPT + 4}:7701"


def test_check_refuses_what_cannot_be_a_membership() -> None:
    assert members.check(Membership(voters=())) == "a membership needs at least one voter"
    twice = "a node appears twice in the membership"
    assert members.check(Membership(voters=(Member(A), Member(A)))) == twice
    same_id = Membership(voters=(Member(A, "n1"), Member(B, "n1")))
    assert members.check(same_id) == "two voters have the same node id"
    assert members.check(Membership(voters=(Member(A),), learner=Member(A))) == twice
    assert members.check(THREE) is None


def test_json_round_trip() -> None:
    m = members.plan_add(members.plan_remove(THREE, "n3"), D, "n4", "http://x:1")
    assert Membership.from_json(m.to_json()) == m


# -- apply ----------------------------------------------------------------------------------
def change(h: Harness, lf: int, base: int, new: Membership) -> object:
    cmd = commands.Members(h.rid(), T0, lf, base, "add", "x", new.to_json())
    return h.one(cmd)


def test_apply_records_a_change_made_on_the_membership_it_replaces() -> None:
    h = Harness()
    lf = h.claim()
    assert h.state.members is None
    res = change(h, lf, 0, members.plan_add(THREE, D))
    assert res == Ok(h.index)
    first = h.state.members
    assert first is not None and first.index == h.index and first.learner == Member(D)
    # a change computed from the membership before it: refused, nothing changes
    stale = change(h, lf, 0, members.plan_remove(THREE, "n2"))
    assert isinstance(stale, Rejected) and stale.code == "conflict"
    assert h.state.members == first
    res = change(h, lf, first.index, members.plan_promote(first, D, "n4", ""))
    assert isinstance(res, Ok) and h.state.members is not None
    assert h.state.members.voter_addresses() == {A, B, C, D}


def test_apply_refuses_a_deposed_leader_and_a_bad_membership() -> None:
    h = Harness()
    old = h.claim("n1", 1)
    h.claim("n2", 2)
    res = change(h, old, 0, members.plan_add(THREE, D))
    assert isinstance(res, Rejected) and h.state.members is None
    lf = h.state.leader_fence
    bad = h.one(commands.Members(h.rid(), T0, lf, 0, "add", "x", {"voters": []}))
    assert isinstance(bad, Rejected) and bad.code == "invalid_argument"
    garbled = h.one(commands.Members(h.rid(), T0, lf, 0, "add", "x", {"nope": 1}))
    assert isinstance(garbled, Rejected) and "malformed" in garbled.message
    listed = h.one(commands.Members(h.rid(), T0, lf, 0, "add", "x", [1, 2]))  # type: ignore[arg-type]
    assert isinstance(listed, Rejected) and "malformed" in listed.message
    assert h.state.members is None


def test_the_state_database_keeps_the_membership(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    st = SqlState(path)
    claim = commands.Claim("c", T0, "n1", 1)
    assert apply_entry(st, commands.encode_entry([claim]), 1) is not None
    new = members.plan_add(THREE, D, "n4")
    cmd = commands.Members("m", T0, 1, 0, "add", D, new.to_json())
    applied = apply_entry(st, commands.encode_entry([cmd]), 2)
    assert applied is not None and applied[0] == [Ok(2)]
    if st.in_transaction:
        st.commit()
    st.close()
    again = SqlState(path)
    try:
        assert again.members is not None
        assert again.members.learner == Member(D, "n4") and again.members.index == 2
    finally:
        again.close()


def test_known_ids_and_urls_fill_in_the_voters_and_the_learner_where_missing() -> None:
    partial = Membership(voters=(Member(A, "n1"), Member(B)), learner=Member(D))
    known = [Member(B, "n2", "http://b"), Member(D, "n4", "http://d"), Member(A, "x", "http://a")]
    filled = partial.with_known(known)
    assert filled.voters == (Member(A, "n1", "http://a"), Member(B, "n2", "http://b"))
    assert filled.learner == Member(D, "n4", "http://d")  # what it has is kept, the rest filled
    assert THREE.with_known(known).learner is None
    assert partial.with_known([]) == partial
