"""Celery 5 + Redis peer (runs inside bench-results/envs/celery), no-op tasks.

    python celery_bench.py WORKDIR REDIS_URL N

Enqueues N no-op tasks in a tight loop with no worker running (enqueue rate), then starts one
``celery worker`` process (solo pool: one process, tasks one at a time) and times from the first
task's start to the last one's end (drain rate; a marker task before and after the N).
Prints one JSON line.  The worker is stopped by its PID.
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
from celery import Celery
app = Celery("bench", broker=os.environ["BENCH_REDIS"])
app.conf.task_ignore_result = True
app.conf.worker_hijack_root_logger = False
app.conf.broker_connection_retry_on_startup = True

@app.task
def noop(i):
    return None

@app.task
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
    work, url, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    (work / "celerytasks.py").write_text(TASKS)
    os.environ["BENCH_REDIS"] = url
    sys.path.insert(0, str(work))
    import celerytasks  # type: ignore[import-not-found]

    start_mark, end_mark = str(work / "start.mark"), str(work / "end.mark")
    for p in (start_mark, end_mark):
        if os.path.exists(p):
            os.remove(p)
    celerytasks.mark.delay(start_mark)
    t0 = time.perf_counter()
    for i in range(n):
        celerytasks.noop.delay(i)
    enqueue = n / (time.perf_counter() - t0)
    celerytasks.mark.delay(end_mark)

    env = dict(os.environ, PYTHONPATH=str(work))
    log = open(work / "celery-worker.log", "ab")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celerytasks",
            "worker",
            "-P",
            "solo",
            "-c",
            "1",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
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
            if worker.poll() is not None:
                raise RuntimeError(f"celery worker exited {worker.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("celery drain did not finish")
            time.sleep(0.01)
        t_start = float(Path(start_mark).read_text())
        t_end = float(Path(end_mark).read_text())
    finally:
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
    print(json.dumps({"celery_enqueue": enqueue, "celery_drain": n / (t_end - t_start)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
