"""schedctl apply: reading and checking the file, comparing a job with an item, deciding what to
do, and what is printed (against an in-memory client; tests/integration/test_apply.py runs it
against a real node)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from schedd.api.views import job_view
from schedd.cli.apply import (
    Item,
    Plan,
    apply_file,
    diff_specs,
    load_items,
    parse_items,
    plan_item,
    same_json,
    spec_of_view,
)
from schedd.cli.client import Client, Response, Unreachable, UsageError, parse_server
from schedd.cli.schedctl import server_error
from schedd.core.model import Job, JobStatus
from schedd.core.validate import DEFAULTS, Defaults, parse_job

NOW = 1_790_000_000_000

NIGHTLY = b"""
[[job]]
task = "reports.generate"
name = "nightly"
namespace = "reports"
payload = { report = "sales", days = 1 }
priority = "high"
timeout = "30m"
retry = { max_attempts = 5, initial = "2s" }
[job.schedule]
cron = "0 2 * * *"
timezone = "Europe/Berlin"
overlap = "allow"
catchup_window = "1h"
dst = { gap = "skip" }
start_at = 2026-01-01T00:00:00Z

[[job]]
task = "cache.clean"
name = "hourly"
schedule = { every = "1h", jitter = "30s" }
paused = true
"""


def items_of(text: bytes | str, fmt: str | None = "toml") -> list[Item]:
    data = text.encode() if isinstance(text, str) else text
    return parse_items(data, fmt, "jobs.toml", NOW)


def one(text: str, fmt: str | None = "toml") -> Item:
    (item,) = items_of(text, fmt)
    return item


def view_of(
    body: Mapping[str, Any],
    status: JobStatus = JobStatus.ACTIVE,
    job_id: str = "J1",
    defaults: Defaults = DEFAULTS,
) -> dict[str, Any]:
    """The job the server would show for ``body`` (the real view code, through JSON)."""
    spec = parse_job(body, now_ms=NOW, defaults=defaults)
    view = job_view(Job(job_id, spec, status, NOW, NOW), None)
    return dict(orjson.loads(orjson.dumps(view)))


def planned(
    served: dict[str, Any] | list[dict[str, Any]],
    lines: str = "",
    *,
    task: str = "t",
    replace_jobs: bool = False,
) -> Plan:
    """The plan for the job ``task = "t"``, ``name = "a"`` plus ``lines``, against ``served``
    (the live job, or a list of them)."""
    item = one(f'[[job]]\ntask = "{task}"\nname = "a"\n' + lines)
    live = served if isinstance(served, list) else [served]
    return plan_item(item, live, replace_jobs=replace_jobs)


def texts(plan: Plan) -> list[str]:
    return [c.text() for c in plan.changes]


def problem(text: str | bytes, fmt: str | None = "toml") -> str:
    with pytest.raises(UsageError) as info:
        items_of(text, fmt)
    assert info.value.exit_code == 2
    return info.value.message


# ---- reading the file ------------------------------------------------------------------------


def test_toml_items_are_job_bodies_with_an_optional_paused() -> None:
    nightly, hourly = items_of(NIGHTLY)
    assert (nightly.index, nightly.name, nightly.namespace) == (1, "nightly", "reports")
    assert nightly.paused is None and hourly.paused is True
    assert "paused" not in hourly.body
    # a TOML time becomes the RFC 3339 string the API takes
    assert nightly.body["schedule"]["start_at"] == "2026-01-01T00:00:00+00:00"
    assert nightly.spec.schedule.cron == "0 2 * * *" and nightly.spec.timeout_ms == 1_800_000
    assert hourly.spec.schedule.every_ms == 3_600_000


def test_json_as_an_object_of_jobs_or_a_bare_list_and_stdin_by_content() -> None:
    body = [{"task": "t", "name": "a", "schedule": {"every": 60}}]
    for data in (orjson.dumps({"jobs": body}), orjson.dumps(body)):
        assert [i.name for i in items_of(data, "json")] == ["a"]
        assert [i.name for i in items_of(data, None)] == ["a"]  # told by content
    toml = items_of(b'[[job]]\ntask = "t"\nname = "a"\n', None)
    assert [i.name for i in toml] == ["a"]
    stdin = io.BytesIO(orjson.dumps({"jobs": body}))
    assert [i.name for i in load_items("-", stdin, NOW)] == ["a"]


def test_the_extension_chooses_the_format(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_bytes(b'[{"task": "t", "name": "a"}]')
    assert [i.name for i in load_items(str(path), now_ms=NOW)] == ["a"]
    bad = tmp_path / "jobs.toml"
    bad.write_bytes(b'[{"task": "t", "name": "a"}]')
    with pytest.raises(UsageError, match="not valid TOML"):
        load_items(str(bad), now_ms=NOW)
    with pytest.raises(UsageError, match="cannot read"):
        load_items(str(tmp_path / "missing.toml"), now_ms=NOW)


def test_the_servers_own_message_names_the_item_and_the_field() -> None:
    text = '[[job]]\ntask = "t"\nname = "a"\n[[job]]\ntask = "t"\nname = "b"\nschedule = {cron = "0 2 * *"}\n'
    message = problem(text)
    assert message.startswith('jobs.toml: item 2 (name "b"): schedule.cron: expected a cron')
    assert message.endswith("nothing was sent")


def test_every_problem_is_reported_at_once() -> None:
    text = """
