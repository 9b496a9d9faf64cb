"""The dashboard in a real headless Chromium against a real node and worker: log in, what a
role may do, jobs appearing by themselves, times in the job's zone and the viewer's, a run's
attempts, the dead-letter queue, the workers, the cluster bar."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.browser.conftest import Daemon, horizontal_overflow, login, screenshot
from tests.cluster.harness import BIN

pytestmark = pytest.mark.browser

TOKEN_KEY = "schedd.token"  # where the dashboard keeps its token (settings.js)


def reads(instant: str, zone: str) -> str:
    """``instant`` as the dashboard writes it in ``zone``: "2026-07-01 03:30:00 GMT+2"."""
    local = datetime.fromisoformat(instant.replace("Z", "+00:00")).astimezone(ZoneInfo(zone))
    offset = local.utcoffset()
    assert offset is not None
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    gmt = "GMT" if minutes == 0 else f"GMT{sign}{hours}" + (f":{rest:02d}" if rest else "")
    return f"{local:%Y-%m-%d %H:%M:%S} {gmt}"


def submit(daemon: Daemon, **job: Any) -> dict[str, Any]:
    result: dict[str, Any] = daemon.api("POST", "/jobs", job)
    return result


def test_times_read_in_two_zones_with_offsets_and_cron_in_words(page: Any, daemon: Daemon) -> None:
    page.goto(daemon.url + "/ui/")
    out = page.evaluate(
        """async () => {
        const f = await import("/ui/static/fmt.js");
        const t = "2026-07-01T01:30:00Z";
        return [
          f.formatIn(t, "Europe/Berlin"), f.formatIn(t, "America/New_York"),
          // the fall-back hour of New York, twice, with its two offsets
          f.formatIn("2026-11-01T05:30:00Z", "America/New_York"),
          f.formatIn("2026-11-01T06:30:00Z", "America/New_York"),
          f.formatIn("2026-07-01T01:30:15.042Z", "UTC", { ms: true }),
          f.formatIn(t, "UTC", { seconds: false }),
          f.relative(Date.now() + 5 * 60e3), f.relative(Date.now() - 3 * 3600e3),
          f.describeCron("0 2 * * *"), f.describeCron("*/15 * * * *"),
          f.describeCron("30 2 * * 1-5"), f.describeCron("0 0 * * 0#2"),
          f.describeCron("0 9 1 * MON"), f.describeCron("@hourly"), f.describeCron("0 0 L * *"),
        ];
      }"""
    )
    assert out == [
        "2026-07-01 03:30:00 GMT+2",
        "2026-06-30 21:30:00 GMT-4",
        "2026-11-01 01:30:00 GMT-4",
        "2026-11-01 01:30:00 GMT-5",
        "2026-07-01 01:30:15.042 GMT",  # the run timeline's precision
        "2026-07-01 01:30 GMT",
        "in 5 m",
        "3 h ago",
        "at 02:00 every day",
        "every 15 minutes",
        "at 02:30 on Monday to Friday",
        "at 00:00 on the second Sunday of the month",
        "at 09:00 on day 1 of the month or on Monday",
        "at minute 0 of every hour",
        "at 00:00 on the last day of the month",
    ]


def test_a_bad_token_is_refused_and_nothing_is_shown(page: Any, daemon: Daemon) -> None:
    page.goto(daemon.url + "/")  # redirects to /ui/
    assert page.url.endswith("/ui/")
    page.fill("#token", "not-a-token-of-this-cluster")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login .error")
    assert "401" in page.inner_text("#login .error")
    assert page.evaluate("sessionStorage.length") == 0
    assert page.evaluate("document.cookie") == ""


def test_a_read_token_sees_jobs_but_no_action(page: Any, daemon: Daemon) -> None:
    job = submit(
        daemon, task="ui.ok", name="read-only-view", namespace="tread", schedule={"every": "1h"}
    )
    login(page, daemon, "read", "/ui/jobs?namespace=tread")
    row = page.wait_for_selector(f"tr[data-job='{job['id']}']")
    assert "read-only-view" in row.inner_text()
    assert page.query_selector_all("button[data-action]") == []
    page.click(f"tr[data-job='{job['id']}'] td.job a")
    page.wait_for_selector("#spec")
    assert page.query_selector_all(".screen-head button") == []
    # the same job with a submit token: the actions are there
    page.click("#logout")
    login(page, daemon, "submit", "/ui/jobs?namespace=tread")
    page.wait_for_selector(f"tr[data-job='{job['id']}'] button[data-action='trigger']")
    actions = page.eval_on_selector_all(
        f"tr[data-job='{job['id']}'] button[data-action]", "bs => bs.map(b => b.dataset.action)"
    )
    assert actions == ["trigger", "pause", "cancel"]


def test_a_submitted_job_appears_and_row_actions_work(page: Any, daemon: Daemon) -> None:
    login(page, daemon, "admin", "/ui/jobs?namespace=tlive")
    page.wait_for_selector("text=No job matches.")
    assert "namespace=tlive" in page.url
    # with the node's event stream the page is told at once; without, it polls every 4 s
    live = "/api/v1/events" in daemon.api("GET", "/openapi.json")["paths"]
    page.wait_for_selector(f"body[data-live='{'live' if live else 'polling'}']")
    job = submit(
        daemon, task="ui.ok", name="appears-by-itself", namespace="tlive", schedule={"every": "1h"}
    )
    started = time.monotonic()
    page.wait_for_selector(f"tr[data-job='{job['id']}']", timeout=15_000)  # no reload
    assert time.monotonic() - started < (3 if live else 6)
    page.click(f"tr[data-job='{job['id']}'] button[data-action='pause']")
    page.wait_for_selector(f"tr[data-job='{job['id']}'] .badge:text-is('paused')")
    assert daemon.api("GET", f"/jobs/{job['id']}")["status"] == "paused"
    page.click(f"tr[data-job='{job['id']}'] button[data-action='resume']")
    page.wait_for_selector(f"tr[data-job='{job['id']}'] .badge:text-is('active')")
    page.click(f"tr[data-job='{job['id']}'] button[data-action='trigger']")
    daemon.wait(lambda: len(daemon.api("GET", f"/jobs/{job['id']}/runs")["runs"]) >= 2)
    page.click(f"tr[data-job='{job['id']}'] button[data-action='cancel']")  # asks first
    assert daemon.api("GET", f"/jobs/{job['id']}")["status"] == "active"
    page.click(f"tr[data-job='{job['id']}'] button[data-action='cancel']")
    page.wait_for_selector(f"tr[data-job='{job['id']}'] .badge:text-is('cancelled')")


def test_filters_and_pages_are_the_apis_and_live_in_the_address(page: Any, daemon: Daemon) -> None:
    daemon.api(
        "POST",
        "/jobs/batch",
        {
            "jobs": [
                {
                    "task": "ui.ok",
                    "name": f"paged-{i}",
                    "namespace": "tpage",
                    "schedule": {"every": "1h"},
                }
                for i in range(5)
            ]
        },
    )
    login(page, daemon, "read", "/ui/jobs?namespace=tpage&limit=2")
    page.wait_for_selector("#jobs-table")
    seen = page.eval_on_selector_all("#jobs-table tbody tr", "rs => rs.length")
    assert seen == 2
    names = []
    for _ in range(3):
        names += page.eval_on_selector_all(
            "#jobs-table td.job b", "bs => bs.map(b => b.textContent)"
        )
        if page.query_selector(".page-next") is None:
            break
        before = page.url
        page.click(".page-next")
        page.wait_for_function(f"() => location.href !== {before!r}")
        assert "cursor=" in page.url
        page.wait_for_selector("#jobs-table")
    assert names == [f"paged-{i}" for i in range(4, -1, -1)]  # newest first
    page.go_back()
    page.wait_for_function("() => new URLSearchParams(location.search).get('cursor') !== null")
    # a filter of the form goes into the address and back to the first page
    page.fill("#f-name", "paged-3")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => location.search.includes('name=paged-3')")
    assert "cursor" not in page.url
    page.wait_for_function("() => document.querySelectorAll('#jobs-table tbody tr').length === 1")


def test_jobs_sort_newest_first_or_by_a_columns_head_and_back(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    delays = {"s-a": "3h", "s-b": "1h", "s-c": "5h", "s-d": "2h"}
    for name, delay in delays.items():
        submit(daemon, task="ui.ok", name=name, namespace="tsort", schedule={"in": delay})
    login(page, daemon, "read", "/ui/jobs?namespace=tsort")
    names = "#jobs-table td.job b"

    def shown(expected: list[str]) -> None:
        page.wait_for_function(
            "([sel, want]) => [...document.querySelectorAll(sel)].map(b => b.textContent)"
            ".join() === want.join()",
            arg=[names, expected],
        )

    shown(["s-d", "s-c", "s-b", "s-a"])  # newest first
    head = "#jobs-table th[aria-sort='descending'] a.sort"
    assert page.wait_for_selector(head).get_attribute("data-sort") == "created"
    page.click("#jobs-table a.sort[data-sort='next_fire']")
    page.wait_for_function("() => location.search.includes('sort=next_fire')")
    shown(["s-b", "s-d", "s-a", "s-c"])  # soonest first
    assert "▲" in page.inner_text("#jobs-table th[aria-sort='ascending']")
    screenshot(page, "jobs-sorted", tmp_path)
    page.click("#jobs-table a.sort[data-sort='next_fire']")  # again: the other way round
    page.wait_for_function("() => location.search.includes('order=desc')")
    shown(["s-c", "s-a", "s-d", "s-b"])
    # the form's own sort, kept with a filter; a page of it is the API's
    page.select_option("#f-sort", "latest_run")
    page.select_option("#f-order", "asc")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => location.search.includes('sort=latest_run&order=asc')")
    shown(["s-b", "s-d", "s-a", "s-c"])  # each one's only run, the earliest first
    assert "namespace=tsort" in page.url


def test_a_berlin_cron_reads_in_berlin_and_in_the_viewers_zone(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    job = submit(
        daemon,
        task="ui.ok",
        name="berlin-report",
        namespace="ttz",
        schedule={"cron": "30 3 * * *", "timezone": "Europe/Berlin"},
    )
    login(page, daemon, "read", "/ui/jobs?namespace=ttz")
    row = f"tr[data-job='{job['id']}']"
    page.wait_for_selector(row)
    assert page.inner_text(f"{row} .schedule .words") == "at 03:30 every day (Europe/Berlin)"
    nxt = job["next_run_at"]
    assert page.inner_text(f"{row} .next .tz-job") == reads(nxt, "Europe/Berlin")
    assert page.inner_text(f"{row} .next .tz-viewer") == reads(nxt, "America/New_York")
    assert reads(nxt, "Europe/Berlin")[11:16] == "03:30"
    assert page.get_attribute(f"{row} .next .when", "title") == f"{nxt} (UTC)"
    assert re.fullmatch(r"in \d+ [smhd]", page.inner_text(f"{row} .next .age"))
    # the job's page: the API's next fires (never computed in the page), in both zones
    page.click(f"{row} td.job a")
    page.wait_for_selector("#explain .fires")
    fires = daemon.api("GET", f"/jobs/{job['id']}/explain")["fires"]
    got_job = page.eval_on_selector_all("#explain .fire-job", "ts => ts.map(t => t.textContent)")
    got_viewer = page.eval_on_selector_all(
        "#explain .fire-viewer", "ts => ts.map(t => t.textContent)"
    )
    assert got_job == [reads(f["scheduled_at"], "Europe/Berlin") for f in fires]
    assert got_viewer == [reads(f["scheduled_at"], "America/New_York") for f in fires]
    screenshot(page, "job", tmp_path)
    # another zone for the viewer: kept across a reload (localStorage)
    page.select_option("#viewer-zone", "Asia/Tokyo")
    tokyo = reads(fires[0]["scheduled_at"], "Asia/Tokyo")
    assert tokyo.endswith("GMT+9")
    page.wait_for_function(
        f"() => document.querySelector('#explain .fire-viewer')?.textContent === {tokyo!r}"
    )
    page.reload()
    page.wait_for_selector("#explain .fires")
    assert page.inner_text("#explain .fire-viewer >> nth=0") == tokyo


def test_a_jobs_history_and_upstream_links(page: Any, daemon: Daemon) -> None:
    up = submit(daemon, task="ui.ok", name="upstream-one", namespace="thist")
    down = submit(daemon, task="ui.ok", name="downstream", namespace="thist", depends_on=[up["id"]])
    daemon.wait(
        lambda: daemon.api("GET", f"/jobs/{down['id']}")["latest_run"]["state"] == "succeeded"
    )
    daemon.api("POST", f"/jobs/{up['id']}/trigger", {})
    login(page, daemon, "read", f"/ui/jobs/{down['id']}")
    page.wait_for_selector("#spec a.dep")
    page.wait_for_function(
        "() => document.querySelector('#spec a.dep').textContent.startsWith('upstream-one')"
    )
    page.wait_for_selector("#runs .runs-table")
    assert page.inner_text("#runs .runs-table tbody tr >> nth=0").count("succeeded") == 1
    page.click("#spec a.dep")
    page.wait_for_function(f"() => location.pathname === '/ui/jobs/{up['id']}'")
    daemon.wait(lambda: len(daemon.api("GET", f"/jobs/{up['id']}/runs")["runs"]) == 2)
    page.wait_for_function(
        "() => document.querySelectorAll('#runs .runs-table tbody tr').length === 2"
    )
    scheduled = page.eval_on_selector_all("#runs .runs-table .when", "ws => ws.map(w => w.title)")
    assert scheduled == sorted(scheduled, reverse=True)  # newest first


def test_a_run_shows_each_attempt_with_its_error_and_traceback(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    job = submit(
        daemon,
        task="ui.parse",
        namespace="trun",
        payload={"record": 7},
        retry={"max_attempts": 2, "initial": 0.1},
    )
    daemon.wait(
        lambda: (
            (daemon.api("GET", f"/jobs/{job['id']}")["latest_run"] or {}).get("state") == "failed"
        )
    )
    run = daemon.api("GET", f"/jobs/{job['id']}")["latest_run"]
    login(page, daemon, "read", f"/ui/runs/{run['id']}")
    page.wait_for_selector("#attempts")
    rows = page.query_selector_all("#attempts tbody tr")
    assert len(rows) == 2
    text = page.inner_text("#attempts")
    assert "ValueError: cannot parse record 7" in text
    assert "w1" in text
    facts = page.inner_text("#run-facts")  # the payload and the task, with the run
    assert '"record": 7' in facts and "ui.parse" in facts
    assert page.query_selector_all("#attempts details summary")  # the tracebacks
    page.click("#attempts details summary >> nth=0")
    assert "raise ValueError" in page.inner_text("#attempts pre.traceback >> nth=0")
    page.click("#attempts details summary >> nth=0")  # folded again for the picture
    assert len(page.query_selector_all("svg.timeline rect.bar")) == 2
    fences = [a["fence"] for a in run["attempts"]]
    assert (
        page.eval_on_selector_all("#attempts td.mono", "ts => ts.map(t => +t.textContent)")
        == fences
    )
    screenshot(page, "run", tmp_path)
    ok = submit(daemon, task="ui.ok", namespace="trun")
    daemon.wait(
        lambda: (
            (daemon.api("GET", f"/jobs/{ok['id']}")["latest_run"] or {}).get("state") == "succeeded"
        )
    )
    latest = daemon.api("GET", f"/jobs/{ok['id']}")["latest_run"]
    page.goto(daemon.url + f"/ui/runs/{latest['id']}")
    page.wait_for_selector("#attempts progress")
    assert "3 / 4" in page.inner_text("#attempts")
    # the reported progress is marked on the attempt's lane too
    title = page.text_content("svg.timeline circle.progress title") or ""
    assert title.startswith('progress {"done":3,"of":4} reported at')


def _dead(daemon: Daemon, ns: str, n: int) -> list[dict[str, Any]]:
    def runs() -> list[dict[str, Any]] | None:
        got: list[dict[str, Any]] = daemon.api("GET", f"/dlq?namespace={ns}")["runs"]
        return got if len(got) >= n else None

    result: list[dict[str, Any]] = daemon.wait(runs)
    return result


def test_dead_letters_filter_group_and_drop(page: Any, daemon: Daemon, tmp_path: Path) -> None:
    once = {"max_attempts": 1}
    jobs = [{"task": "ui.disk", "namespace": "tdlq", "retry": once} for _ in range(3)]
    jobs += [
        {"task": "ui.parse", "namespace": "tdlq", "retry": once, "payload": {"record": i}}
        for i in (4, 5)
    ]
    daemon.api("POST", "/jobs/batch", {"jobs": jobs})
    _dead(daemon, "tdlq", 5)
    login(page, daemon, "submit", "/ui/dlq?namespace=tdlq")
    page.wait_for_selector("#dlq-table")
    groups = page.eval_on_selector_all(
        "#dlq-table .error-group", "gs => gs.map(g => g.textContent)"
    )
    assert groups[0] == "OSError: disk full on /data — 3 runs"
    assert sorted(groups[1:]) == [
        "ValueError: cannot parse record 4 — 1 run",
        "ValueError: cannot parse record 5 — 1 run",
    ]
    screenshot(page, "dlq", tmp_path)
    page.fill("#f-task", "ui.parse")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => location.search.includes('task=ui.parse')")
    page.wait_for_function(
        "() => document.querySelectorAll('#dlq-table tr[data-run]').length === 2"
    )
    page.fill("#f-error", "record 4")
    page.click("#filters button[type=submit]")
    page.wait_for_function(
        "() => document.querySelectorAll('#dlq-table tr[data-run]').length === 1"
    )
    page.check("#dlq-table tr.group-head input")
    page.click("#selection button:text('Drop 1')")
    page.click("#selection button:text('Drop 1 for good?')")
    page.wait_for_selector("text=No dead-lettered run matches.")
    left = daemon.api("GET", "/dlq?namespace=tdlq")["runs"]
    assert len(left) == 4
    assert not any("record 4" in r["error"] for r in left)


def test_a_dead_letter_reads_in_its_jobs_zone_and_names_its_task(page: Any, daemon: Daemon) -> None:
    berlin = {"cron": "0 3 1 1 *", "timezone": "Europe/Berlin"}
    job = submit(
        daemon, task="ui.disk", namespace="tdlqz", retry={"max_attempts": 1}, schedule=berlin
    )
    daemon.api("POST", f"/jobs/{job['id']}/trigger", {})
    [run] = _dead(daemon, "tdlqz", 1)
    login(page, daemon, "read", "/ui/dlq?namespace=tdlqz")
    row = page.wait_for_selector(f"#dlq-table tr[data-run='{run['id']}']")
    assert "ui.disk" in row.inner_text()
    assert row.query_selector(".tz-job").inner_text() == reads(run["updated_at"], "Europe/Berlin")
    viewer = row.query_selector(".tz-viewer").inner_text()
    assert viewer == reads(run["updated_at"], "America/New_York")


def test_workers_show_capacity_and_leases(page: Any, daemon: Daemon, tmp_path: Path) -> None:
    login(page, daemon, "read", "/ui/workers")
    page.wait_for_selector("#workers-table tr[data-worker='w1']")
    text = page.inner_text("#workers-table tr[data-worker='w1']")
    assert "ui.disk, ui.ok, ui.parse" in text or "ui.ok" in text
    assert re.search(r"\b\d+ / 16\b", text)
    assert "serving" in text
    # where it connects from and to, and how long since it was heard from (its heartbeats)
    assert "127.0.0.1" in text and "to n1" in text
    heard = page.inner_text("#workers-table tr[data-worker='w1'] td.heard")
    assert re.fullmatch(r"now|\d+ [smh] ago", heard), heard
    screenshot(page, "workers", tmp_path)


def test_the_cluster_bar_says_who_leads_and_serves(page: Any, daemon: Daemon) -> None:
    login(page, daemon, "read", "/ui/jobs")
    bar = page.inner_text("#cluster")
    assert "served by n1 (leader)" in bar
    assert "leader n1" in bar
    assert "quorum ✓" in bar
    view = daemon.api("GET", "/cluster")
    assert re.search(rf"term {view['term']}\b", bar)
    assert page.is_hidden("#banner")
    me = view["nodes"][0]
    chip = page.inner_text("#cluster .node.self")
    if me.get("version"):  # the node's version and lag, where /cluster gives them
        assert f"v{me['version']}" in chip
    if me.get("lag") is not None:
        assert "lag 0" in chip
    if "/api/v1/scheduling-lag" in daemon.api("GET", "/openapi.json")["paths"]:
        lag = page.wait_for_selector("#scheduling-lag")
        assert re.fullmatch(
            r"fire p99 \S+( \S+)? · start p99 \S+( \S+)? · \d+ due, not started", lag.inner_text()
        )
        assert "as the leader n1 saw it" in (lag.get_attribute("title") or "")


def test_no_leader_is_a_red_banner_and_a_new_leader_a_notice(page: Any, daemon: Daemon) -> None:
    """What the bar does when the cluster changes, with this node's answers replaced."""
    state = {"leader": "n1", "term": 7, "has_quorum": True}

    def cluster(route: Any) -> None:
        view = daemon.api("GET", "/cluster")
        view.update(state)
        route.fulfill(json=view)

    page.route("**/api/v1/cluster", cluster)
    login(page, daemon, "read", "/ui/jobs")
    page.wait_for_selector("#cluster .fact:has-text('term 7')")
    state.update(leader=None, has_quorum=False)
    page.wait_for_selector("#banner:visible", timeout=10_000)
    assert "No leader" in page.inner_text("#banner")
    assert re.search(r"Retrying in [1-3] s", page.inner_text("#banner"))
    state.update(leader="n3", term=8, has_quorum=True)
    page.wait_for_selector(".notice:has-text('leader n1 → n3 at term 8')", timeout=10_000)
    page.wait_for_selector("#banner", state="hidden")


