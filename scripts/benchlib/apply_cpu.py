"""In-process CPU per job of applying submit entries on the SQLite state (one tree at a time).

    PYTHONPATH=TREE .venv/bin/python TREE/scripts/benchlib/apply_cpu.py

S1-like: entries of 8 single-job submits; S1b-like: entries of one 1,000-job submit.  Modes:
'decode' (the entry decoded, as a follower does), where the tree has it 'held' (the commands
the leader held), and 'feed' (held, with the change feed a node keeps for ``GET /events``
recording what each entry changed, as every node does)."""

import inspect
import statistics
import tempfile
import time
from pathlib import Path

from schedd import clock
from schedd.core import commands
from schedd.core.validate import parse_job
from schedd.ids import new_job_id, new_request_id
from schedd.storage.sqlstate import SqlState, apply_entry

HELD = "decoded" in inspect.signature(apply_entry).parameters


def with_feed(st: SqlState) -> None:
    """Record the changes as a node does (schedd.raft.node.RaftNode)."""
    from schedd.core.events import ChangeLog
    from schedd.raft.feed import EventFeed

    feed = EventFeed(10_000, st.committed_index, gated=True)
    st.changes = ChangeLog(feed.append)
    st.on_commit = feed.visible_upto


def entries(kind: str, n_jobs: int) -> list[list[commands.Command]]:
    now = clock.wall_ms()
    out = []
    if kind == "single":
        for _ in range(n_jobs // 8):
            out.append(
                [
                    commands.Submit(
                        new_request_id(),
                        now,
                        (
                            (
                                new_job_id(now),
                                parse_job(
                                    {"task": "bench.noop", "schedule": {"in": "1h"}}, now_ms=now
                                ),
                            ),
                        ),
                    )
                    for _ in range(8)
                ]
            )
    else:
        for _ in range(n_jobs // 1000):
            jobs = tuple(
                (
                    new_job_id(now),
                    parse_job({"task": "bench.noop", "schedule": {"in": "1h"}}, now_ms=now),
                )
                for _ in range(1000)
            )
            out.append([commands.Submit(new_request_id(), now, jobs)])
    return out


def run(kind: str, mode: str, n_jobs: int) -> float:
    batches = entries(kind, n_jobs)
    blobs = [commands.encode_entry(b) for b in batches]
    with tempfile.TemporaryDirectory() as tmp:
        st = SqlState(Path(tmp) / "state.db")
        if mode == "feed":
            with_feed(st)
        apply_entry(st, commands.encode_entry([commands.Claim("c", clock.wall_ms(), "n1", 1)]), 1)
        t0 = time.process_time()
        for i, (blob, cmds) in enumerate(zip(blobs, batches, strict=False), start=2):
            if mode in ("held", "feed"):
                apply_entry(st, blob, i, commit=(i % 8 == 0), decoded=cmds)
            else:
                apply_entry(st, blob, i, commit=(i % 8 == 0))
        st.commit() if st.in_transaction else None
        used = time.process_time() - t0
        st.close()
    return 1e6 * used / n_jobs


if __name__ == "__main__":
    for kind, n in (("single", 8000), ("batch", 20000)):
        for mode in ("decode", "held", "feed") if HELD else ("decode",):
            vals = [run(kind, mode, n) for _ in range(5)]
            print(
                f"{kind:6} {mode:6} median {statistics.median(vals):6.1f} us/job  "
                f"({', '.join(f'{v:.1f}' for v in vals)})"
            )
