"""schedctl apply against a real one-node cluster: create, apply again (no write), update in
place, dry run, refuse and replace, a bad file, and two live jobs of one name."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.cli.apply import apply_file
from schedd.cli.client import Client, Response, UsageError, parse_server
from schedd.cli.schedctl import server_error
from tests.conftest import Node

API = "/api/v1"

JOBS = """
[[job]]
task = "reports.generate"
name = "nightly"
payload = { report = "sales" }
priority = "high"
timeout = "30m"
retry = { max_attempts = 5 }
[job.schedule]
cron = "0 2 * * *"
timezone = "Europe/Berlin"
overlap = "buffer_one"
misfire = "skip"

[[job]]
task = "cache.clean"
name = "hourly"
queue = "maintenance"
schedule = { every = "1h", jitter = "30s" }
"""


@dataclass
class CountingClient(Client):
    """A real client that remembers the method and path of every request it sends."""

    sent: list[tuple[str, str]] = field(default_factory=list)

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        self.sent.append((method, path))
        return super().request(method, path, **kwargs)

    @property
    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.sent if m != "GET"]


@dataclass
class Applied:
    code: int
    lines: list[str]
    err: str
    client: CountingClient


async def apply(
    node: Node, tmp_path: Path, text: str, *, dry_run: bool = False, replace: bool = False
) -> Applied:
    path = tmp_path / "jobs.toml"
    path.write_text(text)
    client = CountingClient([parse_server(node.url)], node.token)
    out, err = io.BytesIO(), io.StringIO()
    code = await asyncio.to_thread(
        apply_file,
        client,
        str(path),
        dry_run=dry_run,
        replace=replace,
        output="table",
        out=out,
        err=err,
        server_error=server_error,
    )
    return Applied(code, out.getvalue().decode().splitlines(), err.getvalue(), client)


async def get(http: aiohttp.ClientSession, node: Node, path: str) -> dict[str, Any]:
    async with http.get(node.url + API + path, headers=node.headers()) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def jobs_named(http: aiohttp.ClientSession, node: Node, name: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = (await get(http, node, f"/jobs?name={name}"))["jobs"]
    return jobs


def ids_of(lines: list[str]) -> dict[str, str]:
    """``created nightly 01J…`` → ``{"nightly": "01J…"}``."""
    return {line.split()[1]: line.split()[2] for line in lines}


async def test_apply_creates_and_applying_again_sends_no_write(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    first = await apply(node, tmp_path, JOBS)
    assert first.code == 0, first.lines
    assert [line.split()[:2] for line in first.lines] == [
        ["created", "nightly"],
        ["created", "hourly"],
    ]
    assert first.err == "schedctl: 2 created\n"
    ids = ids_of(first.lines)
    nightly = await get(http, node, f"/jobs/{ids['nightly']}")
    assert nightly["schedule"]["cron"] == "0 2 * * *"
    assert nightly["schedule"]["timezone"] == "Europe/Berlin"
    assert nightly["schedule"]["overlap"] == "buffer_one" and nightly["priority"] == "high"
    hourly = await get(http, node, f"/jobs/{ids['hourly']}")
    assert hourly["schedule"]["every"] == 3600 and hourly["queue"] == "maintenance"

    again = await apply(node, tmp_path, JOBS)
    assert again.code == 0
    assert again.lines == [
        f"unchanged nightly {ids['nightly']}",
        f"unchanged hourly {ids['hourly']}",
    ]
    assert again.err == "schedctl: 2 unchanged\n"
    assert again.client.writes == []
    for name, before in (("nightly", nightly), ("hourly", hourly)):
        after = await get(http, node, f"/jobs/{ids[name]}")
        assert after["updated_at"] == before["updated_at"]
        assert len(await jobs_named(http, node, name)) == 1


async def test_a_changed_cron_updates_the_job_in_place(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    ids = ids_of((await apply(node, tmp_path, JOBS)).lines)
    changed = JOBS.replace('cron = "0 2 * * *"', 'cron = "0 3 * * *"')
    result = await apply(node, tmp_path, changed)
    assert result.code == 0
    assert result.lines == [
        f"updated nightly {ids['nightly']}: schedule.cron '0 2 * * *' → '0 3 * * *'",
        f"unchanged hourly {ids['hourly']}",
    ]
    assert result.client.writes == [("PATCH", f"{API}/jobs/{ids['nightly']}")]
    job = await get(http, node, f"/jobs/{ids['nightly']}")
    assert job["schedule"]["cron"] == "0 3 * * *"
    assert job["schedule"]["timezone"] == "Europe/Berlin"  # the rest of the schedule is kept
    assert job["schedule"]["overlap"] == "buffer_one" and job["status"] == "active"
    assert (await apply(node, tmp_path, changed)).client.writes == []


async def test_a_dry_run_reports_and_writes_nothing(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    dry = await apply(node, tmp_path, JOBS, dry_run=True)
    assert (dry.code, dry.lines) == (0, ["would create nightly", "would create hourly"])
    assert dry.err == "schedctl: dry run, nothing was changed: 2 to create\n"
    assert dry.client.writes == [] and await jobs_named(http, node, "nightly") == []
    ids = ids_of((await apply(node, tmp_path, JOBS)).lines)
    changed = JOBS.replace('priority = "high"', 'priority = "low"')
    dry = await apply(node, tmp_path, changed, dry_run=True)
    assert dry.lines[0] == f"would update nightly {ids['nightly']}: priority high → low"
    assert dry.client.writes == []
    assert (await get(http, node, f"/jobs/{ids['nightly']}"))["priority"] == "high"


async def test_a_changed_task_is_refused_without_replace_and_replaced_with_it(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    ids = ids_of((await apply(node, tmp_path, JOBS)).lines)
    old = ids["nightly"]
    changed = JOBS.replace('task = "reports.generate"', 'task = "reports.build"')
    refused = await apply(node, tmp_path, changed)
    assert refused.code == 1
    assert refused.lines[0] == (
        f"error nightly: task reports.generate → reports.build cannot change on a job; "
        f"--replace cancels job {old} and submits a new one"
    )
    assert refused.lines[1] == f"unchanged hourly {ids['hourly']}"
    assert refused.err == "schedctl: 1 unchanged, 1 failed\n" and refused.client.writes == []

    dry = await apply(node, tmp_path, changed, replace=True, dry_run=True)
    assert dry.lines[0] == f"would replace nightly {old}: task reports.generate → reports.build"
    assert dry.client.writes == []

    replaced = await apply(node, tmp_path, changed, replace=True)
    assert replaced.code == 0
    verb, name, was, arrow, new = replaced.lines[0].split()[:5]
    assert (verb, name, was, arrow) == ("replaced", "nightly", old, "→") and new.rstrip(":") != old
    new = new.rstrip(":")
    assert replaced.client.writes == [("DELETE", f"{API}/jobs/{old}"), ("POST", f"{API}/jobs")]
    assert (await get(http, node, f"/jobs/{old}"))["status"] == "cancelled"
    job = await get(http, node, f"/jobs/{new}")
    assert job["task"] == "reports.build" and job["status"] == "active"
    assert job["schedule"]["cron"] == "0 2 * * *"
    # the cancelled one is not counted any more
    assert (await apply(node, tmp_path, changed)).lines[0] == f"unchanged nightly {new}"


async def test_a_paused_item_is_created_paused_and_resumed_by_the_file(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    text = '[[job]]\ntask = "t"\nname = "held"\nschedule = {every = "1h"}\npaused = true\n'
    result = await apply(node, tmp_path, text)
    (line,) = result.lines
    assert line.startswith("created held ") and line.endswith(" (paused)")
    job_id = line.split()[2]
    assert (await get(http, node, f"/jobs/{job_id}"))["status"] == "paused"
    assert (await apply(node, tmp_path, text)).lines == [f"unchanged held {job_id}"]
    result = await apply(node, tmp_path, text.replace("paused = true", "paused = false"))
    assert result.lines == [f"updated held {job_id}: paused true → false"]
    assert (await get(http, node, f"/jobs/{job_id}"))["status"] == "active"


async def test_a_duplicate_name_in_the_file_is_exit_2_before_any_request(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    text = JOBS + '\n[[job]]\ntask = "other"\nname = "nightly"\n'
    with pytest.raises(UsageError) as info:
        await apply(node, tmp_path, text)
    assert info.value.exit_code == 2
    assert 'item 3 (name "nightly"): name: the same namespace (default) and name as item 1' in (
        info.value.message
    )
    assert await jobs_named(http, node, "nightly") == []


async def test_two_live_jobs_of_one_name_fail_that_item_and_the_others_are_applied(
    node: Node, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    twins = []
    for _ in range(2):
        body = {"task": "reports.generate", "name": "nightly", "schedule": {"every": 60}}
        async with http.post(node.url + API + "/jobs", json=body, headers=node.headers()) as r:
            assert r.status == 201
            twins.append((await r.json())["id"])
    result = await apply(node, tmp_path, JOBS)
    assert result.code == 1
    assert result.lines[0] == (
        f"error nightly: 2 live jobs have this name in namespace default ({twins[1]}, "
        f"{twins[0]}); apply needs one: cancel the others (schedctl cancel ID)"  # newest first
    )
    assert result.lines[1].startswith("created hourly ")
    assert result.err == "schedctl: 1 created, 1 failed\n"
    assert result.client.writes == [("POST", f"{API}/jobs")]
    assert len(await jobs_named(http, node, "hourly")) == 1
