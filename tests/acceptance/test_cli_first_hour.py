"""A user's first hour with ``schedctl``, against a real ``schedd`` and a real ``schedd-worker``:
outcomes as exit codes, failures in plain sight and never cut, one run looked at and cancelled,
jobs named by name or id prefix, the policies on the command line, output that fits."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.acceptance.cli_tasks import LONG_ERROR
from tests.acceptance.test_cli import one_node
from tests.cluster.harness import BIN, Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

EXIT_USAGE, EXIT_FAILED, EXIT_CANCELLED, EXIT_WAIT_TIMEOUT = 2, 5, 6, 7


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with one_node(tmp_path_factory.mktemp("first-hour")) as cluster:
        cluster.start_worker(
            "--import", "tests.acceptance.cli_tasks", "--concurrency", "4", name="w-cli"
        )
        yield cluster


def ctl(
    cluster: Cluster, *args: str, columns: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    cmd = [str(BIN / "schedctl"), "--server", cluster.urls[0], f"--token={cluster.token}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def submit(cluster: Cluster, *args: str) -> dict[str, Any]:
    job: dict[str, Any] = orjson.loads(ok(ctl(cluster, "-o", "json", "submit", *args)))
    return job


def until_run(cluster: Cluster, job_id: str, state: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = orjson.loads(ok(ctl(cluster, "-o", "json", "get", job_id)))
        run = job.get("latest_run")
        if run and run["state"] == state:
            return dict(run)
        time.sleep(0.2)
    raise AssertionError(f"job {job_id}: no run {state} within {timeout}s")


def test_wait_exits_with_the_outcome_and_failures_show_whole(single: Cluster) -> None:
    good = ctl(single, "submit", "cli.ok", "--name", "first-ok", "--wait")
    assert good.returncode == 0, good.stderr
    assert "succeeded" in good.stdout
    quiet = ctl(single, "-q", "submit", "cli.ok", "--wait")
    assert quiet.returncode == 0 and len(quiet.stdout.split()) == 2  # the job id, the run id
    bad = ctl(single, "submit", "cli.boom", "--name", "first-boom", "--max-attempts", "1", "--wait")
    failed_by = time.monotonic()  # the run failed before this
    assert bad.returncode == EXIT_FAILED, (bad.stdout, bad.stderr)
    # the error is never cut: piped, it is on one line of its own, whole
    assert "ConnectionError: " + LONG_ERROR.strip() in bad.stdout
    # in an 80-column terminal it wraps, and still nothing is lost
    job = orjson.loads(ok(ctl(single, "-o", "json", "get", "first-boom")))
    narrow = ok(ctl(single, "runs", job["id"], columns="80"))
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "…" not in "".join(line for line in narrow.splitlines() if line.startswith("    "))
    joined = " ".join(line.strip() for line in narrow.splitlines() if line.startswith("    "))
    assert " ".join(LONG_ERROR.split()) in joined

    # list shows each job's latest run, and filters by its state
    listed = ok(ctl(single, "list", "--name", "first-boom"))
    # its state and how long ago: at most the time since it failed (three commands ran since)
    ago = re.search(r"failed (now|(\d+)s ago)", listed)
    assert ago is not None, listed
    assert int(ago[2] or 0) <= time.monotonic() - failed_by + 1, listed
    failed_ids = ok(ctl(single, "-q", "list", "--state", "failed")).split()
    assert job["id"] in failed_ids
    assert all(
        orjson.loads(ok(ctl(single, "-o", "json", "get", i)))["latest_run"]["state"] == "failed"
        for i in failed_ids
    )

    # one run, every attempt: worker, times, error, the tail of the traceback
    run_id = job["latest_run"]["id"]
    shown = ok(ctl(single, "run", run_id))
    assert "attempt 1: worker w-cli" in shown and "took" in shown
    assert " ".join(LONG_ERROR.split()) in " ".join(shown.split())
    assert "_connect_to_reports" in shown  # the traceback's tail, kept with the attempt
    # the dead-letter queue filters by task and time
    dead = ok(ctl(single, "-q", "dlq", "list", "--task", "cli.boom", "--since", "10m"))
    assert run_id in dead.split()
    assert ok(ctl(single, "-q", "dlq", "list", "--task", "cli.ok")).strip() == ""


def test_a_job_is_named_by_its_name_or_an_id_prefix(single: Cluster) -> None:
    job = submit(single, "cli.ok", "--in", "1h", "--name", "named-by-name")
    by_name = orjson.loads(ok(ctl(single, "-o", "json", "get", "named-by-name")))
    assert by_name["id"] == job["id"]
    prefix = job["id"][:20].lower()
    assert orjson.loads(ok(ctl(single, "-o", "json", "get", prefix)))["id"] == job["id"]
    ok(ctl(single, "pause", "named-by-name"))
    assert orjson.loads(ok(ctl(single, "-o", "json", "get", job["id"])))["status"] == "paused"
    twin = submit(single, "cli.ok", "--in", "1h", "--name", "twice")
    other = submit(single, "cli.ok", "--in", "1h", "--name", "twice")
    ambiguous = ctl(single, "get", "twice")
    assert ambiguous.returncode == EXIT_USAGE
    assert twin["id"] in ambiguous.stderr and other["id"] in ambiguous.stderr
    assert "ambiguous" in ambiguous.stderr
    # the completion's helper lists live jobs' names and ids
    words = ok(ctl(single, "__jobs", "named")).split()
    assert words == ["named-by-name"]


def test_one_run_is_cancelled_and_progress_shows(single: Cluster) -> None:
    job = submit(single, "cli.slow", "--name", "slow-one")
    run = until_run(single, job["id"], "running")
    deadline = time.monotonic() + 20
    while "progress" not in ok(ctl(single, "run", run["id"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    shown = ok(ctl(single, "run", run["id"]))
    assert 'progress: {"done":1,"of":10}' in shown
    waited = ctl(single, "wait", run["id"], "--timeout", "1s")
    assert waited.returncode == EXIT_WAIT_TIMEOUT and "running" in waited.stderr
    cancelled = ctl(single, "cancel", run["id"])
    assert cancelled.returncode == 0, cancelled.stderr
    assert ctl(single, "wait", run["id"], "--timeout", "30s").returncode == EXIT_CANCELLED


def test_policies_on_the_command_line_and_update_keeps_what_it_is_not_told(
    single: Cluster,
) -> None:
    job = submit(
        single,
        "cli.ok",
        "--every",
        "1h",
        "--overlap",
        "allow",
        "--jitter",
        "5s",
        "--misfire",
        "run_all",
        "--catchup-window",
        "2h",
        "--retry-initial",
        "2s",
        "--max-attempts",
        "7",
        "--name",
        "hourly-policies",
    )
    sched = job["schedule"]
    assert (sched["every"], sched["overlap"], sched["jitter"]) == (3600, "allow", 5)
    assert (sched["misfire"], sched["catchup_window"]) == ("run_all", 7200)
    assert (job["retry"]["initial"], job["retry"]["max_attempts"]) == (2, 7)
    updated = orjson.loads(
        ok(
            ctl(
                single,
                "-o",
                "json",
                "update",
                "hourly-policies",
                "--misfire",
                "skip",
                "--retry-max",
                "5m",
            )
        )
    )
    sched = updated["schedule"]
    assert (sched["every"], sched["overlap"], sched["jitter"]) == (3600, "allow", 5)
    assert sched["misfire"] == "skip"
    assert (updated["retry"]["max"], updated["retry"]["max_attempts"]) == (300, 7)
    shown = ok(ctl(single, "get", "hourly-policies"))
    assert "overlap=allow" in shown and "misfire=skip" in shown
    fires = orjson.loads(
        ok(
            ctl(
                single,
                "-o",
                "json",
                "explain",
                "--every",
                "90m",
                "--from",
                "2030-01-01T00:00:00Z",
                "--count",
                "2",
            )
        )
    )["fires"]
    assert [f["scheduled_at"][:16] for f in fires] == ["2030-01-01T01:30", "2030-01-01T03:00"]
    cron = submit(single, "cli.ok", "--cron", "0 9 * * *", "--tz", "Europe/Berlin")
    assert "Europe/Berlin" in ok(ctl(single, "get", cron["id"]))  # its next run in its zone


def test_output_fits_the_terminal_and_cuts_nothing_when_piped(single: Cluster) -> None:
    name = "a-long-name-" + "n" * 100
    job = submit(single, "cli.ok", "--in", "1h", "--name", name)
    piped = ok(ctl(single, "list", "--name", name))
    assert name in piped and "…" not in piped
    narrow = ok(ctl(single, "list", "--name", name, columns="60"))
    assert max(len(line) for line in narrow.splitlines()) <= 60 and job["id"] in narrow
    wide = ok(ctl(single, "-o", "wide", "list", "--name", name))
    assert "NAMESPACE" in wide and "PRIORITY" in wide and name in wide
    waited = ctl(single, "wait", job["id"], "--timeout", "1s")
    assert waited.returncode == EXIT_WAIT_TIMEOUT and "scheduled" in waited.stderr
    for binary, args in (
        ("schedctl", ["--version"]),
        ("schedctl", ["get", "--version"]),
        ("schedd", ["--version"]),
        ("schedd-worker", ["--version"]),
    ):
        done = subprocess.run(
            [str(BIN / binary), *args], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0 and done.stdout.startswith(binary + " "), (binary, done)


def test_apply_upserts_the_named_jobs_of_a_file(single: Cluster, tmp_path: Any) -> None:
    spec = tmp_path / "jobs.toml"
    spec.write_text(
        '[[job]]\nname = "applied-nightly"\ntask = "cli.ok"\n'
        'schedule = { cron = "0 2 * * *", timezone = "Europe/Berlin", overlap = "allow" }\n'
    )
    created = ok(ctl(single, "apply", "-f", str(spec)))
    assert created.startswith("created applied-nightly "), created
    job_id = created.split()[2]
    assert ok(ctl(single, "apply", "-f", str(spec))).startswith("unchanged applied-nightly")
    spec.write_text(spec.read_text().replace("0 2 * * *", "0 3 * * *"))
    dry = ok(ctl(single, "apply", "-f", str(spec), "--dry-run"))
    assert "would update applied-nightly" in dry and "0 3 * * *" in dry
    assert ok(ctl(single, "apply", "-f", str(spec))).startswith(f"updated applied-nightly {job_id}")
    job = orjson.loads(ok(ctl(single, "-o", "json", "get", "applied-nightly")))
    assert (job["id"], job["schedule"]["cron"]) == (job_id, "0 3 * * *")
