"""pysyncobj writes snapshots in a child it forks from the tick thread.  That child used to
inherit the daemon's listening sockets, so a node SIGKILLed during a long snapshot write could
not restart until the orphaned writer finished (RELIABILITY.md).  schedd/raft/forksafe.py makes
the child release every inherited socket and die with its parent.

A real one-node RaftNode, a real forced compaction (the path the stalled-follower recovery
takes), and a replicated object whose pickling, in the child, reports the child's pid and then
blocks until the test lets it go: the test looks at the writer while it is writing."""

from __future__ import annotations

import gzip
import os
import select
import signal
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pytest

from schedd.core import commands as c
from schedd.raft.node import Hooks, RaftNode, RaftSettings
from tests.conftest import free_port

DEADLINE = 15.0


class _Gate:
    """Replicated state whose pickling (in the snapshot writer only) says "pid" on one pipe and
    waits for a byte, or EOF, on another."""

    def __init__(self, ready_w: int, release_r: int, release_w: int) -> None:
        self.ready_w, self.release_r, self.release_w = ready_w, release_r, release_w

    def __reduce__(self) -> tuple[Any, ...]:
        os.close(self.release_w)  # (the child's copy) so that the test closing its own is EOF
        os.write(self.ready_w, f"{os.getpid()}\n".encode())
        os.read(self.release_r, 1)
        return (int, (0,))


