"""A backup of a cluster of three shards, with the real binaries: ``schedctl snapshot save``
through one node writes one file holding every shard's image; ``schedctl snapshot inspect``
checks each; every node of a new cluster, at new addresses, is restored from that one file by
``schedd restore``, and started. Every job acknowledged before the save is back, in its shard,
on every node; one acknowledged after it is not; a config of another shard count is refused
naming both."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from schedd.ids import shard_of_id
from tests.cluster.harness import BIN, Cluster, _env
from tests.cluster.members import run
from tests.cluster.test_shards import SHARDS, call, listing, submit
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def schedctl(cluster: Cluster, i: int, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "schedctl"), f"--token={cluster.token}", "--server", cluster.urls[i]]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=120, env=_env(), cwd=cluster.root
    )


def restore(config: Path, backup: Path) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "schedd"), "restore", "--from", str(backup), "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())


@pytest.mark.long  # every node lost and restored: the fault-injection tier
async def test_one_command_backs_up_every_shard_and_one_file_restores_them(
    tmp_path: Path,
) -> None:
    backup = tmp_path / "cluster.snap"
    old = Cluster(tmp_path / "old", shards=SHARDS)
    old.start()
    try:
        async with aiohttp.ClientSession() as http:
            jobs = [
                await submit(
                    http,
                    old,
                    k % 3,
                    {"task": "t.x", "payload": {"k": k}, "schedule": {"in": "1h"}},
                    f"backup-request-{k}",
                )
                for k in range(18)
            ]
            ids = [j["id"] for j in jobs]
            assert {shard_of_id(i, SHARDS) for i in ids} == {0, 1, 2}

            async def everywhere() -> bool:  # every job on node 2, where the save is made
                for job_id in ids:
                    status, _ = await call(http, old, "GET", f"{old.urls[1]}/api/v1/jobs/{job_id}")
                    if status != 200:
                        return False
                return True

            await wait_for(everywhere, 30, interval=0.2)  # every job readable on node 2
            saved = schedctl(old, 1, "snapshot", "save", str(backup))
            assert saved.returncode == 0, saved.stderr
            assert "a cluster of 3 shards" in saved.stdout, saved.stdout
            late = await submit(
                http, old, 0, {"task": "t.x", "schedule": {"in": "1h"}}, "after-the-save-1"
            )
    finally:
        old.stop()

    # the file is whole: each shard's image checked, with its jobs
    shown = schedctl(old, 0, "-o", "json", "snapshot", "inspect", str(backup))
    assert shown.returncode == 0, shown.stderr
    doc = orjson.loads(shown.stdout)
    assert [s["shard"] for s in doc["shards"]] == [0, 1, 2], doc
    per_shard = [sum(1 for i in ids if shard_of_id(i, SHARDS) == k) for k in range(SHARDS)]
    assert [s["counts"]["jobs"] for s in doc["shards"]] == per_shard, doc

    new = Cluster(tmp_path / "new", shards=SHARDS)
    # a node configured for another number of shards is refused, naming both
    one = Cluster(tmp_path / "one")
    refused = restore(one.nodes[0].config, backup)
    assert refused.returncode == 2, refused
    assert "3 shards" in refused.stderr and "shards = 1" in refused.stderr, refused.stderr
    for node in new.nodes:
        done = restore(node.config, backup)
        assert done.returncode == 0, done.stderr
        assert "restored 3 shards" in done.stdout, done.stdout
    new.start()
    try:
        async with aiohttp.ClientSession() as http:
            for url in new.urls:

                async def back(url: str = url) -> list[Any] | None:
                    found = []
                    for job_id in ids:
                        status, job = await call(http, new, "GET", f"{url}/api/v1/jobs/{job_id}")
                        if status != 200:
                            return None
                        found.append(job)
                    return found

                found = await wait_for(back, 60, interval=0.3)  # every job back on this node
                assert [j["payload"] for j in found] == [{"k": k} for k in range(18)]
                assert all(j["shard"] == shard_of_id(j["id"], SHARDS) for j in found)
                status, _ = await call(http, new, "GET", f"{url}/api/v1/jobs/{late['id']}")
                assert status == 404  # acknowledged after the save: not in it
            assert sorted(await listing(http, new, new.urls[2], 5)) == sorted(ids)
    finally:
        new.stop()
        print(new.logs())

    # a stopped node of several shards, inspected: each shard's state, with its jobs
    code, out = await run("schedd", "inspect", "--data-dir", str(new.data_dir(1)), "-o", "json")
    assert code == 0, out
    report = orjson.loads(out)
    assert [r["state"]["counts"]["jobs"] for r in report["shards"]] == per_shard, report
    assert all(r["applied"]["index"] > 0 and not r["running"] for r in report["shards"])
