"""Huey peer (runs inside bench-results/envs/huey): SqliteHuey, no-op tasks.

    python huey_bench.py WORKDIR N

Enqueues N no-op tasks in a tight loop with the consumer stopped (enqueue rate), then starts one
``huey_consumer`` process with one worker thread and times from the first task's start to the last
one's end (drain rate; a marker task before and after the N, FIFO with one worker).
Prints one JSON line.  The consumer is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

TASKS = """
import os, time
from huey import SqliteHuey
huey = SqliteHuey("bench", filename=os.environ["BENCH_HUEY_DB"], results=False)

@huey.task()
def noop(i):
    return None

@huey.task()
def mark(path):
    t = time.time()
    with open(path + ".tmp", "w") as fh:
        fh.write(repr(t))
    os.replace(path + ".tmp", path)
"""


def main() -> int:
    import signal

    def _exit(*_: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _exit)
    work, n = Path(sys.argv[1]), int(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    db = work / f"huey-{time.monotonic_ns()}.db"
    (work / "hueytasks.py").write_text(TASKS)
    os.environ["BENCH_HUEY_DB"] = str(db)
    sys.path.insert(0, str(work))
    import hueytasks  # type: ignore[import-not-found]

    start_mark, end_mark = str(work / "start.mark"), str(work / "end.mark")
    for p in (start_mark, end_mark):
        if os.path.exists(p):
            os.remove(p)
    hueytasks.mark(start_mark)
    t0 = time.perf_counter()
    for i in range(n):
        hueytasks.noop(i)
    enqueue = n / (time.perf_counter() - t0)
    hueytasks.mark(end_mark)

    env = dict(os.environ, PYTHONPATH=str(work))
    log = open(work / "huey-consumer.log", "ab")
    consumer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "huey.bin.huey_consumer",
            "hueytasks.huey",
            "-w",
            "1",
            "-k",
            "thread",
            "-q",
        ],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(end_mark):
            if consumer.poll() is not None:
                raise RuntimeError(f"huey consumer exited {consumer.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("huey drain did not finish")
            time.sleep(0.01)
        t_start = float(Path(start_mark).read_text())
        t_end = float(Path(end_mark).read_text())
    finally:
        if consumer.poll() is None:
            consumer.terminate()
            try:
                consumer.wait(10)
            except subprocess.TimeoutExpired:
                consumer.kill()
                consumer.wait(5)
    db.unlink(missing_ok=True)
    print(json.dumps({"huey_enqueue": enqueue, "huey_drain": n / (t_end - t_start)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
