"""``schedctl`` against a real ``schedd`` process: JSON byte for byte the API's, tables, exit codes."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.cluster.harness import BIN, Cluster

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]


@contextmanager
def one_node(root: Path) -> Iterator[Cluster]:
    """A single-node cluster of real processes, with its leader elected."""
    cluster = Cluster(root, size=1)
    cluster.start()
    try:

        async def ready() -> None:
            async with aiohttp.ClientSession() as http:
                await cluster.wait_leader(http)

        asyncio.run(ready())
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with one_node(tmp_path_factory.mktemp("cli")) as cluster:
        yield cluster


def ctl(
    cluster: Cluster, *args: str, token: str | None = None, columns: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    cmd = [
        str(BIN / "schedctl"),
        "--server",
        cluster.urls[0],
        f"--token={token or cluster.token}",
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(cmd, capture_output=True, timeout=30, cwd=cluster.root, env=env)


def api_get(cluster: Cluster, path: str) -> bytes:
    import urllib.request

    req = urllib.request.Request(cluster.urls[0] + path, headers=cluster.headers())
    with urllib.request.urlopen(req, timeout=10) as r:
        body: bytes = r.read()
        return body


def test_submit_get_runs_list_json_is_the_api_json(single: Cluster) -> None:
    out = ctl(
        single,
        "-o",
        "json",
        "submit",
        "t",
        "--payload",
        '{"a": 1}',
        "--in",
        "1h",
        "--name",
        "nightly",
        "--max-attempts",
        "4",
    )
    assert out.returncode == 0, out.stderr
    job = orjson.loads(out.stdout)
    assert (
        job["name"] == "nightly"
        and job["retry"]["max_attempts"] == 4
        and job["payload"] == {"a": 1}
    )
    for args, path in [
        (("get", job["id"]), f"/api/v1/jobs/{job['id']}"),
        (("runs", job["id"]), f"/api/v1/jobs/{job['id']}/runs"),
        (("cluster",), "/api/v1/cluster"),
    ]:
        got = ctl(single, "-o", "json", *args)
        assert got.returncode == 0, got.stderr
        if args[0] != "cluster":  # the cluster view carries live indexes
            assert got.stdout == api_get(single, path) + b"\n"
        else:
            assert orjson.loads(got.stdout)["node_id"] == "n1"
    listed = orjson.loads(ctl(single, "-o", "json", "list").stdout)
    assert job["id"] in [j["id"] for j in listed["jobs"]]


def test_tables_fit_80_columns(single: Cluster) -> None:
    job = orjson.loads(
        ctl(
            single,
            "-o",
            "json",
            "submit",
            "a.very.long.task.name.for.testing.widths",
            "--in",
            "1h",
            "--name",
            "n" * 120,
        ).stdout
    )
    for args in (("list",), ("get", job["id"]), ("runs", job["id"]), ("cluster",)):
        out = ctl(single, *args, columns="80")  # a terminal of 80 columns
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip()
        widths = [len(line) for line in out.stdout.decode().splitlines()]
        assert max(widths) <= 80, (args, out.stdout.decode())


def test_cancel_and_exit_codes(single: Cluster) -> None:
    job = orjson.loads(ctl(single, "-o", "json", "submit", "t", "--in", "1h").stdout)
    done = ctl(single, "cancel", job["id"])
    assert done.returncode == 0, done.stderr
    got = orjson.loads(ctl(single, "-o", "json", "get", job["id"]).stdout)
    assert got["status"] == "cancelled"
    missing = ctl(single, "get", "no-such-job")
    assert missing.returncode == 3 and b"not_found" in missing.stderr
    bad = ctl(single, "submit", "t", "--priority", "urgent")
    assert bad.returncode == 2
    server_says_no = ctl(single, "submit", "t", "--cron", "not a cron")
    assert server_says_no.returncode == 2 and b"schedule.cron" in server_says_no.stderr
    unauth = ctl(single, "list", token="not-a-valid-token-at-all")
    assert unauth.returncode == 1 and b"unauthenticated" in unauth.stderr
    assert b"Traceback" not in unauth.stderr + bad.stderr + missing.stderr


def test_unreachable_cluster_exits_4(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(BIN / "schedctl"), "--server", "http://127.0.0.1:1", "--token", "x" * 20, "list"],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert out.returncode == 4 and b"cannot reach" in out.stderr


def test_lifecycle_commands_against_a_live_server(single: Cluster) -> None:
    job = orjson.loads(
        ctl(
            single, "-o", "json", "submit", "t", "--cron", "0 3 * * *", "--tz", "Europe/Berlin"
        ).stdout
    )
    paused = ctl(single, "-o", "json", "pause", job["id"])
    assert paused.returncode == 0 and orjson.loads(paused.stdout)["status"] == "paused"
    resumed = ctl(single, "-o", "json", "resume", job["id"])
    assert orjson.loads(resumed.stdout)["status"] == "active"
    updated = ctl(single, "-o", "json", "update", job["id"], "--every", "10m", "--priority", "low")
    assert updated.returncode == 0, updated.stderr
    assert orjson.loads(updated.stdout)["priority"] == "low"
    trig = ctl(single, "-o", "json", "trigger", job["id"], "--override")
    assert trig.returncode == 0 and orjson.loads(trig.stdout)["job_id"] == job["id"]
    explain = ctl(
        single,
        "explain",
        "--cron",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--count",
        "400",
        columns="80",
    )
    assert explain.returncode == 0 and b"does not exist" in explain.stdout
    assert max(len(line) for line in explain.stdout.decode().splitlines()) <= 80
    one = ctl(single, "-o", "json", "explain", job["id"], "--count", "2")
    assert len(orjson.loads(one.stdout)["fires"]) == 2
    dlq = ctl(single, "dlq", "list")
    assert dlq.returncode == 0
    missing = ctl(single, "dlq", "replay", "nope@1")
    assert missing.returncode == 3