[[job]]
task = "t"
[[job]]
task = "t"
name = "x"
priority = "urgent"
[[job]]
task = "t"
name = "y"
colour = "red"
[[job]]
task = "t"
name = "z"
paused = "yes"
"""
    lines = problem(text).splitlines()
    assert lines[0] == "jobs.toml: 4 problems; nothing was sent:"
    assert lines[1].startswith('  item 1 (task "t"): name: required in an apply file')
    assert lines[2].startswith('  item 2 (name "x"): priority: expected one of high')
    assert lines[3].startswith('  item 3 (name "y"): colour: unknown field; expected one of')
    assert lines[3].endswith("idempotency_key, paused")
    assert lines[4] == '  item 4 (name "z"): paused: expected true or false, got yes'


def test_a_name_is_unique_per_namespace_within_the_file() -> None:
    text = """
[[job]]
task = "t"
name = "a"
[[job]]
task = "t"
name = "a"
namespace = "other"
[[job]]
task = "u"
name = "a"
"""
    message = problem(text)
    assert 'item 3 (name "a"): name: the same namespace (default) and name as item 1' in message
    assert "item 2" not in message


def test_an_idempotency_key_is_unique_per_namespace_within_the_file() -> None:
    text = '[[job]]\ntask="t"\nname="a"\nidempotency_key="k"\n[[job]]\ntask="t"\nname="b"\nidempotency_key="k"\n'
    assert 'item 2 (name "b"): idempotency_key: "k" is also item 1\'s' in problem(text)


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        (b"", "toml", "no jobs in the file"),
        (b"[]", "json", "no jobs in the file"),
        (b'{"jobs": []}', "json", "no jobs in the file"),
        (b'[[jobs]]\ntask = "t"\n', "toml", 'unknown top-level key "jobs"'),
        (b'{"jobs": {"task": "t"}}', "json", "jobs: expected a list of jobs"),
        (b'job = {task = "t"}\n', "toml", "job: expected a list of jobs, got dict"),
        (b'{"job": [{"task": "t"}]}', "json", 'unknown top-level key "job"'),
        (b'"t"', "json", "got str"),
        (b"[1]", "json", "item 1: expected a job table/object, got int"),
        (b"[nope", None, "neither JSON"),
        (b"{nope", None, "not valid JSON"),
        (b"{nope", "json", "not valid JSON"),
        (b"\xff", "toml", "not UTF-8"),
        (
            b'[[job]]\ntask = "t"\nname = "a"\nschedule = {at = 2026-01-01T02:00:00}\n',
            "toml",
            'item 1 (name "a"): schedule.at: expected a time with a zone offset',
        ),
    ],
)
def test_bad_files(text: bytes, fmt: str | None, expected: str) -> None:
    assert expected in problem(text, fmt)


def test_a_payload_size_is_left_to_the_server() -> None:
    # the server's scheduler.max_payload is its config: a client does not know it
    item = one(f'[[job]]\ntask = "t"\nname = "a"\npayload = "{"x" * 70_000}"\n')
    assert len(item.spec.payload) == 70_000


# ---- comparing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"task": "t", "name": "a"},
        {"task": "t", "name": "a", "schedule": {"at": "2026-11-25T02:00:00Z"}},
        {"task": "t", "name": "a", "schedule": {"in": "10m"}},
        {
            "task": "t",
            "name": "a",
            "schedule": {"every": 90, "jitter": 1.5, "end_at": "2030-01-01T00:00:00Z"},
        },
        {
            "task": "reports.generate",
            "name": "nightly",
            "namespace": "reports",
            "queue": "slow",
            "payload": {"report": "sales", "ok": True, "n": [1, 2.5, None]},
            "schedule": {
                "cron": "0 2 * * *",
                "timezone": "Europe/Berlin",
                "jitter": "5m",
                "misfire": "run_all",
                "catchup_window": "1h",
                "overlap": "buffer_one",
                "dst": {"gap": "skip", "repeat": "both"},
                "start_at": "2026-01-01T00:00:00Z",
                "end_at": "2027-01-01T00:00:00.5Z",
            },
            "priority": "low",
            "retry": {
                "max_attempts": 7,
                "initial": "1.5s",
                "max": "1h",
                "multiplier": 3,
                "jitter": False,
            },
            "timeout": 1.001,
            "heartbeat_timeout": "2m",
            "depends_on": ["B", "A"],
            "idempotency_key": "nightly-v1",
        },
    ],
)
def test_a_job_as_the_server_shows_it_compares_equal_to_its_body(body: dict[str, Any]) -> None:
    item = one(orjson.dumps([body]).decode(), "json")
    view = view_of(body)
    assert plan_item(item, [view], replace_jobs=False).action == "unchanged"
    current = spec_of_view(view)
    assert diff_specs(current, current) == []


def test_durations_and_cron_spacing_and_defaults_compare_semantically() -> None:
    served = {
        "task": "t",
        "name": "a",
        "schedule": {"cron": "0 2 * * *"},
        "timeout": 3600,
        "retry": {"initial": 1},
        "priority": "normal",
        "queue": "default",
    }
    lines = (
        'timeout = "1h"\nschedule = {cron = " 0  2 * * * ", timezone = "UTC", overlap = "skip"}\n'
    )
    assert planned(view_of(served), lines).action == "unchanged"


def test_config_defaults_left_out_of_the_file_are_what_the_job_has() -> None:
    # the server's config says 9 attempts and 30 s heartbeats: not a change, and no --replace
    served = view_of(
        {"task": "t", "name": "a"}, defaults=Defaults(max_attempts=9, heartbeat_timeout_ms=30_000)
    )
    assert planned(served).action == "unchanged"
    # given in the file, they count
    plan = planned(served, "retry = {max_attempts = 3}\n")
    assert texts(plan) == ["retry.max_attempts 9 → 3"]
    assert plan.patch == {
        "retry": {"max_attempts": 3, "initial": 1, "max": 600, "multiplier": 2.0, "jitter": True}
    }


def test_a_retry_policy_left_out_goes_back_to_the_defaults_but_keeps_max_attempts() -> None:
    served = view_of({"task": "t", "name": "a", "retry": {"max_attempts": 4, "initial": "5s"}})
    plan = planned(served)
    assert texts(plan) == ["retry.initial 5s → 1s"]
    assert plan.patch is not None and plan.patch["retry"]["max_attempts"] == 4


def test_json_equality_tells_true_from_1_but_not_1_from_1_0() -> None:
    assert same_json({"a": 1, "b": [1.0]}, {"b": [1], "a": 1.0})
    assert not same_json({"a": True}, {"a": 1})
    assert not same_json([1, 2], [2, 1]) and not same_json("1", 1) and not same_json(None, 0)
    served = view_of({"task": "t", "name": "a", "payload": {"on": 1}})
    plan = planned(served, "payload = {on = true}\n")
    assert texts(plan) == ['payload {"on":1} → {"on":true}']


def test_the_diff_is_readable_and_the_patch_holds_only_what_changed() -> None:
    served = view_of(
        {"task": "t", "name": "a", "schedule": {"cron": "0 2 * * *"}, "payload": {"x": 1}}
    )
    lines = 'priority = "high"\npayload = {x = 1}\nschedule = {cron = "0 3 * * *", jitter = "5m"}\n'
    plan = planned(served, lines)
    assert plan.action == "update" and plan.job_id == "J1"
    assert texts(plan) == [
        "schedule.cron '0 2 * * *' → '0 3 * * *'",
        "schedule.jitter 0s → 5m",
        "priority normal → high",
    ]
    assert plan.patch == {"schedule": {"cron": "0 3 * * *", "jitter": "5m"}, "priority": "high"}
    assert plan.changes[0].as_json() == {
        "field": "schedule.cron",
        "from": "0 2 * * *",
        "to": "0 3 * * *",
    }


def test_another_kind_of_schedule_is_one_change() -> None:
    served = view_of({"task": "t", "name": "a", "schedule": {"cron": "0 2 * * *"}})
    plan = planned(served, 'schedule = {every = "1h"}\n')
    assert texts(plan) == ["schedule cron '0 2 * * *' → every 1h"]
    plan = planned(served)
    assert texts(plan) == ["schedule cron '0 2 * * *' → now"]
    assert plan.patch == {"schedule": None}


def test_an_in_schedule_compares_by_its_delay() -> None:
    served = view_of({"task": "t", "name": "a", "schedule": {"in": 600}})
    assert planned(served, 'schedule = {in = "10m"}\n').action == "unchanged"
    plan = planned(served, 'schedule = {in = "20m"}\n')
    assert texts(plan) == ["schedule.in 10m → 20m"]


def test_paused_is_compared_only_when_the_file_says() -> None:
    served = view_of({"task": "t", "name": "a"}, JobStatus.PAUSED)
    assert planned(served).action == "unchanged"
    plan = planned(served, "paused = false\n")
    assert plan.patch == {"paused": False} and texts(plan) == ["paused true → false"]


# ---- deciding --------------------------------------------------------------------------------


def test_none_live_creates_it_paused_when_the_file_says() -> None:
    assert planned([]).action == "create"
    plan = planned([], "paused = true\n")
    assert (plan.action, plan.pause_new) == ("create", True)


def test_two_live_jobs_of_the_name_are_refused_naming_them() -> None:
    live = [view_of({"task": "t", "name": "a"}, job_id=i) for i in ("J1", "J2")]
    plan = planned(live, replace_jobs=True)
    assert plan.action == "error" and plan.error is not None
    assert "2 live jobs have this name in namespace default (J1, J2)" in plan.error


@pytest.mark.parametrize(
    ("task", "line", "field"),
    [
        ("u", "", "task t → u"),
        ("t", 'queue = "slow"', "queue default → slow"),
        ("t", 'heartbeat_timeout = "5m"', "heartbeat_timeout 1m → 5m"),
        ("t", 'depends_on = ["X"]', 'depends_on [] → ["X"]'),
        ("t", 'idempotency_key = "k"', "idempotency_key none → k"),
    ],
)
def test_what_patch_cannot_change_is_refused_without_replace(
    task: str, line: str, field: str
) -> None:
    served = view_of({"task": "t", "name": "a"}, JobStatus.PAUSED)
    plan = planned(served, line + "\n", task=task)
    assert plan.action == "error" and plan.error is not None
    assert field in plan.error and "--replace cancels job J1 and submits a new one" in plan.error
    plan = planned(served, line + "\n", task=task, replace_jobs=True)
    assert (plan.action, plan.job_id, plan.pause_new) == ("replace", "J1", True)  # stays paused


def test_a_replacement_cannot_reuse_the_idempotency_key() -> None:
    served = view_of({"task": "t", "name": "a", "idempotency_key": "k"})
    plan = planned(served, 'idempotency_key = "k"\n', task="u", replace_jobs=True)
    assert plan.action == "error" and plan.error is not None
    assert 'reuse idempotency_key "k"' in plan.error


# ---- doing, against an in-memory client ------------------------------------------------------


@dataclass
class FakeClient(Client):
    """Answers from ``jobs`` (the server's jobs by id) and records the writes."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, str, Any]] = field(default_factory=list)
    fail: dict[tuple[str, str], tuple[int, bytes]] = field(default_factory=dict)

    def request(
        self, method: str, path: str, *, query: Sequence[tuple[str, str]] = (), **kwargs: Any
    ) -> Response:
        body: bytes | None = kwargs.get("body")
        server = self.servers[0]
        if (method, path) in self.fail:
            status, data = self.fail[(method, path)]
            return Response(server, status, "", {}, data)
        payload = None if body is None else orjson.loads(body)
        if method != "GET":
            self.writes.append((method, path, payload))
        if method == "GET":
            q = dict(query)
            found = [
                j
                for j in self.jobs.values()
                if j["name"] == q["name"] and j["namespace"] == q["namespace"]
            ]
            return Response(
                server, 200, "OK", {}, orjson.dumps({"jobs": found, "next_cursor": None})
            )
        if method == "POST":
            job_id = f"J{len(self.jobs) + 1}"
            self.jobs[job_id] = view_of(payload, job_id=job_id)
            return Response(server, 201, "Created", {}, orjson.dumps(self.jobs[job_id]))
        job_id = path.rsplit("/", 1)[1]
        if method == "DELETE":
            self.jobs[job_id]["status"] = "cancelled"
            return Response(server, 204, "No Content", {}, b"")
        if payload.get("paused") is not None:
            self.jobs[job_id]["status"] = "paused" if payload["paused"] else "active"
        self.jobs[job_id].update({k: v for k, v in payload.items() if k != "paused"})
        return Response(server, 200, "OK", {}, orjson.dumps(self.jobs[job_id]))


def fake() -> FakeClient:
    return FakeClient([parse_server("http://127.0.0.1:7700")])


def apply(
    client: FakeClient, text: bytes, output: str = "table", **flags: bool
) -> tuple[int, list[str], str]:
    out, err = io.BytesIO(), io.StringIO()
    code = apply_file(
        client,
        "-",
        dry_run=flags.get("dry_run", False),
        replace=flags.get("replace", False),
        output=output,
        out=out,
        err=err,
        server_error=server_error,
        stdin=io.BytesIO(text),
        now_ms=NOW,
    )
    return code, out.getvalue().decode().splitlines(), err.getvalue()


def test_apply_creates_then_changes_nothing_then_updates_in_place() -> None:
    client = fake()
    code, lines, err = apply(client, NIGHTLY)
    assert code == 0 and lines == ["created reports/nightly J1", "created hourly J2 (paused)"]
    assert err == "schedctl: 2 created\n"
    assert [(m, p) for m, p, _ in client.writes] == [
        ("POST", "/api/v1/jobs"),
        ("POST", "/api/v1/jobs"),
        ("PATCH", "/api/v1/jobs/J2"),
    ]
    client.writes.clear()
    code, lines, err = apply(client, NIGHTLY)
    assert (code, lines, err) == (
        0,
        ["unchanged reports/nightly J1", "unchanged hourly J2"],
        "schedctl: 2 unchanged\n",
    )
    assert client.writes == []
    code, lines, _ = apply(client, NIGHTLY.replace(b"0 2 * * *", b"0 3 * * *"), dry_run=True)
    assert lines[0] == "would update reports/nightly J1: schedule.cron '0 2 * * *' → '0 3 * * *'"
    assert client.writes == []
    code, lines, err = apply(client, NIGHTLY.replace(b"0 2 * * *", b"0 3 * * *"))
    assert lines[0] == "updated reports/nightly J1: schedule.cron '0 2 * * *' → '0 3 * * *'"
    assert err == "schedctl: 1 updated, 1 unchanged\n"
    assert client.writes == [
        (
            "PATCH",
            "/api/v1/jobs/J1",
            {
                "schedule": {
                    "cron": "0 3 * * *",
                    "timezone": "Europe/Berlin",
                    "overlap": "allow",
                    "catchup_window": "1h",
                    "dst": {"gap": "skip"},
                    "start_at": "2026-01-01T00:00:00+00:00",
                }
            },
        )
    ]


def test_replace_cancels_and_submits_and_json_output() -> None:
    client = fake()
    apply(client, b'[[job]]\ntask = "t"\nname = "a"\n')
    code, lines, _ = apply(client, b'[[job]]\ntask = "u"\nname = "a"\n')
    assert code == 1 and lines == [
        "error a: task t → u cannot change on a job; --replace cancels job J1 and submits a new one"
    ]
    code, lines, err = apply(
        client, b'[[job]]\ntask = "u"\nname = "a"\n', "json", replace=True, dry_run=True
    )
    assert code == 0 and err == "" and [orjson.loads(x)["action"] for x in lines] == ["replace"]
    code, lines, err = apply(client, b'[[job]]\ntask = "u"\nname = "a"\n', "json", replace=True)
    assert code == 0 and err == ""
    assert [orjson.loads(x) for x in lines] == [
        {
            "name": "a",
            "namespace": "default",
            "action": "replace",
            "dry_run": False,
            "id": "J2",
            "replaced_id": "J1",
            "changes": [{"field": "task", "from": "t", "to": "u"}],
            "error": None,
        }
    ]
    assert client.jobs["J1"]["status"] == "cancelled" and client.jobs["J2"]["task"] == "u"


def test_a_failing_item_does_not_stop_the_others() -> None:
    client = fake()
    conflict = b'{"error": {"code": "conflict", "message": "a one-off job whose run started cannot change"}}'
    apply(client, b'[[job]]\ntask = "t"\nname = "a"\n[[job]]\ntask = "t"\nname = "b"\n')
    client.fail[("PATCH", "/api/v1/jobs/J1")] = (409, conflict)
    text = b'[[job]]\ntask = "t"\nname = "a"\npriority = "high"\n[[job]]\ntask = "t"\nname = "b"\npriority = "low"\n[[job]]\ntask = "t"\nname = "c"\n'
    code, lines, err = apply(client, text)
    assert code == 1
    assert lines == [
        "error a: http://127.0.0.1:7700: conflict: a one-off job whose run started cannot change",
        "updated b J2: priority normal → low",
        "created c J3",
    ]
    assert err == "schedctl: 1 created, 1 updated, 1 failed\n"


def test_a_refused_token_stops_at_once() -> None:
    client = fake()
    client.fail[("GET", "/api/v1/jobs")] = (
        401,
        b'{"error": {"code": "unauthenticated", "message": "no token"}}',
    )
    with pytest.raises(Exception) as info:
        apply(client, b'[[job]]\ntask = "t"\nname = "a"\n[[job]]\ntask = "t"\nname = "b"\n')
    assert getattr(info.value, "exit_code", None) == 1 and "pass --token" in str(info.value)


def test_an_unreachable_cluster_is_exit_4_after_what_was_done() -> None:
    class Flaky(FakeClient):
        def request(self, method: str, path: str, **kwargs: Any) -> Response:
            if self.jobs:
                raise Unreachable("cannot reach http://127.0.0.1:7700: connection refused")
            return super().request(method, path, **kwargs)

    client = Flaky([parse_server("http://127.0.0.1:7700")])
    with pytest.raises(Unreachable) as info:
        apply(client, b'[[job]]\ntask = "t"\nname = "a"\n[[job]]\ntask = "t"\nname = "b"\n')
    assert info.value.exit_code == 4 and list(client.jobs) == ["J1"]


def test_a_bad_file_sends_nothing() -> None:
    client = fake()
    with pytest.raises(UsageError):
        apply(client, b'[[job]]\ntask = "t"\nname = "a"\n[[job]]\ntask = "t"\nname = "a"\n')
    assert client.writes == [] and client.jobs == {}


def test_an_idempotency_key_held_by_another_job_is_an_error_not_a_create() -> None:
    client = fake()
    other = view_of({"task": "t", "name": "old", "idempotency_key": "k"}, JobStatus.DONE, "J9")
    client.fail[("POST", "/api/v1/jobs")] = (200, orjson.dumps(other))
    code, lines, err = apply(client, b'[[job]]\ntask = "t"\nname = "a"\nidempotency_key = "k"\n')
    assert code == 1 and err == "schedctl: 1 failed\n"
    assert lines == [
        'error a: idempotency_key "k" already belongs to job J9 (done, name "old"), so nothing '
        "was submitted; give the item a new idempotency_key"
    ]
