"""``schedd inspect``, the installed binary, on a real node's data directory: while the node runs
it reads it all the same and says it runs; once the node is stopped it leads with the applied
index and its term, counts what was submitted, and changes nothing in the directory."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from schedd.auth import ensure_admin_token
from tests.cluster.harness import BIN, REPO
from tests.conftest import free_port
from tests.integration.test_restore_command import node_args
from tests.unit.test_inspect_cli import files_of

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

JOBS = 5


def call(url: str, token: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        url + "/api/v1" + path,
        data=None if body is None else orjson.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return orjson.loads(r.read())


def wait_serving(url: str, token: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        try:
            if call(url, token, "/cluster").get("role") == "leader":
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the node did not serve within 30 s")


def inspect(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "schedd"), "inspect", "--data-dir", str(data), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_inspect_a_node_running_then_stopped(tmp_path: Path) -> None:
    data, port = tmp_path / "n1", free_port()
    token, _ = ensure_admin_token(data / "tokens.toml")
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "n1.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDD_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")  # this tree's schedd
    argv = [str(BIN / "schedd"), *node_args(data, port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_serving(url, token, proc, log)
        for i in range(JOBS):
            call(url, token, "/jobs", {"task": "t", "payload": {"i": i}, "schedule": {"in": "1h"}})
        seen = call(url, token, "/cluster")["applied_index"]

        running = inspect(data)
        assert running.returncode == 0, running.stderr
        lines = running.stdout.splitlines()
        assert lines[0].startswith("applied index ")
        assert f"(RUNNING: process {proc.pid} has its state open;" in lines[1]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    before = files_of(data)
    stopped = inspect(data, "-o", "json")
    assert (stopped.returncode, stopped.stderr) == (0, "")
    report = orjson.loads(stopped.stdout)
    applied = report["applied"]
    assert applied["index"] >= seen and applied["term_from"] == "journal"
    assert applied["term"] == report["journal"]["current_term"] == report["journal"]["last_term"]
    assert report["journal"]["last_index"] >= applied["index"]
    assert report["state"]["counts"] == {"jobs": JOBS, "runs": JOBS, "dead_letters": 0}
    assert (report["running"], report["problems"]) == (False, [])

    text = inspect(data)
    assert (text.returncode, text.stderr) == (0, "")
    assert text.stdout.startswith(f"applied index {applied['index']} (term {applied['term']})")
    assert "the node is stopped" in text.stdout.splitlines()[1]
    assert files_of(data) == before
