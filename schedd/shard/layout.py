"""Where each shard of a node lives: its Raft port, its directories, the socket of its API."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import tempfile
from pathlib import Path

from schedd.config import Config, join_hostport, split_hostport


def shard_address(address: str, shard: int) -> str:
    """Shard ``shard``'s Raft address of the node whose (shard 0's) Raft address is
    ``address``: the same host, the port + shard."""
    host, port = split_hostport(address)
    return join_hostport(host, port + shard)


def shard_dir(top: Path, shard: int) -> Path:
    return top / "shards" / str(shard)


def shard_config(cfg: Config, shard: int) -> Config:
    """The config of a node's shard ``shard``, as a node of its own: the Raft addresses of
    that shard's group, its own data (and journal) directory, and the node's API URL and
    tokens (the front door's, which every shard shares), and no submission rates (the front
    door's, which hold for the node as a whole)."""
    r = cfg.raft
    journal = None if r.journal_dir is None else str(shard_dir(Path(r.journal_dir), shard))
    raft = dataclasses.replace(
        r,
        listen=shard_address(r.listen, shard),
        peers=tuple(shard_address(p, shard) for p in r.peers),
        # the other nodes' API URLs (their front doors), as shard 0's ports derive them
        peer_http=cfg.peer_http_urls(),
        journal_dir=journal,
    )
    return dataclasses.replace(
        cfg,
        # the node's front door keeps the submission rates: one bucket per namespace per node
        limits=dataclasses.replace(cfg.limits, submit_rate=()),
        node=dataclasses.replace(cfg.node, data_dir=str(shard_dir(cfg.data_path, shard))),
        raft=raft,
        http=dataclasses.replace(cfg.http, advertise=cfg.advertise_url()),
        auth=dataclasses.replace(cfg.auth, tokens_file=str(cfg.tokens_path)),
    )


#: the longest path a Unix socket may have (``sun_path`` holds 108 bytes with its NUL)
SOCKET_PATH_MAX = 107
SOCKETS_PREFIX = "sockets-"


def make_socket_dir(data: Path, pid: int) -> Path:
    """A directory of the node's own (mode 0700, named for its ``pid``) for its shards' API
    sockets: in its data directory, the one place a node may write when systemd makes the
    rest of the system read-only (``ProtectSystem=strict``), or in the system's temporary
    directory when the data directory's path is too long for a socket's or its file system
    cannot hold one.  A directory that a
    node killed before it removed its own left there goes first."""
    for stale in data.glob(SOCKETS_PREFIX + "*"):
        owner = stale.name.removeprefix(SOCKETS_PREFIX)
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(stale, ignore_errors=True)
    mine = data / f"{SOCKETS_PREFIX}{pid}"
    if len(os.fsencode(api_socket(mine, 99))) <= SOCKET_PATH_MAX:
        shutil.rmtree(mine, ignore_errors=True)  # a dead node's of the same pid
        mine.mkdir(mode=0o700, parents=True)
        if _holds_sockets(mine):
            return mine
        shutil.rmtree(mine, ignore_errors=True)  # (a file system without sockets: FUSE, NFS)
    return Path(tempfile.mkdtemp(prefix="schedd-"))


def _holds_sockets(directory: Path) -> bool:
    """Whether a Unix socket can be made in ``directory`` (not on every file system)."""
    probe = directory / "probe.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(probe))
    except OSError:
        return False
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            probe.unlink()
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def api_socket(socket_dir: Path, shard: int) -> str:
    """The Unix socket shard ``shard``'s API listens on, in the supervisor's own directory
    (made for the node's run, readable by its user only; a short path, as sockets need)."""
    return str(socket_dir / f"shard-{shard}.sock")
