"""The README's "Using it" block, pasted as it is into a shell in an empty directory: every
command succeeds, the worker runs the demo job, and nothing is left running."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.harness import REPO

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]


def using_it_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it") :]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None
    # a line that needs a value the reader fills in (<job id>) is not pasted
    return [line for line in block.group(1).splitlines() if line.strip() and "<" not in line]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_group(pgid: int) -> None:
    """SIGTERM every process of the group (the shell, schedd, the worker), SIGKILL after 20 s."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def test_the_readme_quick_start_works_when_pasted_as_is(tmp_path: Path) -> None:
    if not (port_free(7700) and port_free(7701)):
        pytest.skip("the quick start's ports 7700/7701 are in use on this machine")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    lines = using_it_block()
    assert any(line.startswith(".venv/bin/schedd &") for line in lines)
    # As pasted: one command after the other, stopping at the first that fails; then wait for
    # the demo job to be done.
    script = (
        "set -e\n"
        + "\n".join(lines)
        + "\n"
        + (
            "for _ in $(seq 150); do\n"
            "  .venv/bin/schedctl list | grep demo.echo | grep -q done && exit 0\n"
            "  sleep 0.2\n"
            "done\n"
            "exit 7\n"
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDD_")}
    log = tmp_path / "pasted.log"
    with log.open("wb") as out:  # a file, not a pipe: the daemons it starts keep theirs open
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the daemon and the worker it starts share its group
        )
    try:
        code = proc.wait(timeout=90)
    finally:
        stop_group(proc.pid)
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert (tmp_path / ".schedd" / "tokens.toml").exists()