def test_screens_as_an_operator_sees_them(page: Any, daemon: Daemon, tmp_path: Path) -> None:
    """The login and the jobs screen with every job the tests above made (the screenshots of
    docs/dashboard.md: SCHEDD_UPDATE_SCREENSHOTS=1 writes them to docs/img/)."""
    page.goto(daemon.url + "/ui/")
    page.wait_for_selector("#login")
    screenshot(page, "login", tmp_path)
    login(page, daemon, "admin", "/ui/jobs?limit=25")
    page.wait_for_selector("#jobs-table")
    page.wait_for_function("() => document.querySelectorAll('#jobs-table .cells a').length > 5")
    screenshot(page, "jobs", tmp_path)


def test_a_hidden_page_asks_nothing_and_catches_up_when_shown(page: Any, daemon: Daemon) -> None:
    login(page, daemon, "read", "/ui/jobs?namespace=thidden")
    page.wait_for_selector("text=No job matches.")
    mode = page.get_attribute("body", "data-live")
    assert mode in ("live", "polling")
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/v1/" in r.url else None)
    page.evaluate(
        """() => {
        Object.defineProperty(document, "hidden", { value: true, configurable: true });
        document.dispatchEvent(new Event("visibilitychange"));
      }"""
    )
    page.wait_for_selector("body[data-live='paused']")
    asked.clear()
    job = submit(daemon, task="ui.ok", name="made-while-hidden", namespace="thidden")
    page.wait_for_timeout(5_000)  # longer than the poll interval
    assert asked == []
    show = """() => {
        delete document.hidden;
        document.dispatchEvent(new Event("visibilitychange"));
      }"""
    if mode == "live":  # the stream resumes where it was: Last-Event-ID
        with page.expect_request(lambda r: "/api/v1/events" in r.url) as resumed:
            page.evaluate(show)
        assert resumed.value.headers.get("last-event-id", "").isdigit()
    else:
        page.evaluate(show)
    page.wait_for_selector(f"body[data-live='{mode}']")
    page.wait_for_selector(f"tr[data-job='{job['id']}']", timeout=5_000)


