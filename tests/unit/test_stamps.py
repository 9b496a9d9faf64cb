"""Stamps: in a cluster of several shards each entry gets a number chosen in ``apply`` from the
entry alone, greater than the one before and at least its time in ms shifted left, so that
every node gives an entry the same stamp, a stamp survives a restart (the database keeps it),
and the change feed's positions (GET /events ids) compare across shards."""

from __future__ import annotations

from pathlib import Path

from schedd.core import commands
from schedd.core.events import MAX_INDEX, STAMP_SHIFT, ChangeLog, next_stamp, stamp_of_ms
from schedd.core.model import JobSpec
from schedd.storage.sqlstate import SqlState, apply_entry

T0 = 1_790_000_000_000


def test_a_stamp_grows_with_the_log_and_keeps_up_with_the_clock() -> None:
    base = stamp_of_ms(T0)
    assert stamp_of_ms(T0 + 1) - base == 1 << STAMP_SHIFT  # a millisecond's worth of room
    assert next_stamp(0, T0) == base
    assert next_stamp(base, T0) == base + 1  # the same ms: one more
    ahead = stamp_of_ms(T0 + 5_000)  # the previous entry's clock was ahead
    assert next_stamp(ahead, T0) == ahead + 1  # never backwards
    assert next_stamp(7, -1) == 8 and next_stamp(7, 0) == 8
    assert next_stamp(MAX_INDEX, T0) == MAX_INDEX  # never past what a client may give
    assert next_stamp(0, 1 << 62) == MAX_INDEX
    # exact as a JavaScript number (JSON in a browser) until 2094
    assert stamp_of_ms(3_900_000_000_000) < 1 << 53  # (2093-08-01)


def entries() -> list[bytes]:
    submit = commands.Submit("r1", T0 + 10, (("J1", JobSpec(task="t")),))
    return [
        commands.encode_entry([commands.Barrier("b1", T0)]),
        commands.encode_entry([commands.Barrier("b2", T0)]),  # the same ms
        commands.encode_entry([submit]),
        b"garbage",  # undecodable: a stamp all the same
        commands.encode_entry([commands.Barrier("b3", T0 - 60_000)]),  # a clock behind
    ]


def stamped_state(path: Path, positions: list[int]) -> SqlState:
    state = SqlState(path)
    state.stamped = True
    state.changes = ChangeLog(lambda position, changes: positions.append(position))
    return state


def test_every_node_stamps_an_entry_alike_and_the_database_keeps_it(tmp_path: Path) -> None:
    seen: list[list[int]] = [[], []]
    committed: list[int] = []
    nodes = [stamped_state(tmp_path / f"n{k}.db", seen[k]) for k in range(2)]
    nodes[0].on_commit = committed.append
    stamps: list[list[int]] = [[], []]
    for index, blob in enumerate(entries(), start=1):
        for k, state in enumerate(nodes):
            apply_entry(state, blob, index)
            stamps[k].append(state.stamp)
    base, submitted = stamp_of_ms(T0), stamp_of_ms(T0 + 10)
    assert stamps[0] == [base, base + 1, submitted, submitted + 1, submitted + 2]
    assert stamps[1] == stamps[0]  # the same on every node
    assert seen[0] == [submitted]  # the feed's position: the submit's stamp
    assert committed == stamps[0]  # what the reads see, as a position
    assert nodes[0].committed_position == stamps[0][-1]
    for state in nodes:
        state.close()

    again = SqlState(tmp_path / "n0.db")  # a restart: the stamp is where it was
    again.stamped = True
    assert again.stamp == stamps[0][-1] and again.committed_position == stamps[0][-1]
    apply_entry(again, commands.encode_entry([commands.Barrier("b4", T0)]), 6)
    assert again.stamp == stamps[0][-1] + 1
    again.close()


def test_one_shard_keeps_indexes_as_positions(tmp_path: Path) -> None:
    positions: list[int] = []
    state = SqlState(tmp_path / "one.db")
    state.changes = ChangeLog(lambda position, changes: positions.append(position))
    for index, blob in enumerate(entries(), start=1):
        apply_entry(state, blob, index)
    assert state.stamp == 0 and positions == [3] and state.committed_position == 5
    state.close()
