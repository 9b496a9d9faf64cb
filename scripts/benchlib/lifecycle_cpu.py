"""In-process CPU per job of a one-off job's whole life on the SQLite state: submitted (entries
of 8 jobs), then fired, leased and completed (entries of 100 runs each); medians of RUNS.

    PYTHONPATH=TREE .venv/bin/python scripts/benchlib/lifecycle_cpu.py [RUNS]"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

from schedd import clock
from schedd.core import commands
from schedd.core.validate import parse_job
from schedd.ids import new_job_id, new_request_id
from schedd.storage.sqlstate import SqlState, apply_entry

N = 8000


def run() -> tuple[float, float]:
    now = clock.wall_ms()
    ids = [new_job_id(now) for _ in range(N)]
    spec = parse_job({"task": "bench.noop"}, now_ms=now)
    with tempfile.TemporaryDirectory() as tmp:
        st = SqlState(Path(tmp) / "state.db")
        idx = 1

        def app(cmds):
            nonlocal idx
            idx += 1
            assert (
                apply_entry(st, commands.encode_entry(cmds), idx, commit=(idx % 8 == 0)) is not None
            )

        apply_entry(st, commands.encode_entry([commands.Claim("c", now, "n1", 1)]), 1)
        t0 = time.process_time()
        for k in range(0, N, 8):
            app([commands.Submit(new_request_id(), now, ((i, spec),)) for i in ids[k : k + 8]])
        t1 = time.process_time()
        runs = [st.latest_run(i).id for i in ids]
        t2 = time.process_time()
        for k in range(0, N, 100):
            app([commands.Fire(new_request_id(), now + 1, 1, tuple(runs[k : k + 100]))])
        for k in range(0, N, 100):
            app(
                [
                    commands.LeaseRuns(
                        new_request_id(), now + 2, 1, tuple((r, "w") for r in runs[k : k + 100])
                    )
                ]
            )
        for k in range(0, N, 100):
            fence = [st.runs[r].attempts[-1].fence for r in runs[k : k + 100]]
            app(
                [
                    commands.CompleteRun(new_request_id(), now + 3, 1, r, f, None)
                    for r, f in zip(runs[k : k + 100], fence, strict=False)
                ]
            )
        if st.in_transaction:
            st.commit()
        t3 = time.process_time()
        st.close()
    return 1e6 * (t1 - t0) / N, 1e6 * (t3 - t2) / N


if __name__ == "__main__":
    subs, lives = [], []
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
        a, b = run()
        subs.append(a)
        lives.append(b)
    print(
        f"submit median {statistics.median(subs):.1f} us/job ({', '.join(f'{v:.1f}' for v in subs)})"
    )
    print(
        f"fire+lease+complete median {statistics.median(lives):.1f} us/job ({', '.join(f'{v:.1f}' for v in lives)})"
    )
