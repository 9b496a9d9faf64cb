"""In-process CPU per run of the leader's decisions (schedd.leader.core.LeaderCore over an
in-memory state, the real ``apply`` between them, no Raft, no sockets): N one-off jobs
submitted, then fired, leased to one worker and completed, each command committed as the
leader asks; with a concurrency cap on the namespace (the caps' bookkeeping runs for every
lease and every end).  Medians of RUNS, one tree at a time:

    PYTHONPATH=TREE .venv/bin/python TREE/scripts/benchlib/leader_core_cpu.py [RUNS]"""

import gc
import statistics
import sys
import time

from schedd.protocol import messages
from tests.unit.test_leader_core import Sim

N = 4000


def run() -> tuple[float, float]:
    sim = Sim(caps={"default": 10**6})
    conn = sim.connect("w1", capacity=10**6)
    gc.collect()
    gc.disable()  # (a node runs with its heap frozen and the collector tuned: schedd.gcpolicy)
    t0 = time.process_time()
    for i in range(N):
        sim.submit(f"J{i}")
    t1 = time.process_time()
    for _ in range(200):  # fire and lease everything
        sim.tick()
        if not sim.pending:
            break
        sim.commit()
    leases = [m for c, m in sim.sent if c is conn and isinstance(m, messages.Lease)]
    assert len(leases) == N, len(leases)
    for lease in leases:
        sim.do(sim.leader.finish(conn, messages.Complete(lease.run_id, lease.fence), sim.now))
    sim.commit()
    t2 = time.process_time()
    gc.enable()
    return 1e6 * (t1 - t0) / N, 1e6 * (t2 - t1) / N


if __name__ == "__main__":
    subs, lives = [], []
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
        a, b = run()
        subs.append(a)
        lives.append(b)
    print(
        f"submit median {statistics.median(subs):.1f} us/run ({', '.join(f'{v:.1f}' for v in subs)})"
    )
    print(
        "fire+lease+complete median "
        f"{statistics.median(lives):.1f} us/run ({', '.join(f'{v:.1f}' for v in lives)})"
    )
