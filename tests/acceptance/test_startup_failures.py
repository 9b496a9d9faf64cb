"""Every start-up failure an operator can cause is one line on stderr that names the cause and
the key or path, and a non-zero exit: never a traceback, never a node that runs half-started.

Each case starts the real ``schedd`` in a subprocess.  The cases that depend on file permissions
run it as an unprivileged user (uid 65534, as ``User=`` in the systemd unit would), since root
reads and writes anything.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedd.auth import ensure_admin_token
from tests.cluster.harness import BIN, _env
from tests.conftest import free_port

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(60)]
NOBODY = 65534


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory every user can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="schedd-start-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_config(
    root: Path,
    *,
    raft_listen: str | None = None,
    peers: list[str] | None = None,
    secret_file: Path | None = None,
    data_dir: Path | None = None,
) -> tuple[Path, int]:
    """A node config in ``root`` (readable by everyone); returns it and its HTTP port."""
    port = free_port()
    raft = raft_listen or f"127.0.0.1:{port + 1}"
    lines = [
        "[node]",
        'id = "n1"',
        f'data_dir = "{data_dir or root / "data"}"',
        "[http]",
        f'listen = "127.0.0.1:{port}"',
        "[raft]",
        f'listen = "{raft}"',
        "peers = [" + ", ".join(f'"{p}"' for p in peers or []) + "]",
    ]
    if secret_file is not None:
        lines.append(f'secret_file = "{secret_file}"')
    lines += ["[auth]", f'tokens_file = "{root / "tokens.toml"}"']
    cfg = root / "schedd.toml"
    cfg.write_text("\n".join(lines) + "\n")
    cfg.chmod(0o644)
    return cfg, port


def write_secret(path: Path, size: int = 48, mode: int = 0o600) -> Path:
    path.write_text(secrets.token_hex(size) + "\n")
    path.chmod(mode)
    return path


def schedd(
    cfg: Path,
    cwd: Path,
    *,
    user: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 40,
) -> tuple[int, list[str]]:
    """Run ``schedd --config cfg`` until it exits: (exit status, stderr lines)."""
    args = [str(BIN / "schedd"), "--config", str(cfg)]
    if user is not None:
        args = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *args]
    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**_env(), **(env or {})},
    )
    return proc.returncode, [ln for ln in proc.stderr.splitlines() if ln.strip()]


def assert_one_line(lines: list[str], *needles: str) -> None:
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines)
    assert len(lines) == 1, "expected exactly one line:\n" + "\n".join(lines)
    assert lines[0].startswith("schedd: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def shadow_module(root: Path, name: str) -> dict[str, str]:
    """An environment in which importing ``name`` fails as if it were not installed."""
    pkg = root / "shadow" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
    )
    return {"PYTHONPATH": f"{root / 'shadow'}{os.pathsep}{_env()['PYTHONPATH']}"}


def test_missing_cryptography_with_a_secret_is_one_line(world: Path) -> None:
    cfg, _ = write_config(world, secret_file=write_secret(world / "raft.key"))
    code, lines = schedd(cfg, world, env=shadow_module(world, "cryptography"))
    assert code == 1
    assert_one_line(lines, "raft.secret_file", "'cryptography'", "pip install")
    assert not (world / "data" / "raft" / "raft.journal").exists(), "nothing may start"


def test_missing_dependency_is_one_line_naming_the_module(world: Path) -> None:
    cfg, _ = write_config(world)
    code, lines = schedd(cfg, world, env=shadow_module(world, "orjson"))
    assert code == 1
    assert_one_line(lines, "'orjson'", "cannot be imported", "pip install")


def test_another_pysyncobj_is_one_line_naming_both_versions(world: Path) -> None:
    # The installed distribution's metadata says 0.3.18 (the package is still the real one):
    # schedd's patches are written for 0.3.17's internals and must not run on another.
    meta = world / "shadow" / "pysyncobj-0.3.18.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: pysyncobj\nVersion: 0.3.18\n")
    cfg, _ = write_config(world)
    env = {"PYTHONPATH": f"{world / 'shadow'}{os.pathsep}{_env()['PYTHONPATH']}"}
    code, lines = schedd(cfg, world, env=env)
    assert code == 1
    assert_one_line(lines, "pysyncobj 0.3.18 is installed", "pysyncobj 0.3.17", "pip install")
    assert not (world / "data" / "raft" / "raft.journal").exists(), "nothing may start"


def test_ports_in_use_are_named_by_their_keys(world: Path) -> None:
    cfg, port = write_config(world)
    with socket.socket() as http, socket.socket() as raft:
        for sock, p in ((http, port), (raft, port + 1)):
            sock.bind(("127.0.0.1", p))
            sock.listen()
        code, lines = schedd(cfg, world)
    assert code == 1
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines)
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].startswith(f'schedd: http.listen: cannot listen on "127.0.0.1:{port}"')
    assert lines[1].startswith(f'schedd: raft.listen: cannot listen on "127.0.0.1:{port + 1}"')
    assert all("in use by another process" in ln for ln in lines)


def test_an_address_this_host_does_not_have(world: Path) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never an address of this host's namespaces we did not make
    cfg, _ = write_config(
        world,
        raft_listen="192.0.2.77:7701",
        peers=["192.0.2.78:7701"],
        secret_file=write_secret(world / "raft.key"),
    )
    if any(
        "192.0.2.77" in ln
        for ln in subprocess.run(
            ["ip", "-br", "addr"], capture_output=True, text=True
        ).stdout.splitlines()
    ):
        pytest.skip("this host has 192.0.2.77")
    code, lines = schedd(cfg, world)
    assert code == 1
    assert_one_line(lines, "raft.listen", "192.0.2.77 is not an address of this host")


def test_unreadable_secret(world: Path) -> None:
    key = write_secret(world / "raft.key", mode=0o600)  # owned by root, the node runs as nobody
    cfg, _ = write_config(world, secret_file=key, data_dir=world / "data")
    (world / "data").mkdir(mode=0o700)
    os.chown(world / "data", NOBODY, NOBODY)
    code, lines = schedd(cfg, world, user=NOBODY)
    assert code == 2
    assert_one_line(lines, f'raft.secret_file: "{key}" cannot be read: Permission denied')


def test_too_short_secret(world: Path) -> None:
    key = world / "raft.key"
    key.write_text("short\n")
    cfg, _ = write_config(world, secret_file=key)
    code, lines = schedd(cfg, world)
    assert code == 2
    assert_one_line(lines, f'raft.secret_file: "{key}" holds 5 bytes, expected at least 32')


def test_data_dir_the_service_user_cannot_write(world: Path) -> None:
    data = world / "data"
    data.mkdir(mode=0o755)  # root's, as after `mkdir /var/lib/schedd` without chown
    cfg, _ = write_config(world, data_dir=data)
    (world / "tokens.toml").write_text("")
    os.chown(world / "tokens.toml", NOBODY, NOBODY)
    code, lines = schedd(cfg, world, user=NOBODY)
    assert code == 1
    assert_one_line(
        lines, "node.data_dir", str(data / "raft"), "Permission denied", f"uid {NOBODY}"
    )


def test_a_journal_left_by_root_in_the_data_dir(world: Path) -> None:
    """The node once ran as root (by hand), then under systemd as its own user."""
    data = world / "data"
    (data / "raft").mkdir(parents=True)
    for d in (data, data / "raft"):
        os.chown(d, NOBODY, NOBODY)
        d.chmod(0o700)
    journal = data / "raft" / "raft.journal"
    journal.write_bytes(b"")
    journal.chmod(0o600)  # root's
    cfg, _ = write_config(world, data_dir=data)
    (world / "tokens.toml").write_text("")
    os.chown(world / "tokens.toml", NOBODY, NOBODY)
    code, lines = schedd(cfg, world, user=NOBODY)
    assert code == 1
    assert_one_line(lines, "node.data_dir", str(journal), "owned by uid 0", "chown")


def test_a_peer_list_naming_the_node_itself(world: Path) -> None:
    port = free_port()
    cfg, _ = write_config(
        world, raft_listen=f"127.0.0.1:{port}", peers=[f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    )
    code, lines = schedd(cfg, world)
    assert code == 2
    assert_one_line(lines, f'raft.peers[0]: "127.0.0.1:{port}" is this node\'s own raft.listen')


def test_a_valid_node_still_starts(world: Path) -> None:
    """The checks above refuse nothing that works: the same kind of node, as nobody, serves."""
    data = world / "data"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    key = write_secret(world / "raft.key")
    os.chown(key, NOBODY, NOBODY)
    cfg, port = write_config(world, data_dir=data, secret_file=key)
    ensure_admin_token(world / "tokens.toml")
    os.chown(world / "tokens.toml", NOBODY, NOBODY)
    args = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        str(BIN / "schedd"),
        "--config",
        str(cfg),
    ]
    proc = subprocess.Popen(
        args, cwd=world, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            assert "Traceback" not in line and not line.startswith("schedd: "), line
            if "node.started" in line:
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        code = proc.wait(20)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


def test_a_data_dir_of_another_number_of_shards_is_refused_naming_both(world: Path) -> None:
    cfg, _ = write_config(world)
    (world / "data").mkdir()
    (world / "data" / "cluster.json").write_text('{"format": 1, "shards": 3}\n')
    code, lines = schedd(cfg, world)
    assert code == 2
    assert_one_line(
        lines, "cluster.shards", "created with shards = 3", "this config says shards = 1"
    )
    assert not (world / "data" / "raft" / "raft.journal").exists(), "nothing may start"
    # --check-config reads the record too, and writes nothing
    proc = subprocess.run(
        [str(BIN / "schedd"), "--config", str(cfg), "--check-config"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=30,
    )
    assert proc.returncode == 2 and "created with shards = 3" in proc.stderr, proc.stderr


def test_several_shards_need_no_switch(world: Path) -> None:
    """A cluster of several shards is released: its config checks clean as it is, with no
    development switch in the environment."""
    port = free_port(4)  # the HTTP port, then shard 0's, 1's and 2's Raft ports
    cfg, _ = write_config(world, raft_listen=f"127.0.0.1:{port + 1}")
    cfg.write_text(cfg.read_text() + "[cluster]\nshards = 3\n")
    env = {k: v for k, v in _env().items() if not k.startswith("SCHEDD_SHARDS")}
    proc = subprocess.run(
        [str(BIN / "schedd"), "--config", str(cfg), "--check-config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 0 and "config ok" in proc.stdout, proc.stdout + proc.stderr
