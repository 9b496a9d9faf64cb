"""Concurrency caps across shards: the shares, the ledger of transfers, their commands, the
coordinator's plan, and a shard leader's side (schedd.core.allowances, schedd.leader.core)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedd.core import commands
from schedd.core.allowances import (
    EMPTY,
    CapsLedger,
    ShardCaps,
    Transfer,
    allowance,
    fair_shares,
    plan,
    static_share,
)
from schedd.core.apply import apply_entry
from schedd.core.state import STALE_LEADER, CapsChanged, MemoryState, Ok, Rejected
from schedd.leader.core import Commit
from schedd.protocol import messages
from schedd.protocol.signed import caps_proof
from schedd.storage.sqlstate import SqlState
from tests.unit.test_leader_core import Sim

T0 = 1_800_000_000_000


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8])
def test_the_static_shares_add_up_to_the_cap(shards: int) -> None:
    for cap in range(0, 40):
        shares = [static_share(cap, shards, k) for k in range(shards)]
        assert sum(shares) == cap
        assert max(shares) - min(shares) <= 1


def test_one_shard_has_the_whole_cap_whatever_its_ledger_says() -> None:
    ledger = EMPTY.give(5, "a", 2, 1)
    assert allowance(4, 1, 0, ledger, "a") == 4


def test_a_transfer_is_taken_out_of_one_ledger_and_credited_once_in_the_other() -> None:
    source = EMPTY.give(10, "a", 2, dest=1)
    assert source.moved == {"a": -2}
    assert source.outbox == (Transfer(10, "a", 2, 1),)
    assert allowance(6, 3, 0, source, "a") == 0
    dest = EMPTY.take(0, 10, "a", 2)
    assert dest is not None and dest.moved == {"a": 2} and dest.taken == {0: 10}
    assert allowance(6, 3, 1, dest, "a") == 4
    assert dest.take(0, 10, "a", 2) is None  # the same transfer again
    assert dest.take(0, 7, "a", 2) is None  # an older one: credited before it
    assert source.delivered(1, 10).outbox == ()
    assert source.delivered(2, 10) is source  # another destination's: kept
    assert CapsLedger.from_json(source.to_json()) == source
    assert CapsLedger.from_json(dest.to_json()) == dest


def _claimed() -> MemoryState:
    st = MemoryState()
    apply_entry(st, commands.encode_entry([commands.Claim("c", T0, "n1", 1)]), 1)
    return st


def test_give_take_and_delivered_change_the_ledger_and_tell_the_leader() -> None:
    st = _claimed()
    res, events = apply_entry(
        st, commands.encode_entry([commands.CapsGive("g", T0, 1, "a", 2, 1)]), 2
    )
    assert res == [Ok(2)]  # the transfer's seq: the entry's index
    assert events == [CapsChanged(st.caps)] and st.caps.moved == {"a": -2}
    res, events = apply_entry(
        st, commands.encode_entry([commands.CapsDelivered("d", T0, 1, 1, 2)]), 3
    )
    assert res == [Ok(2)] and st.caps.outbox == () and events == [CapsChanged(st.caps)]
    take = commands.CapsTake("t", T0, 1, 2, 9, "a", 3)
    res, events = apply_entry(st, commands.encode_entry([take]), 4)
    assert res == [Ok(True)] and st.caps.moved == {"a": 1} and events
    take_again = commands.CapsTake("t2", T0, 1, 2, 9, "a", 3)
    res, events = apply_entry(st, commands.encode_entry([take_again]), 5)
    assert res == [Ok(False)] and st.caps.moved == {"a": 1} and events == []


def test_a_give_from_a_deposed_leader_or_of_no_slots_is_refused() -> None:
    st = _claimed()
    [stale], _ = apply_entry(
        st, commands.encode_entry([commands.CapsGive("g", T0, 99, "a", 1, 1)]), 2
    )
    assert isinstance(stale, Rejected) and stale.code == STALE_LEADER
    [none], _ = apply_entry(
        st, commands.encode_entry([commands.CapsGive("g", T0, 1, "a", 0, 1)]), 3
    )
    assert isinstance(none, Rejected)
    assert none.message == "a transfer moves a positive number of slots"
    assert st.caps == EMPTY


def test_the_ledger_is_kept_in_the_database(tmp_path: Path) -> None:
    st = SqlState(tmp_path / "state.db")
    try:
        st.begin()
        for i, cmd in enumerate(
            [
                commands.Claim("c", T0, "n1", 1),
                commands.CapsGive("g", T0, 1, "a", 2, 2),
                commands.CapsTake("t", T0, 1, 1, 40, "b", 1),
            ],
            start=1,
        ):
            apply_entry(st, commands.encode_entry([cmd]), i)
        st.commit()
        kept = st.caps
    finally:
        st.close()
    again = SqlState(tmp_path / "state.db")
    try:
        assert again.caps == kept
        assert kept.moved == {"a": -2, "b": 1} and kept.outbox == (Transfer(2, "a", 2, 2),)
    finally:
        again.close()


def test_fair_shares_split_the_cap_by_demand_and_take_turns_when_slots_are_few() -> None:
    assert fair_shares(6, {0: 10, 1: 10, 2: 0}, 0) == {0: 3, 1: 3, 2: 0}
    # shard 0 wants one: the rest is split, the slot left over by turn (shard 1 first at 0)
    assert fair_shares(6, {0: 1, 1: 10, 2: 10}, 0) == {0: 1, 1: 3, 2: 2}
    assert fair_shares(6, {0: 1, 1: 10, 2: 10}, 1) == {0: 1, 1: 2, 2: 3}
    holders = {k for t in range(3) for k, n in fair_shares(1, {0: 5, 1: 5, 2: 5}, t).items() if n}
    assert holders == {0, 1, 2}  # one slot, three shards: each in turn


def test_the_plan_gives_only_unused_slots_and_limits_the_shard_over_its_share() -> None:
    view = {
        0: ShardCaps(allowance=4, in_use=3, waiting=9),
        1: ShardCaps(allowance=0, in_use=0, waiting=5),
        2: ShardCaps(allowance=0, in_use=0, waiting=0),
    }
    moves, limits = plan(4, view, turn=0)
    assert moves == [(0, 1, 1)]  # its one free slot now
    assert limits == {0: 2}  # and no more than its share, so the next one frees up
    # nothing waits anywhere: nothing moves
    idle = {k: ShardCaps(allowance=v.allowance, in_use=0, waiting=0) for k, v in view.items()}
    assert plan(4, idle, 0) == ([], {})
    # an unreachable shard (not in the view) neither gives nor takes
    assert plan(4, {1: view[1], 2: view[2]}, 0) == ([], {})


def test_a_caps_proof_signs_every_field_but_itself() -> None:
    body = {"op": "give", "at": 5, "namespace": "a"}
    proof = caps_proof(b"k" * 32, body)
    assert caps_proof(b"k" * 32, {**body, "proof": proof}) == proof
    assert caps_proof(b"k" * 32, {**body, "namespace": "b"}) != proof
    assert caps_proof(b"x" * 32, body) != proof
    assert caps_proof(None, body) == ""


# -- a shard's leader -------------------------------------------------------------------------
def _shard(shard: int = 0, cap: int = 3, shards: int = 3) -> Sim:
    return Sim(caps={"default": cap}, shards=shards, shard=shard)


def _leases(sim: Sim) -> int:
    return sum(1 for _, m in sim.sent if isinstance(m, messages.Lease))


def test_a_shard_leases_no_more_than_its_share_of_the_cap() -> None:
    sim = _shard(shard=0, cap=4)  # shares 2, 1, 1
    sim.connect("w1", capacity=10)
    for i in range(5):
        sim.submit(f"J{i}")
    sim.settle()
    assert _leases(sim) == 2
    assert sim.leader.caps_report()["default"] == ShardCaps(allowance=2, in_use=2, waiting=3)


def test_a_leader_gives_only_free_slots_and_leases_none_of_them_meanwhile() -> None:
    sim = _shard(shard=0, cap=6)  # share 2
    sim.connect("w1", capacity=10)
    sim.submit("J1")
    sim.settle()  # one in use, one free
    replies: list[object] = []
    sim.do(sim.leader.give("default", 5, 1, sim.now, replies.append))
    [give] = sim.asked(commands.CapsGive)
    assert give.amount == 1 and give.dest == 1
    sim.submit("J2")  # the free slot is being given: not leased
    sim.tick()
    assert sim.asked(commands.LeaseRuns) == []
    sim.commit()
    assert replies == [Ok((sim.state.caps.outbox[0].seq, 1))]
    assert sim.state.caps.moved == {"default": -1}
    assert sim.leader.caps_report()["default"].allowance == 1
    sim.settle()
    assert _leases(sim) == 1  # J2 still waits: the shard's one slot is J1's


def test_a_give_that_is_not_committed_gives_the_slot_back_to_the_shard() -> None:
    sim = _shard(shard=0, cap=6)
    sim.connect("w1", capacity=10)
    replies: list[object] = []
    sim.do(sim.leader.give("default", 1, 2, sim.now, replies.append))
    sim.lose()
    assert replies == [None]
    assert sim.leader.caps_report()["default"].allowance == 2
    sim.submit("J1")
    sim.submit("J2")
    sim.settle()
    assert _leases(sim) == 2


def test_slots_credited_to_a_shard_are_leased_at_once() -> None:
    sim = _shard(shard=2, cap=2)  # share 0
    sim.connect("w1", capacity=10)
    sim.submit("J1")
    sim.settle()
    assert _leases(sim) == 0
    sim.log(commands.CapsTake("t", sim.wall, sim.leader.fence, 0, 7, "default", 1))
    sim.settle()
    assert _leases(sim) == 1


def test_a_soft_limit_holds_back_a_shards_freed_slots_until_it_lapses() -> None:
    sim = _shard(shard=0, cap=3)  # share 1
    conn = sim.connect("w1", capacity=10)
    sim.submit("J1")
    sim.submit("J2")
    sim.settle()
    lease = sim.only_lease(conn)
    sim.do(sim.leader.limit_caps({"default": 0}, 3.0, sim.now))
    sim.do(sim.leader.finish(conn, messages.Complete(lease.run_id, lease.fence), sim.now))
    sim.settle()
    assert _leases(sim) == 1  # the freed slot is not used again: it is to be given away
    sim.advance(3.1)
    sim.settle()
    assert _leases(sim) == 2  # no coordinator said it again: the shard's own again


def test_a_new_leader_starts_from_its_log() -> None:
    sim = _shard(shard=1, cap=3)  # share 1
    sim.log(commands.CapsTake("t", sim.wall, sim.leader.fence, 0, 7, "default", 2))
    again = Sim(sim.state, caps={"default": 3}, shards=3, shard=1)
    assert again.leader.caps_report()["default"].allowance == 3
    assert not any(isinstance(p, Commit) for p in again.pending)


def test_a_restored_shard_starts_from_its_share_again(tmp_path: Path) -> None:
    """The shards' images in one backup are taken at different moments: a transfer given in
    one and credited in another could count twice, so a restore forgets every ledger."""
    from schedd.raft.snapshots import restore_data_dir
    from schedd.storage import snapshots

    live = tmp_path / "src" / "state.db"
    live.parent.mkdir()
    st = SqlState(live)
    st.begin()
    apply_entry(st, commands.encode_entry([commands.Claim("c", T0, "n1", 1)]), 1)
    apply_entry(st, commands.encode_entry([commands.CapsGive("g", T0, 1, "a", 1, 2)]), 2)
    st.commit()
    assert st.caps != EMPTY
    st.close()
    image = tmp_path / "backup.snap"
    with snapshots.ImageSource(live, rate=1e12) as source:
        snapshots.write_image(iter(source), image)
    raft_dir = tmp_path / "n1" / "raft"
    restore_data_dir(image, raft_dir, None, ["127.0.0.1:7001"])
    restored = SqlState(raft_dir / "state.db")
    try:
        assert restored.caps == EMPTY
        assert restored.applied_index == 2
    finally:
        restored.close()


@pytest.mark.parametrize(
    "cmd",
    [
        commands.CapsGive("g", T0, 1, "a", 1, "x"),  # type: ignore[arg-type]
        commands.CapsTake("t", T0, 1, 0, 7.5, "a", 1),  # type: ignore[arg-type]
        commands.CapsDelivered("d", T0, 1, True, 3),  # type: ignore[arg-type]
        commands.CapsGive("g", T0, 1, "a", -1, 2),
    ],
)
def test_a_transfer_of_anything_but_integers_is_refused_and_kept_out_of_the_ledger(
    tmp_path: Path, cmd: commands.Command
) -> None:
    """The ledger is read back at every start: a value that is not an integer in it would
    stop the node there."""
    st = SqlState(tmp_path / "state.db")
    try:
        st.begin()
        apply_entry(st, commands.encode_entry([commands.Claim("c", T0, "n1", 1)]), 1)
        [res], events = apply_entry(st, commands.encode_entry([cmd]), 2)
        st.commit()
        assert isinstance(res, Rejected) and events == []
        assert st.caps == EMPTY
    finally:
        st.close()
    SqlState(tmp_path / "state.db").close()  # and it opens again
