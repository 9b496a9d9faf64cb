"""``Worker.run()`` in a program that never configured logging still says where it connects
(on stderr); a program that configured logging gets the lines its own way."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time

SCRIPT = """
import logging, sys
from schedd.worker import Worker
if sys.argv[1] == "cli":  # the schedd-worker program
    from schedd.cli.worker import main
    sys.exit(main(["--server", "http://127.0.0.1:9", "--token", "t", "--worker-id", "w-log"]))
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING, format="CONFIGURED %(message)s")
Worker(["http://127.0.0.1:9"], token="t", worker_id="w-log").run()
"""


def first_lines(mode: str, wanted: str, timeout: float = 15) -> str:
    """stderr of a worker script until a line holds ``wanted`` or ``timeout`` passes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    seen = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while wanted.encode() not in seen and time.monotonic() < deadline:
            if sel.select(max(0.0, deadline - time.monotonic())):
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        sel.close()
        proc.stderr.close()
    return seen.decode(errors="replace")


def test_run_says_where_it_connects_when_logging_is_not_configured() -> None:
    text = first_lines("bare", "worker.start")
    assert "worker.start worker_id=w-log servers=http://127.0.0.1:9" in text, text
    assert "INFO schedd.worker.client" in text


def test_run_leaves_configured_logging_alone() -> None:
    text = first_lines("configured", "cannot reach", timeout=8)
    assert "worker.start" not in text, text  # INFO is below the program's WARNING
    assert "INFO schedd.worker.client" not in text


def test_the_worker_program_logs_as_the_nodes_do() -> None:
    """schedd-worker's lines read like a node's: UTC with milliseconds and a Z, then the level,
    the logger and the event with its fields."""
    text = first_lines("cli", "worker.start")
    line = next(x for x in text.splitlines() if "worker.start" in x)
    assert re.match(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO schedd\.worker\.client worker\.start ", line
    ), line
