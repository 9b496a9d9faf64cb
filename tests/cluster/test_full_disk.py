"""A node's disk fills up under load.  schedd stops such a node at the first failed write or
sync (fail-fast, as PostgreSQL does after a failed fsync: a later sync could succeed although
the data is gone, so nothing may be acknowledged after it), with one CRITICAL line naming the
file and the room left; the other two go on.  Restarted while the disk is still full - as
systemd restarts it - it stops again and damages nothing; once space is freed, the next
restart brings it back by itself: nothing acknowledged lost, every replica the same.

The whole data directory on a size-limited tmpfs (the leader's, a follower's: whichever file
the next write goes to hits the limit), and the journal, then the state database, as the file
that hits it (a lossy FUSE mount that fails only that file's writes, tests/cluster/lossyfs.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.lossyfs import available as lossy_unavailable
from tests.cluster.lossyfs import lossy_cluster
from tests.cluster.test_failover import submit
from tests.cluster.test_restart import all_visible
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root"
    ),
    pytest.mark.long,  # the fault-injection tier (scripts/test --long)
]

FS_MB = 256  # each node's data directory: the two that stay up must not fill as well
LEFT_KB = 384  # what the ballast leaves free on the node that fills up
PAYLOAD = {"blob": "x" * 2048}  # per job: a journal record and a row of this size


@contextlib.contextmanager
def tmpfs(path: Path, mb: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path, leave_kb: int) -> Path:
    """Write a ballast file until only ``leave_kb`` KiB are free; returns it."""
    ballast = directory / "ballast"
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    with open(ballast, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        left = free - leave_kb * 1024
        while left > 0:
            f.write(chunk[: min(len(chunk), left)])
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return ballast


async def load_until_dead(
    http: aiohttp.ClientSession, cluster: Cluster, i: int, acked: list[str], limit: float
) -> None:
    """Submit jobs (to the other nodes) until node ``i`` has exited."""
    proc = cluster.nodes[i].proc
    assert proc is not None
    deadline = time.monotonic() + limit
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"node {i} still up after {limit}s of load"
        body = {"task": "acc.record", "schedule": {"in": "1h"}, "payload": PAYLOAD}
        acked.append(await submit(http, cluster, body))


async def job_ids(http: aiohttp.ClientSession, cluster: Cluster, url: str) -> set[str]:
    ids = await cluster.job_ids(http, url)
    assert ids is not None, f"{url} does not answer"
    return ids


@pytest.mark.parametrize("role", ["leader", "follower"])
async def test_a_full_data_directory_stops_the_node_until_space_is_freed(
    tmp_path: Path, role: str
) -> None:
    root = tmp_path / "c"
    cluster = Cluster(root)
    with contextlib.ExitStack() as mounts:
        for n in cluster.nodes:
            mounts.enter_context(tmpfs(root / n.node_id, FS_MB))
        try:
            cluster.start()
            async with aiohttp.ClientSession() as http:
                leader = await cluster.wait_serving(http)  # the others can elect when i stops
                i = leader if role == "leader" else (leader + 1) % cluster.size
                node = cluster.nodes[i]
                acked: list[str] = []
                ballast = fill(root / node.node_id, LEFT_KB)
                await load_until_dead(http, cluster, i, acked, limit=90)
                assert node.proc is not None and node.proc.returncode == 70
                assert_stopped_for_space(node.log, ("raft.journal_failed", "storage.failed"))
                await restarted_while_full(http, cluster, i, acked)
                ballast.unlink()  # space freed
                await back_with_every_job(http, cluster, i, acked)
        finally:
            cluster.stop()


@pytest.mark.skipif(lossy_unavailable() is not None, reason=str(lossy_unavailable()))
@pytest.mark.parametrize(
    ("names", "event"),
    [("raft.journal", "raft.journal_failed"), ("state.db,state.db-wal", "storage.failed")],
    ids=["journal", "state-database"],
)
async def test_the_file_that_hits_the_limit_stops_the_node_until_space_is_freed(
    tmp_path: Path, names: str, event: str
) -> None:
    with lossy_cluster(tmp_path) as (cluster, disks):
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)  # the other follower votes meanwhile
            i = (leader + 1) % cluster.size
            await wait_for(lambda: cluster.view(http, i), timeout=30)  # it has started
            acked: list[str] = []
            disks[i].call(f"full {names} 65536")  # 64 KiB more for those files, then none
            await load_until_dead(http, cluster, i, acked, limit=90)
            log = assert_stopped_for_space(cluster.nodes[i].log, (event,))
            assert "free_bytes=0" in log  # the room left, as the filesystem reports it
            await restarted_while_full(http, cluster, i, acked)
            disks[i].call("full off")
            await back_with_every_job(http, cluster, i, acked)


def assert_stopped_for_space(path: Path, events: tuple[str, ...]) -> str:
    """The node's log ends with the CRITICAL line of a full disk: which file, how much room."""
    log = path.read_text()
    lines = [line for line in log.splitlines() if " CRITICAL " in line]
    assert lines, log[-3000:]
    last = lines[-1]
    assert any(e in last for e in events), last
    assert "No space left on device" in last or "disk is full" in last, last
    assert " path=" in last and "free_bytes=" in last and "total_bytes=" in last, last
    return log


async def restarted_while_full(
    http: aiohttp.ClientSession, cluster: Cluster, i: int, acked: list[str]
) -> None:
    """Restarted with the disk still full (systemd: Restart=on-failure), twice: it stops again
    at its first write, with exit status 70 each time, and the others keep taking jobs."""
    node = cluster.nodes[i]
    for _ in range(2):
        cluster.start(i)
        await load_until_dead(http, cluster, i, acked, limit=90)
        assert node.proc is not None and node.proc.returncode == 70


async def back_with_every_job(
    http: aiohttp.ClientSession, cluster: Cluster, i: int, acked: list[str]
) -> None:
    """Space freed: the next restart brings it back, with every acknowledged job, and every
    replica holds the same jobs (a retried submit may have made one more than was
    acknowledged: on every node alike)."""
    cluster.start(i)
    for url in cluster.urls:
        await wait_for(lambda u=url: all_visible(http, cluster, u, acked), timeout=60)

    async def same() -> bool:
        held = [await job_ids(http, cluster, url) for url in cluster.urls]
        return held[0] == held[1] == held[2]

    await wait_for(same, timeout=30)
    assert cluster.nodes[i].alive
