"""Smoke test of the benchmarks: ``scripts/bench.py --quick --no-peers`` runs every scenario once
with small counts on real clusters, exits 0 and writes every scenario's figures to its JSON.
No speed is asserted: the figures depend on the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The bench's own scenario timeouts bound it; these only stop a hung run (and every process it
# started: it runs in its own process group).
RUN_TIMEOUT = 480
pytestmark = [pytest.mark.cluster, pytest.mark.long, pytest.mark.timeout(RUN_TIMEOUT + 60)]

# One or more figures per scenario (peers are skipped by --no-peers).
SCENARIO_KEYS = [
    "ceiling",
    "syncobj_entries",
    "syncobj_ops",  # ceilings
    "s1",
    "s1_vs_ceiling",
    "s1_vs_syncobj",
    "s1_p50",
    "s1_leader_us",
    "s1_follower_us",  # S1
    "s1b",
    "s1b_5000",
    "s1b_vs_syncobj_ops",
    "s1b_leader_us",
    "s1b_follower_us",  # S1b
    "s1c_p50",
    "s1c_p99",  # S1c
    "s2",
    "s2_2w",
    "s2_2w_vs_s2",
    "s2_leader_us",
    "s2_follower_us",  # S2, 1 and 2 workers
    "s3_p50",
    "s3_p99",
    "s3_max",
    "s3_bad",  # S3
    "s3b_fire_p50",
    "s3b_fire_p99",
    "s3b_p50",
    "s3b_p99",
    "s3b_max",  # S3b
    "s3b_bad",
    "s3b_drain",
    "s3b_drain_vs_s2",
    "s4_bytes_per_job",
    "s4_load_probe_p99",
    "s4_load_probe_max",  # S4
    "s4_quiet_probe_p99",
    "s4_quiet_probe_max",
    "s4_snapshot_max",
    "s4_catchup",
    "s4_write_bytes_per_job",
    "s4_follower_write_bytes_per_job",
    "s4_save_seconds",
    "s4_save_bytes",
    "s4_save_probe_p99",
    "s4_save_follower_seconds",
    "s4_wiped_catchup",
    "s4_wiped_probe_p99",
    "s5_dispatch_p50",
    "s5_dispatch_p99",
    "s5_dispatch_max",  # S5: 1 kill under load
    "s5_ack_p50",
    "s5_lost",
    "s6_runs_per_s",
    "s6_db_kib_per_min",
    "s6_keep_db_kib_per_min",  # S6: both configurations
    "s6_db_growth_vs_keep_all",
]


def test_bench_quick_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    log = tmp_path / "bench.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "scripts" / "bench.py"),
                "--quick",
                "--no-peers",
                "--json",
                str(out),
            ],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
    tail = log.read_text(errors="replace")[-6000:]
    assert proc.returncode == 0, f"scripts/bench.py --quick exited {proc.returncode}\n{tail}"
    report = json.loads(out.read_text())
    assert report["failures"] == [], tail
    missing = [k for k in SCENARIO_KEYS if k not in report["results"]]
    assert not missing, f"no figure for {missing}\n{tail}"
    for key in SCENARIO_KEYS:
        assert set(report["results"][key]) == {"median", "min", "max"}, key
