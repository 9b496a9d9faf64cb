"""What a node checks before it starts: the mistakes an operator can make in the machine
around a valid config, each reported as one line naming the key or path and what to do.

The config itself (types, ranges, the secret rule, the secret and TLS files) is checked by
:mod:`schedd.config`; here is what only the machine can tell: a Python package missing from the
installation, a data (or journal) directory the service user cannot write, a port another
process holds or an address this host does not have.  The daemon prints every problem and exits non-zero before
it touches anything else.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import socket
import tempfile
import time
from pathlib import Path

from schedd.config import Config, join_hostport, split_hostport

#: how long a port held by another process is retried before it is reported: a node restarted
#: right after it was killed may find its previous process's sockets closing
PORT_WAIT = 5.0
PORT_RETRY = 0.2
MAX_FILES_CHECKED = 1000


def _show(text: str) -> str:
    """A path or address as it would be written in the config file (double-quoted)."""
    return json.dumps(text, ensure_ascii=False)


def run_as() -> str:
    """The user this process runs as, for messages: ``uid 998 (schedd)``."""
    uid = os.geteuid()
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_modules(cfg: Config) -> list[str]:
    """The parts of the installation this config needs: the pysyncobj schedd's patches fit,
    and the optional packages."""
    from schedd.raft.patches import PysyncobjMismatch, check_installed

    try:
        check_installed()
    except PysyncobjMismatch as exc:
        return [str(exc)]
    if cfg.raft.secret_file is None:
        return []
    try:  # what pysyncobj encrypts Raft traffic with
        import cryptography.fernet
        import cryptography.hazmat.primitives.kdf.pbkdf2  # noqa: F401
    except ImportError as exc:
        return [
            f"raft.secret_file: set, but the Python package 'cryptography' that encrypts Raft "
            f"traffic cannot be imported ({exc}); install schedd with its dependencies "
            "(pip install schedd)"
        ]
    return []


def check_data_dir(cfg: Config) -> list[str]:
    """``node.data_dir`` exists or can be made, and the service user can write what is in it;
    so does ``raft.journal_dir`` when it is set."""
    problems = _check_dir("node.data_dir", cfg.data_path, "raft")
    if cfg.raft.journal_dir is not None:
        problems += _check_dir("raft.journal_dir", cfg.journal_path)
    return problems


def _check_dir(key: str, top: Path, sub: str = "") -> list[str]:
    """``top/sub`` exists or can be made, files can be made in ``top`` and ``top/sub``, and
    the files below ``top`` (the first :data:`MAX_FILES_CHECKED`) can be read and written."""
    inner = top / sub
    hint = f"schedd runs as {run_as()}; give {key} to that user (chown -R)"
    try:
        inner.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"{key}: cannot create {_show(str(inner))}: {exc.strerror or exc} ({hint})"]
    for directory in dict.fromkeys((top, inner)):
        try:
            fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-check-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return [
                f"{key}: cannot write in {_show(str(directory))}: {exc.strerror or exc} ({hint})"
            ]
    problems: list[str] = []
    for n, path in enumerate(top.rglob("*")):
        if n >= MAX_FILES_CHECKED:
            break
        if path.is_file() and not os.access(path, os.R_OK | os.W_OK):
            owner = path.stat().st_uid
            problems.append(
                f"{key}: {_show(str(path))} cannot be read and written "
                f"(owned by uid {owner}; {hint})"
            )
    return problems


def _bind_error(address: str) -> OSError | None:
    """Why ``address`` cannot be listened on now (``socket.gaierror`` for a host that does
    not resolve), or None."""
    host, port = split_hostport(address)
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, sockaddr = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(1)
    except OSError as exc:
        return exc
    return None


def _explain_bind(key: str, address: str, exc: OSError) -> str:
    where = f"{key}: cannot listen on {_show(address)}"
    host = split_hostport(address)[0]
    if isinstance(exc, socket.gaierror):
        return f"{where}: cannot resolve the host {_show(host)}: {exc.strerror}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: the port is in use by another process (`ss -ltnp` shows which); "
            "stop it or choose another port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{where}: {host} is not an address of this host; expected one of this "
            "host's own addresses (the one the other nodes use to reach it)"
        )
    if exc.errno == errno.EACCES:
        return (
            f"{where}: permission denied (schedd runs as {run_as()}; ports below 1024 "
            "need the CAP_NET_BIND_SERVICE capability)"
        )
    return f"{where}: {exc.strerror or exc}"


def check_ports(cfg: Config, wait: float = PORT_WAIT) -> list[str]:
    """``http.listen`` and ``raft.listen`` can be listened on (a port in use is retried for
    ``wait`` seconds first)."""
    addresses = {"http.listen": cfg.http.listen, "raft.listen": cfg.raft.listen}
    host, port = split_hostport(cfg.raft.listen)
    for shard in range(1, cfg.cluster.shards):  # shard k's Raft port: raft.listen's + k
        addresses[f"raft.listen (shard {shard}: port {port + shard})"] = join_hostport(
            host, port + shard
        )
    deadline = time.monotonic() + wait
    while True:
        errors = {
            key: exc
            for key, address in addresses.items()
            if (exc := _bind_error(address)) is not None
        }
        in_use = any(exc.errno == errno.EADDRINUSE for exc in errors.values())
        if not in_use or time.monotonic() >= deadline:
            return [_explain_bind(key, addresses[key], exc) for key, exc in errors.items()]
        time.sleep(PORT_RETRY)


def check(cfg: Config) -> list[str]:
    """Every problem the machine has with this config, in the order they would bite."""
    problems = check_modules(cfg) + check_data_dir(cfg)
    return problems + check_ports(cfg)


def size_warning(voters: int) -> str | None:
    """What ``voters`` voting nodes mean for failures, when it needs saying (not an error: an
    operator may be growing a cluster through it)."""
    if voters == 2:
        return (
            "a cluster of 2 nodes tolerates no failure: with either node down there is no "
            "majority and no write is accepted; run 3 nodes (or 1)"
        )
    if voters > 2 and voters % 2 == 0:
        return (
            f"a cluster of {voters} nodes tolerates {voters // 2 - 1} failures, as one of "
            f"{voters - 1} does, with one node more to fail; run an odd number"
        )
    return None


def size_warnings(cfg: Config) -> list[str]:
    """:func:`size_warning` for the voters ``raft.peers`` names (a node that joins a cluster
    has its membership from the log)."""
    if cfg.raft.join:
        return []
    warning = size_warning(1 + len(cfg.raft.peers))
    return [] if warning is None else [f"raft.peers: {warning}"]