def test_dead_letters_dry_run_then_one_bulk_call(page: Any, daemon: Daemon) -> None:
    doc = daemon.api("GET", "/openapi.json")
    if "/api/v1/dlq/replay" not in doc["paths"]:
        pytest.skip("the node has no bulk dead-letter endpoint")
    once = {"max_attempts": 1}
    jobs = [{"task": "ui.disk", "namespace": "tbulk", "retry": once} for _ in range(3)]
    jobs.append({"task": "ui.parse", "namespace": "tbulk", "retry": once})
    daemon.api("POST", "/jobs/batch", {"jobs": jobs})
    dead = _dead(daemon, "tbulk", 4)
    login(page, daemon, "submit", "/ui/dlq?namespace=tbulk&error=DISK")
    page.wait_for_function(
        "() => document.querySelectorAll('#dlq-table tr[data-run]').length === 3"
    )
    page.click("#bulk-dry-run")
    page.wait_for_selector("#bulk-preview:has-text('3 dead-lettered runs match the filter')")
    assert "ui.disk 3" in page.inner_text("#bulk-preview")
    assert len(daemon.api("GET", "/dlq?namespace=tbulk")["runs"]) == 4  # a dry run did nothing
    page.click("#bulk-replay")
    page.wait_for_selector(".notice:has-text('3 done')")
    disk = [r["id"] for r in dead if r["error"].startswith("OSError")]

    def replayed() -> bool:  # each failed once more and is back in the queue
        runs = [daemon.api("GET", f"/runs/{r}") for r in disk]
        back = {r["id"] for r in daemon.api("GET", "/dlq?namespace=tbulk")["runs"]}
        return all(len(r["attempts"]) == 2 and r["id"] in back for r in runs)

    daemon.wait(replayed)
    page.click("#bulk-dry-run")
    page.wait_for_selector("#bulk-preview:has-text('3 dead-lettered runs')")
    page.click("#bulk-drop")
    page.click("#bulk-drop")  # the second click confirms
    page.wait_for_selector(".notice:has-text('dropped 3 runs')")
    left = daemon.api("GET", "/dlq?namespace=tbulk")["runs"]
    assert [r["error"] for r in left] == ["ValueError: cannot parse record 0"]
    # selected runs go in one call too
    page.goto(daemon.url + "/ui/dlq?namespace=tbulk")
    page.check("#dlq-table tr.group-head input")
    page.click("#selection button:text('Drop 1')")
    page.click("#selection button:text('Drop 1 for good?')")
    page.wait_for_selector("text=No dead-lettered run matches.")
    assert daemon.api("GET", "/dlq?namespace=tbulk")["runs"] == []


