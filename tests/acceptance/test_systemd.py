"""schedd speaks systemd's notify protocol: READY=1, watchdog pings, STOPPING=1, exit 0."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(60)]
REPO = Path(__file__).resolve().parents[2]


def test_notify_protocol_against_a_fake_notify_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    cluster = Cluster(tmp_path / "c", size=1)
    try:
        cluster.start()
        messages: list[str] = []
        while not any(m.startswith("READY=1") for m in messages):
            messages.append(sock.recv(4096).decode())
        # the API answers once READY=1 was sent
        import urllib.request

        with urllib.request.urlopen(cluster.urls[0] + "/healthz", timeout=5) as r:
            assert r.status == 200
        pings = 0
        while pings < 2:
            pings += sock.recv(4096).decode() == "WATCHDOG=1"
        cluster.kill(0, signal.SIGTERM)
        while "STOPPING=1" not in messages:
            messages.append(sock.recv(4096).decode())
        proc = cluster.nodes[0].proc
        assert proc is not None and proc.wait(20) == 0
    finally:
        cluster.stop()
        sock.close()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    for unit in ("schedd.service", "schedd-worker@.service"):
        text = (REPO / "systemd" / unit).read_text().replace("/opt/schedd/bin/", "/bin/")
        target = tmp_path / unit.replace("@.", "@x.")
        target.write_text(text)
        out = subprocess.run(
            ["systemd-analyze", "verify", str(target)], capture_output=True, text=True
        )
        problems = [
            ln for ln in out.stderr.splitlines() if unit.split("@")[0] in ln and "Unknown" in ln
        ]
        assert not problems, out.stderr


def test_units_restart_without_a_start_limit() -> None:
    """A node stops on a full disk (exit 70) at once after each start; with systemd's default
    start limit (5 starts in 10 s) ``Restart=on-failure`` would give up and leave it down after
    the space is freed (tests/cluster/test_full_disk.py shows it comes back when restarted)."""
    for unit in ("schedd.service", "schedd-worker@.service"):
        text = (REPO / "systemd" / unit).read_text()
        unit_section = text.split("[Unit]", 1)[1].split("[Service]", 1)[0]
        service = text.split("[Service]", 1)[1].split("[Install]", 1)[0]
        assert "\nStartLimitIntervalSec=0\n" in unit_section, unit
        assert "\nRestart=on-failure\n" in service, unit


def test_sighup_reloads_tokens_and_log_level(tmp_path: Path) -> None:
    import time
    import urllib.error
    import urllib.request

    cluster = Cluster(tmp_path / "c", size=1)
    try:
        cluster.start()
        url = cluster.urls[0] + "/api/v1/jobs"
        for _ in range(100):
            try:
                urllib.request.urlopen(
                    urllib.request.Request(url, headers=cluster.headers()), timeout=2
                )
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        new = "a-freshly-added-token-0123456789"
        tokens = tmp_path / "c" / "tokens.toml"
        tokens.write_text(
            tokens.read_text() + f'\n[[token]]\nname = "new"\nsecret = "{new}"\nrole = "read"\n'
        )
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {new}"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("the new token worked before the reload")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        cluster.kill(0, signal.SIGHUP)
        for _ in range(100):
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    assert r.status == 200
                    break
            except urllib.error.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("the new token never worked")
        log = cluster.nodes[0].log.read_text()
        assert "tokens.reloaded" in log and "log.level_reloaded" in log
        assert new not in log  # secrets never reach the logs
    finally:
        cluster.stop()


def test_make_secrets_writes_private_files(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(REPO / "scripts" / "make-secrets"), str(tmp_path / "etc")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    for name in ("raft.key", "tokens.toml"):
        path = tmp_path / "etc" / name
        assert path.stat().st_mode & 0o777 == 0o600
    assert len((tmp_path / "etc" / "raft.key").read_text().strip()) >= 64
    from schedd.auth import load_tokens

    assert [t.role for t in load_tokens(tmp_path / "etc" / "tokens.toml").tokens] == [
        "admin",
        "submit",
        "read",
        "worker",
    ]


def test_check_config_names_every_problem(tmp_path: Path) -> None:
    from tests.cluster.harness import BIN

    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[node]\ncolour = "red"\n[raft]\nlisten = "10.0.0.1:7701"\npeers = ["10.0.0.2:7701", "x"]\n'
        '[scheduler]\nheartbeat_timeout = "soon"\n'
    )
    out = subprocess.run(
        [str(BIN / "schedd"), "--config", str(bad), "--check-config"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    problems = out.stderr.splitlines()
    for key in ("node.colour", "raft.peers[1]", "scheduler.heartbeat_timeout", "raft.secret_file"):
        assert any(key in line for line in problems), (key, out.stderr)
    assert "Traceback" not in out.stderr
    good = subprocess.run(
        [str(BIN / "schedd"), "--config", str(REPO / "config/cluster/n1.toml"), "--check-config"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert good.returncode == 0 and "config ok" in good.stdout