@dataclass
class Writer:
    """One snapshot writer held at its pickling step; every process and pipe cleaned up."""

    node: RaftNode
    ready_r: int
    ready_w: int
    release_r: int
    release_w: int
    pid: int = 0
    reaped: bool = False
    status: int | None = None
    closed: set[int] = field(default_factory=set)

    def wait_started(self) -> int:
        readable, _, _ = select.select([self.ready_r], [], [], DEADLINE)
        assert readable, f"no snapshot writer reached its pickling within {DEADLINE}s"
        self.pid = int(os.read(self.ready_r, 64).decode().strip())
        return self.pid

    def release(self) -> None:
        if self.release_w not in self.closed:
            os.close(self.release_w)
            self.closed.add(self.release_w)

    def wait_exit(self, timeout: float = DEADLINE) -> int | None:
        """The writer's wait status once it has exited, or None at the deadline (not reaped by
        pysyncobj: its tick thread polls the same pid, so either may collect it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # pysyncobj's tick thread reaped it
                self.reaped = True
                return None
            if pid == self.pid:
                self.reaped, self.status = True, status
                return status
            time.sleep(0.02)
        return None

    def cleanup(self) -> None:
        if self.pid and not self.reaped:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        for fd in (self.ready_r, self.ready_w, self.release_r, self.release_w):
            if fd not in self.closed:
                os.close(fd)
                self.closed.add(fd)


def _interval_outside_split_slot() -> float:
    """A ``log_compaction_min_time`` for which a one-node cluster is now, and for a while,
    outside its logCompactionSplit slot (the first 30 % of each period of time.monotonic):
    a compaction that happens now was forced past the split."""
    now = time.monotonic()
    period = now / (int(now // 200) + 0.6)  # now sits at 60 % of a period of 120-333 s
    if period < 60:
        pytest.skip("the machine has been up for less than a minute")
    return period


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RaftNode]:
    port = free_port()
    settings = RaftSettings(self_addr=f"127.0.0.1:{port}", peers=(), data_dir=tmp_path / "raft",
                            log_compaction_min_entries=1_000_000,
                            log_compaction_min_time=_interval_outside_split_slot())
    n = RaftNode(settings, Hooks())
    try:
        yield n
    finally:
        n.close()  # the tick thread closes the Raft port on its way out
        tick = n._obj._SyncObj__thread
        tick.join(DEADLINE)
        assert not tick.is_alive()


def _apply(node: RaftNode, count: int) -> None:
    target = node.applied_index + count
    for _ in range(count):
        node._sm.apply_entry(c.encode_entry([]))
    deadline = time.monotonic() + DEADLINE
    while node.applied_index < target:
        assert time.monotonic() < deadline, f"applied {node.applied_index}, wanted {target}"
        time.sleep(0.01)


def _start_writer(node: RaftNode) -> Writer:
    """Force a compaction (on the tick thread, as the stalled-follower recovery does) whose
    writer stops in the middle of pickling the state."""
    deadline = time.monotonic() + DEADLINE
    while not node.is_leader:
        assert time.monotonic() < deadline, "the one-node cluster elected no leader"
        time.sleep(0.01)
    _apply(node, 3)  # pysyncobj compacts only with two applied entries since the last snapshot
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    node._sm.gate = _Gate(ready_w, release_r, release_w)  # replicated: set after __init__
    node._on_tick.put(node._force_compaction)
    return Writer(node, ready_r, ready_w, release_r, release_w)


def _sockets_of(pid: int) -> list[str]:
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:"):
            out.append(f"{name} -> {target}")
    return out


def _listener(port: int = 0) -> socket.socket:
    # as asyncio's create_server (aiohttp) binds: SO_REUSEADDR, which does not allow a second
    # listener on a port that still has one
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_the_snapshot_writer_holds_no_socket_and_a_freed_port_can_be_bound_again(
        node: RaftNode, tmp_path: Path) -> None:
    http = _listener()  # stands for the HTTP API's listening port
    port = http.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    server, _ = http.accept()  # an established connection of the "daemon"
    writer = _start_writer(node)
    try:
        pid = writer.wait_started()
        assert node._obj._SyncObj__serializer._Serializer__pid == pid  # pysyncobj's own child
        assert _sockets_of(os.getpid()), "the test process should hold sockets"
        assert _sockets_of(pid) == [], "the snapshot writer kept inherited sockets"

        # The daemon's sockets are untouched by the writer dropping its copies: the
        # established connection still carries data both ways and the listener accepts.
        server.sendall(b"a")
        client.sendall(b"b")
        assert client.recv(1) == b"a" and server.recv(1) == b"b"
        with socket.create_connection(("127.0.0.1", port)) as again:
            accepted, _ = http.accept()
            accepted.close()
            del again
        # Raft goes on while the writer runs.
        _apply(node, 2)

        # The "daemon" lets go of its port (as when it is killed): with the writer still
        # alive, the port can be bound again at once.
        for s in (client, server, http):
            s.close()
        _listener(port).close()

        # The write itself is unharmed: released, the writer finishes and the snapshot loads.
        writer.release()
        status = writer.wait_exit()
        assert status is None or os.waitstatus_to_exitcode(status) == 0, status
        dump = tmp_path / "raft" / "raft.dump"
        deadline = time.monotonic() + DEADLINE
        while node._obj._SyncObj__serializer._Serializer__pid != 0 or not dump.exists():
            assert time.monotonic() < deadline, "the snapshot was not installed"
            time.sleep(0.01)
        with gzip.open(dump, "rb") as f:
            data = pysyncobj_pickle.load(f)
        consumer = data[0][1]
        assert consumer["gate"] == 0 and type(consumer["state"]).__name__ == "MemoryState"
        # the forced compaction went past the split slot; the split is back on
        assert node._conf.logCompactionSplit is True
    finally:
        for s in (client, server, http):
            s.close()
        writer.cleanup()


def test_the_snapshot_writer_is_killed_when_the_thread_that_forked_it_ends(
        node: RaftNode, tmp_path: Path) -> None:
    writer = _start_writer(node)
    try:
        writer.wait_started()
        node.close()  # pysyncobj's tick thread, which forked the writer, ends
        status = writer.wait_exit()
        assert status is not None, "the writer outlived the thread that forked it"
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        # killed before its rename: the snapshot a restart loads was never touched
        assert not (tmp_path / "raft" / "raft.dump").exists()
    finally:
        writer.cleanup()


def test_a_signal_sent_to_the_writer_does_not_reach_the_daemons_event_loop(
        node: RaftNode) -> None:
    """The daemon's loop learns of signals through a wakeup socket (``signal.set_wakeup_fd``,
    set by uvloop's ``add_signal_handler``); the writer inherits the C signal handler that
    writes to it.  Before the fix a signal sent to the writer woke the daemon's loop with it."""
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    old_handler = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    old_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    writer = _start_writer(node)
    try:
        pid = writer.wait_started()
        os.kill(pid, signal.SIGUSR1)
        # The signal is handled before the writer can get past its pipe read, so once the
        # snapshot is done, anything it wrote to the wakeup socket is there to read.
        writer.release()
        deadline = time.monotonic() + DEADLINE
        while node._obj._SyncObj__serializer._Serializer__pid != 0:
            assert time.monotonic() < deadline, "the snapshot did not finish"
            time.sleep(0.01)
        try:
            woken = wake_r.recv(64)
        except BlockingIOError:
            woken = b""
        assert signal.SIGUSR1 not in woken, "the writer's signal reached the daemon's loop"
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGUSR1, old_handler)
        wake_r.close()
        wake_w.close()
        writer.cleanup()


def test_other_children_of_the_daemon_keep_their_sockets(node: RaftNode) -> None:
    """The at-fork hook is process-wide; only pysyncobj's snapshot fork is acted upon (a
    subprocess with a preexec_fn, for instance, runs the hooks too)."""
    with _listener() as s:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0 if stat.S_ISSOCK(os.fstat(s.fileno()).st_mode) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "a plain fork lost its sockets"