def test_an_admin_drains_a_worker(page: Any, daemon: Daemon) -> None:
    if "/api/v1/workers/{worker_id}/drain" not in daemon.api("GET", "/openapi.json")["paths"]:
        pytest.skip("the node has no drain endpoint")
    daemon.cluster.start_worker("--import", "tests.browser.tasks", name="w2")
    daemon.wait(
        lambda: any(w["worker_id"] == "w2" for w in daemon.api("GET", "/workers")["workers"])
    )
    login(page, daemon, "submit", "/ui/workers")
    page.wait_for_selector("#workers-table tr[data-worker='w2']")
    assert page.query_selector("#workers-table button") is None  # admin only
    page.click("#logout")
    login(page, daemon, "admin", "/ui/workers")
    row = "#workers-table tr[data-worker='w2']"
    page.click(f"{row} button:text('Drain')")
    page.click(f"{row} button:text('Drain this worker?')")
    page.wait_for_selector(".notice:has-text('Drain w2: done')")

    def drained() -> bool:
        workers = {w["worker_id"]: w for w in daemon.api("GET", "/workers")["workers"]}
        return "w2" not in workers or workers["w2"]["draining"]

    daemon.wait(drained)
    page.wait_for_function(
        f"""() => {{
        const row = document.querySelector("{row}");
        return row === null || row.textContent.includes("draining");
      }}"""
    )


