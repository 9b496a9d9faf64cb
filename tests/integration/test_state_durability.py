"""The state database after a crash: a process SIGKILLed in the middle of applying entries, and
a write-ahead log cut short (a torn write), both leave a database that opens, holds a whole
prefix of the entries (never half an entry) with its applied index, and answers exactly as the
same prefix applied in memory; replaying the rest from there gives the same state again."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedd.core import commands
from schedd.core.apply import apply_entry
from schedd.core.model import JobSpec, RetryPolicy, Schedule, ScheduleKind
from schedd.core.state import MemoryState
from schedd.storage.sqlstate import SqlState
from schedd.storage.sqlstate import apply_entry as sql_apply_entry
from tests.property.test_sql_state_property import answers

T0 = 1_800_000_000_000
ENTRIES = 150


@functools.cache
def entries() -> list[bytes]:
    """Big entries (a claim, then batches of 100 submits, fires and leases) so that a kill
    lands inside one more often than not."""
    out = [commands.encode_entry([commands.Claim("claim", T0, "n1", 1)])]
    for i in range(1, ENTRIES):
        jobs = tuple(
            (
                f"J{i}-{k}",
                JobSpec(
                    task="t",
                    payload={"k": k, "pad": "x" * 100},
                    retry=RetryPolicy(max_attempts=2),
                    schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + i),
                ),
            )
            for k in range(100)
        )
        cmds: list[commands.Command] = [commands.Submit(f"s{i}", T0 + i, jobs)]
        if i > 1:
            prev = tuple(f"J{i - 1}-{k}@{T0 + i - 1}" for k in range(100))
            cmds.append(commands.Fire(f"f{i}", T0 + i, 1, prev))
            cmds.append(commands.LeaseRuns(f"l{i}", T0 + i, 1, tuple((r, "w1") for r in prev)))
        out.append(commands.encode_entry(cmds))
    return out


WRITER = """
import sys
from tests.integration.test_state_durability import entries
from schedd.storage.sqlstate import SqlState, apply_entry
state = SqlState(sys.argv[1])
blobs = entries()
print("ready", flush=True)
for i, blob in enumerate(blobs, start=1):
    apply_entry(state, blob, i)
print("done", flush=True)
"""


def reference(upto: int) -> MemoryState:
    mem = MemoryState()
    for i, blob in enumerate(entries()[:upto], start=1):
        apply_entry(mem, blob, i)
    return mem


@pytest.mark.long  # a failure scenario: the fault-injection tier (scripts/test --long)
@pytest.mark.timeout(180)
def test_a_node_killed_while_applying_keeps_a_whole_prefix_of_the_entries(tmp_path: Path) -> None:
    rnd = random.Random(7)
    path = tmp_path / "state.db"
    root = Path(__file__).resolve().parents[2]
    kills = []
    for attempt in range(4):
        with subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
        ) as proc:
            try:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                time.sleep(rnd.uniform(0.05, 1.5))
                proc.send_signal(signal.SIGKILL)
            finally:
                proc.kill()
                proc.wait(10)
        state = SqlState(path)
        try:
            kills.append(state.applied_index)
            assert answers(state) == answers(reference(state.applied_index)), attempt
        finally:
            state.close()
    assert any(0 < k < ENTRIES for k in kills), kills  # at least one kill landed mid-way
    # Replaying from the start (as the journal does) skips what the database holds, then goes on.
    state = SqlState(path)
    try:
        for i, blob in enumerate(entries(), start=1):
            assert (sql_apply_entry(state, blob, i) is None) == (i <= kills[-1])
        assert answers(state) == answers(reference(ENTRIES))
    finally:
        state.close()


@pytest.mark.parametrize("cut", [1, 100, 4096 + 17, 0.5])
def test_a_torn_write_ahead_log_loses_only_whole_entries(tmp_path: Path, cut: float) -> None:
    live = tmp_path / "live.db"
    blobs = entries()[:40]
    state = SqlState(live)
    state.db.execute("PRAGMA wal_autocheckpoint = 0")  # everything stays in the log
    for i, blob in enumerate(blobs, start=1):
        sql_apply_entry(state, blob, i)
    # A power cut: what is on disk is the database file and the log as written so far, less
    # the last bytes of the log, which never reached the disk.
    data, wal = live.read_bytes(), Path(f"{live}-wal").read_bytes()
    state.close()
    assert len(wal) > 8192
    path = tmp_path / "state.db"
    path.write_bytes(data)
    keep = int(len(wal) * cut) if isinstance(cut, float) else len(wal) - cut
    Path(f"{path}-wal").write_bytes(wal[:keep])
    state = SqlState(path)
    try:
        assert 0 <= state.applied_index < len(blobs)
        assert answers(state) == answers(reference(state.applied_index))
        for i, blob in enumerate(blobs, start=1):
            sql_apply_entry(state, blob, i)
        assert answers(state) == answers(reference(len(blobs)))
    finally:
        state.close()
