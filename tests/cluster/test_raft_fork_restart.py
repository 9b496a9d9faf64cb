"""A node SIGKILLed while its forked snapshot writer is writing restarts at once on the same
ports, and the writer does not outlive it (RELIABILITY.md; schedd/raft/forksafe.py).

The writer is made to stay in its write for as long as the test needs, whatever the size of the
state: before the cluster starts, the victim's ``raft.dump.tmp`` (the file pysyncobj's child
opens for writing) is made a FIFO, so the child blocks in ``open()`` -- after the at-fork hook,
before it writes a byte.  Before the fix that child kept the HTTP and Raft listening sockets
and the restarted node exited with "address already in use" for as long as the child lived
(here, forever)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.cluster.harness import Cluster
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

VICTIM = 2  # n3


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid``, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _children(ppid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[1] == ppid:
                out.append(int(name))
    return out


def _in_fifo_open(pid: int) -> bool:
    """The writer is blocked opening the FIFO (``wait_for_partner``); True as well where the
    kernel hides wchan (the test's assertions hold at any point of the child's life)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        return True
    return wchan in ("", "0", "wait_for_partner")


def _gone(pid: int) -> bool:
    st = _stat(pid)
    return st is None or st[0] in ("Z", "X")  # a zombie holds no descriptors


async def test_a_node_killed_while_its_snapshot_writer_runs_restarts_on_its_ports(
        tmp_path: Path) -> None:
    # Compaction due after 20 entries; every node is in its logCompactionSplit slot for 0.2 s
    # of every 2 s.
    cluster = Cluster(tmp_path / "c", raft={"log_compaction_min_entries": 20,
                                            "log_compaction_min_time": "2s"})
    node = cluster.nodes[VICTIM]
    fifo = tmp_path / "c" / node.node_id / "raft" / "raft.dump.tmp"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    writer = 0
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_leader(http)
            assert node.proc is not None
            pid = node.proc.pid
            body = orjson.dumps({"task": "acc.record", "schedule": {"in": "1h"}})
            deadline = time.monotonic() + 30
            while not (children := _children(pid)):
                assert time.monotonic() < deadline, f"n3 never started a snapshot\n{cluster.logs()}"
                url = cluster.urls[await cluster.wait_leader(http)]
                async with http.post(url + "/api/v1/jobs", data=body,
                                     headers=cluster.headers()) as r:
                    assert r.status == 201, await r.text()
            assert len(children) == 1, children
            writer = children[0]
            await wait_for(lambda: _in_fifo_open(writer), timeout=10)

            cluster.kill(VICTIM, signal.SIGKILL)  # (waits for it)
            fifo.unlink()  # the restarted node writes its snapshots normally
            killed = time.monotonic()

            cluster.start(VICTIM)
            assert node.proc is not None and node.proc.pid != pid

            async def up() -> bool:
                assert node.alive, f"the restarted node exited\n{cluster.logs()}"
                return await cluster.view(http, VICTIM) is not None

            await wait_for(up, timeout=30, interval=0.1)
            print(f"n3 answered {time.monotonic() - killed:.1f}s after its SIGKILL")
            # killed with its node (PR_SET_PDEATHSIG), not left writing next to the new process
            await wait_for(lambda: _gone(writer), timeout=5)

            # It rejoins: it applies what the leader commits after its restart.
            leader = await cluster.wait_leader(http)
            url = cluster.urls[leader]
            async with http.post(url + "/api/v1/jobs", data=body, headers=cluster.headers()) as r:
                assert r.status == 201, await r.text()
            lv = await cluster.view(http, leader)
            assert lv is not None
            target = lv["commit_index"]

            async def caught_up() -> bool:
                v = await cluster.view(http, VICTIM)
                return v is not None and v["applied_index"] >= target

            await wait_for(caught_up, timeout=30, interval=0.1)
            assert node.alive
    finally:
        cluster.stop()
        if writer and not _gone(writer):  # before the fix: blocked in open() for good
            os.kill(writer, signal.SIGKILL)