def test_events_about_other_jobs_do_not_refresh_the_screen(page: Any, daemon: Daemon) -> None:
    if "/api/v1/events" not in daemon.api("GET", "/openapi.json")["paths"]:
        pytest.skip("the node has no event stream")
    mine = submit(daemon, task="ui.ok", name="mine", namespace="tquiet", schedule={"every": "1h"})
    login(page, daemon, "read", "/ui/jobs?namespace=tquiet")
    page.wait_for_selector(f"tr[data-job='{mine['id']}']")
    page.wait_for_selector("body[data-live='live']")
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/v1/jobs" in r.url else None)
    submit(daemon, task="ui.ok", namespace="tother")  # runs at once: job and run events
    page.wait_for_timeout(2_500)
    assert asked == []
    with page.expect_request(lambda r: "namespace=tquiet" in r.url, timeout=5_000):
        daemon.api("POST", f"/jobs/{mine['id']}/trigger", {})  # one of the page's: refreshed


def test_the_fall_back_hour_reads_twice_with_its_two_offsets(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    """A Berlin cron at 02:30 that runs both times the clocks show it: the job's fires after a
    day before the change, as the API explains them, each with its own offset."""
    schedule = {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "dst": {"repeat": "both"}}
    job = submit(daemon, task="ui.ok", name="berlin-dst", namespace="tdst", schedule=schedule)
    login(page, daemon, "read", f"/ui/jobs/{job['id']}")
    page.wait_for_selector("#explain .fires")
    page.fill("#fires-from", "2026-10-24")
    page.click("#fires-form button[type=submit]")
    page.wait_for_function("() => location.search.includes('fires_from=2026-10-24')")
    page.wait_for_function(
        "() => document.querySelector('#explain .fire-job')?.textContent.startsWith('2026-10-24')"
    )
    fires = daemon.api("GET", f"/jobs/{job['id']}/explain?from=2026-10-24T00:00:00Z")["fires"]
    got = page.eval_on_selector_all("#explain .fire-job", "ts => ts.map(t => t.textContent)")
    assert got == [reads(f["scheduled_at"], "Europe/Berlin") for f in fires]
    assert got[1:3] == ["2026-10-25 02:30:00 GMT+2", "2026-10-25 02:30:00 GMT+1"]
    viewer = page.eval_on_selector_all("#explain .fire-viewer", "ts => ts.map(t => t.textContent)")
    assert viewer[1:3] == ["2026-10-24 20:30:00 GMT-4", "2026-10-24 21:30:00 GMT-4"]
    notes = page.eval_on_selector_all("#explain td.note", "ts => ts.map(t => t.textContent)")
    assert notes[1:3] == [f["note"] for f in fires[1:3]] and notes[2]
    screenshot(page, "dst", tmp_path)


async def _stale_result(daemon: Daemon, job_id: str) -> tuple[int, int]:
    """A worker leases the job's run and goes silent until its lease is lost; another worker
    runs it again; then the first one's late result comes and is refused for its fence.
    The two fences."""
    import aiohttp

    from schedd.protocol import messages

    headers = {"Authorization": f"Bearer {daemon.admin}"}
    url = daemon.url + "/api/v1/workers/connect"
    async with aiohttp.ClientSession() as http:

        async def connect(worker_id: str) -> Any:
            ws = await http.ws_connect(url, headers=headers)
            hello = messages.Hello(
                worker_id=worker_id, queues=("default",), capacity=1, tasks=("ui.stale",)
            )
            await ws.send_str(messages.encode(hello))
            return ws

        async def expect(ws: Any, kind: type[Any]) -> Any:
            while True:
                msg = messages.decode((await ws.receive(timeout=20)).data)
                if isinstance(msg, kind):
                    return msg

        stale = await connect("w-silent")
        old = await expect(stale, messages.Lease)
        await stale.send_str(messages.encode(messages.Drain()))  # no heartbeat, nothing new
        fresh = await connect("w-fresh")
        new = await expect(fresh, messages.Lease)  # once the silent worker's lease was lost
        if new.not_before is not None:  # leased ahead of the end of its backoff: start then
            start = datetime.fromisoformat(new.not_before.replace("Z", "+00:00")).timestamp()
            await asyncio.sleep(max(0.0, start - time.time()))
        await fresh.send_str(messages.encode(messages.Complete(run_id=new.run_id, fence=new.fence)))
        assert (await expect(fresh, messages.Ack)).accepted
        late = messages.Complete(run_id=old.run_id, fence=old.fence, result="late")
        await stale.send_str(messages.encode(late))
        assert not (await expect(stale, messages.Ack)).accepted
        for ws in (stale, fresh):
            await ws.close()
        return old.fence, new.fence


def test_a_runs_timeline_marks_its_backoff_and_a_refused_late_result(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    job = submit(
        daemon,
        task="ui.stale",
        namespace="tstale",
        heartbeat_timeout="1s",
        retry={"max_attempts": 3, "initial": "1s", "jitter": False},
    )
    # in a thread of its own: Playwright's synchronous API keeps an event loop in this one
    with ThreadPoolExecutor(1) as pool:
        old, new = pool.submit(asyncio.run, _stale_result(daemon, job["id"])).result(60)
    run_id = daemon.wait(
        lambda: (
            (r := daemon.api("GET", f"/jobs/{job['id']}")["latest_run"] or {}).get("refused")
            and r["id"]
        )
    )
    login(page, daemon, "read", f"/ui/runs/{run_id}")
    page.wait_for_selector("svg.timeline text.refused")
    # one lane per attempt, each naming its worker and fence; the backoff between them
    lanes = page.eval_on_selector_all("svg.timeline text.lane", "ts => ts.map(t => t.textContent)")
    assert lanes == [f"w-silent · fence {old}", f"w-fresh · fence {new}"]
    assert len(page.query_selector_all("svg.timeline line.backoff")) == 1
    # the late result: a cross on the first lane, and a row saying why
    assert page.get_attribute("svg.timeline text.refused", "data-fence") == str(old)
    row = page.inner_text(f"#refused tr[data-fence='{old}']")
    assert "w-silent" in row and "succeeded" in row and f"fence {old} is not the current" in row
    screenshot(page, "run-refused", tmp_path)


def schedctl_ui(daemon: Daemon, role: str, *args: str) -> str:
    """``schedctl ui --no-open`` as a user runs it: the address it prints."""
    proc = subprocess.run(
        [
            str(BIN / "schedctl"),
            "--server",
            daemon.url,
            "--token",
            daemon.token(role),
            "ui",
            "--no-open",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    url = proc.stdout.strip()
    assert url.startswith(f"{daemon.url}/ui/#code="), url
    return url


def test_schedctl_ui_opens_a_session_once_and_the_code_leaves_the_address(
    page: Any, daemon: Daemon
) -> None:
    url = schedctl_ui(daemon, "submit")
    page.goto(url)
    page.wait_for_selector("#role:text-is('submit')")  # logged in, no token pasted
    assert "#" not in page.url and "code" not in page.url  # nor kept in the history
    # the session token, and (not a secret) the highest Raft index the tab has seen
    stored = page.evaluate("Object.keys(sessionStorage)")
    assert set(stored) <= {TOKEN_KEY, "schedd.index"} and TOKEN_KEY in stored
    session = page.evaluate(f"sessionStorage.getItem('{TOKEN_KEY}')")
    assert session.startswith("ui1.") and daemon.token("submit") not in session
    page.wait_for_selector(".cluster .facts")  # and it reads the API with it
    # the same link again is refused: the code was good once
    second = page.context.new_page()
    try:
        second.goto(url)
        second.wait_for_selector("#login .error")
        assert "unknown, used or expired" in second.inner_text("#login .error")
        assert second.evaluate("sessionStorage.length") == 0
    finally:
        second.close()
    # a read-only link from an admin token: the actions are hidden
    page.evaluate("sessionStorage.clear()")
    page.goto(schedctl_ui(daemon, "admin", "--read-only"))
    page.wait_for_selector("#role:text-is('read')")


def test_reads_after_a_write_ask_for_the_writes_index(page: Any, daemon: Daemon) -> None:
    """The dashboard passes the highest X-Schedd-Index it was given as X-Schedd-Min-Index on
    every read, so whichever node answers shows what it wrote."""
    job = submit(daemon, task="ui.ok", name="ryw", namespace="tryw", schedule={"every": "1h"})
    written: list[int] = []
    asked: list[int] = []

    def answered(response: Any) -> None:
        index = response.headers.get("x-schedd-index")
        if response.request.method != "GET" and index is not None:
            written.append(int(index))

    def sent(request: Any) -> None:
        if request.method == "GET" and "/api/v1/" in request.url and "/events" not in request.url:
            asked.append(int(request.headers.get("x-schedd-min-index", "0")))

    login(page, daemon, "admin", "/ui/jobs?namespace=tryw")
    page.on("response", answered)
    page.on("request", sent)
    page.wait_for_selector(f"tr[data-job='{job['id']}']")
    page.click(f"tr[data-job='{job['id']}'] button[data-action='pause']")
    page.wait_for_selector(f"tr[data-job='{job['id']}'] .badge:text-is('paused')")
    assert written, "the pause's answer carries X-Schedd-Index"
    count = len(asked)
    page.reload()
    page.wait_for_selector(f"tr[data-job='{job['id']}'] .badge:text-is('paused')")
    later = asked[count:]
    assert later and min(later) >= max(written), (later, written)


def test_a_job_whose_run_failed_for_good_reads_failed_in_red(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    failed = submit(daemon, task="ui.disk", namespace="tfail", retry={"max_attempts": 1})
    fine = submit(daemon, task="ui.ok", namespace="tfail")
    for job, state in ((failed, "failed"), (fine, "succeeded")):
        daemon.wait(
            lambda j=job, s=state: daemon.api("GET", f"/jobs/{j['id']}")["latest_run"]["state"] == s
        )
    login(page, daemon, "read", "/ui/jobs?namespace=tfail")
    bad = page.wait_for_selector(f"tr[data-job='{failed['id']}'] .badge.st-failed")
    assert bad.inner_text() == "failed" and "done" in (bad.get_attribute("title") or "")
    good = page.wait_for_selector(f"tr[data-job='{fine['id']}'] .badge.st-done")
    assert good.inner_text() == "done"
    red = page.eval_on_selector(
        f"tr[data-job='{failed['id']}'] .badge", "e => getComputedStyle(e).backgroundColor"
    )
    assert red == "rgb(255, 235, 233)"  # the failed colour, not the done one
    screenshot(page, "jobs-failed", tmp_path)
    page.goto(daemon.url + f"/ui/jobs/{failed['id']}")
    assert page.wait_for_selector(".screen-head .badge.st-failed").inner_text() == "failed"


def test_an_every_10s_job_lists_fires_to_the_second_with_utc(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    job = submit(
        daemon, task="ui.ok", name="ten-seconds", namespace="tsec", schedule={"every": "10s"}
    )
    login(page, daemon, "read", f"/ui/jobs/{job['id']}")
    page.wait_for_selector("#explain .fire-job")
    fires = page.eval_on_selector_all("#explain .fire-job", "ts => ts.map(t => t.textContent)")
    assert len(fires) >= 6 and len(set(fires)) == len(fires), fires  # none alike
    assert all(re.search(r" \d\d:\d\d:\d\d GMT", f) for f in fires)
    utc = page.eval_on_selector_all("#explain .fire-utc", "ts => ts.map(t => t.textContent)")
    assert len(utc) == len(fires) and all(re.search(r" \d\d:\d\d:\d\d GMT$", u) for u in utc)
    title = page.get_attribute("#spec .when, .when", "title") or ""
    assert title.endswith("Z (UTC)")  # UTC on hover
    screenshot(page, "job-every-10s", tmp_path)


def test_on_a_phone_every_screen_fits_and_tables_become_cards(
    page: Any, daemon: Daemon, tmp_path: Path
) -> None:
    """At 390x844 nothing sticks out sideways on the jobs, job, run, dead-letter, workers and
    lag screens; the tables collapse into cards whose cells name their column."""
    ok = submit(daemon, task="ui.ok", name="phone-ok", namespace="tphone", schedule={"every": "1h"})
    dead = submit(daemon, task="ui.parse", namespace="tphone", retry={"max_attempts": 1})
    daemon.wait(lambda: daemon.api("GET", f"/jobs/{dead['id']}")["latest_run"]["state"] == "failed")
    run_id = daemon.api("GET", f"/jobs/{dead['id']}")["latest_run"]["id"]
    page.set_viewport_size({"width": 390, "height": 844})
    login(page, daemon, "admin", "/ui/jobs?namespace=tphone")
    row = page.wait_for_selector(f"tr[data-job='{ok['id']}']")
    assert horizontal_overflow(page) == []
    label = row.eval_on_selector("td.next", "td => getComputedStyle(td, '::before').content")
    assert "Next" in label  # the card's cell says what it is
    screenshot(page, "phone-jobs", tmp_path)
    for path, ready, name in (
        (f"/ui/jobs/{ok['id']}", "#explain .fire-job", "phone-job"),
        (f"/ui/runs/{run_id}", "svg.timeline", "phone-run"),
        ("/ui/dlq?namespace=tphone", "#dlq-table", "phone-dlq"),
        ("/ui/workers", "main h1", "phone-workers"),
    ):
        page.goto(daemon.url + path)
        page.wait_for_selector(ready)
        assert horizontal_overflow(page) == [], path
        screenshot(page, name, tmp_path)
        if name == "phone-run":  # drawn at the screen's width: its text keeps a readable size
            size = page.eval_on_selector(
                "svg.timeline text", "t => t.getBoundingClientRect().height"
            )
            assert size >= 9, size
