"""Where a node of several shards keeps the sockets of its shards' APIs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from schedd.shard.layout import SOCKET_PATH_MAX, api_socket, make_socket_dir


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_sockets_live_in_the_data_directory_and_a_dead_nodes_go(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    dead, alive = _dead_pid(), os.getppid()
    for pid in (dead, alive):
        (data / f"sockets-{pid}").mkdir()
        (data / f"sockets-{pid}" / "shard-0.sock").write_text("")
    (data / "sockets-notes").mkdir()  # not a node's: left alone

    mine = make_socket_dir(data, os.getpid())

    assert mine == data / f"sockets-{os.getpid()}"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert not (data / f"sockets-{dead}").exists()
    assert (data / f"sockets-{alive}" / "shard-0.sock").exists()
    assert (data / "sockets-notes").is_dir()
    assert len(os.fsencode(api_socket(mine, 31))) <= SOCKET_PATH_MAX


def test_a_data_directory_too_deep_for_a_socket_path_uses_the_temporary_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / ("d" * 100)
    data.mkdir()
    mine = make_socket_dir(data, os.getpid())
    try:
        assert data not in mine.parents
        assert stat.S_IMODE(mine.stat().st_mode) == 0o700
        assert len(os.fsencode(api_socket(mine, 31))) <= SOCKET_PATH_MAX
    finally:
        mine.rmdir()
    assert list(data.iterdir()) == []


def test_a_data_directory_whose_file_system_holds_no_sockets_uses_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FUSE or NFS data directory may refuse a socket (ENOSYS at bind): the shards' sockets
    then go to the temporary directory, and nothing is left in the data directory."""
    import errno
    import socket

    from schedd.shard import layout

    class NoSockets(socket.socket):
        def bind(self, address: object) -> None:
            raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(layout.socket, "socket", NoSockets)
    data = tmp_path / "data"
    data.mkdir()
    mine = make_socket_dir(data, os.getpid())
    try:
        assert data not in mine.parents and mine.is_dir()
    finally:
        mine.rmdir()
    assert list(data.iterdir()) == []
