"""One node of the bare pysyncobj ceiling cluster (run three; see ``syncobj_ceiling``).

    python syncobj_node.py SELF OTHER1,OTHER2 RESULT_FILE N_ENTRIES

Every node applies no-op entries.  The node that becomes leader submits ``N_ENTRIES`` entries of
one operation each, then ``N_ENTRIES // 10`` entries of 100 operations each (all submitted at once,
counted when their commit callback fires) and writes ``{"entries_per_s", "ops_per_s"}`` to
RESULT_FILE.  Followers exit once that file exists.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated


class Noop(SyncObj):
    def __init__(self, me: str, others: list[str], conf: SyncObjConf) -> None:
        self.ops = 0
        super().__init__(me, others, conf)

    @replicated
    def apply(self, batch: object) -> None:
        self.ops += len(batch) if isinstance(batch, list) else 1


def rate(node: Noop, n: int, payload: object, timeout: float) -> float:
    done = 0
    failed = 0
    finished = threading.Event()

    def cb(_res: object, err: int) -> None:
        nonlocal done, failed
        done += 1
        if err != FAIL_REASON.SUCCESS:
            failed += 1
        if done == n:
            finished.set()

    t0 = time.perf_counter()
    for _ in range(n):
        node.apply(payload, callback=cb)
    if not finished.wait(timeout):
        raise TimeoutError(f"{done}/{n} entries committed after {timeout}s")
    elapsed = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"{failed}/{n} entries failed")
    return n / elapsed


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    me, others, result, n = sys.argv[1], sys.argv[2].split(","), sys.argv[3], int(sys.argv[4])
    conf = SyncObjConf(appendEntriesUseBatch=True, appendEntriesPeriod=0.02, autoTickPeriod=0.01)
    node = Noop(me, others, conf)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(result):
            return 0
        if node._isLeader() and node._getLeader() is not None:
            rate(node, 50, None, 30)  # warm-up: followers connected and caught up
            entries = rate(node, n, None, 60)
            batched = rate(node, max(1, n // 10), list(range(100)), 60) * 100
            tmp = result + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({"entries_per_s": entries, "ops_per_s": batched}, fh)
            os.replace(tmp, result)
            time.sleep(0.5)
            return 0
        time.sleep(0.02)
    print("no leader / no result within 120 s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
