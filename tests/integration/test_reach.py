"""A node whose only peer is down says so in its log every period, with the peer's address and
the error a connect to it gets, and that it knows no leader; ``--check-config`` warns that two
nodes tolerate no failure."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from schedd.auth import ensure_admin_token
from schedd.cli import node as daemon
from schedd.config import load_config
from schedd.raft import reach
from schedd.runtime import Runtime
from tests.conftest import free_port, wait_for


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == event]


async def test_a_node_whose_peer_is_down_says_so_every_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(reach, "PERIOD_S", 0.3)
    caplog.set_level(logging.INFO)
    port, gone = free_port(), free_port()
    cfg = load_config(
        None,
        env={},
        overrides={
            "node.data_dir": str(tmp_path / "n1"),
            "http.listen": f"127.0.0.1:{port}",
            "raft.listen": f"127.0.0.1:{port + 1}",
            "raft.peers": [f"127.0.0.1:{gone + 1}"],
        },
    )
    ensure_admin_token(cfg.tokens_path)
    rt = Runtime(cfg)
    await rt.start()
    try:
        await wait_for(lambda: len(_events(caplog, "raft.peer_unreachable")) >= 2, timeout=10)
        first = _events(caplog, "raft.peer_unreachable")[0]
        assert first["peer"] == f"127.0.0.1:{gone + 1}"
        assert first["error"] == "connection refused"
        await wait_for(lambda: _events(caplog, "cluster.no_leader"), timeout=10)
        assert _events(caplog, "cluster.no_leader")[0]["reached"] == "none"
        assert _events(caplog, "cluster.size_warning")  # two nodes: no failure tolerated
    finally:
        await rt.stop()


def test_check_config_warns_that_two_nodes_tolerate_no_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "schedd.toml"
    cfg.write_text(f'[node]\ndata_dir = "{tmp_path / "d"}"\n[raft]\npeers = ["127.0.0.1:7711"]\n')
    assert daemon.main(["--config", str(cfg), "--check-config"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "config ok"
    assert "a cluster of 2 nodes tolerates no failure" in captured.err
    cfg.write_text(
        f'[node]\ndata_dir = "{tmp_path / "d"}"\n[raft]\n'
        'peers = ["127.0.0.1:7711", "127.0.0.1:7721"]\n'
    )
    assert daemon.main(["--config", str(cfg), "--check-config"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_banner_names_the_dashboard_and_how_to_log_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_config(None, env={}, overrides={"node.data_dir": str(tmp_path / "d")})
    daemon._banner(cfg, created=True)
    err = capsys.readouterr().err
    url = cfg.advertise_url()
    assert f"dashboard: {url}/ui/" in err and "schedctl ui" in err
