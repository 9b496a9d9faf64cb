"""The dashboard stays responsive at size: 10,000 jobs and 1,000 dead-lettered runs on one node.
Every screen reads one page of the API (server-side paging), so what the browser does does not
grow with the cluster; this measures how long the jobs screen takes to show its first page."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Daemon, chromium, login, start_daemon

pytestmark = pytest.mark.browser

JOBS = 10_000
DEAD = 1_000
#: the first page of jobs must show within this (it takes about 0.1-0.3 s here)
FIRST_PAGE_BUDGET_MS = 3_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    chromium()
    d = start_daemon(tmp_path_factory.mktemp("schedd-big"))
    try:
        far = {"at": "2199-01-01T00:00:00Z"}  # never fires while the test runs
        for start in range(0, JOBS, 1_000):
            d.api(
                "POST",
                "/jobs/batch",
                {
                    "jobs": [
                        {"task": "ui.ok", "name": f"job-{i:05d}", "schedule": far}
                        for i in range(start, start + 1_000)
                    ]
                },
            )
        d.api(
            "POST",
            "/jobs/batch",
            {
                "jobs": [
                    {"task": "ui.disk", "namespace": "dead", "retry": {"max_attempts": 1}}
                    for _ in range(DEAD)
                ]
            },
        )
        d.wait(lambda: len(d.api("GET", "/dlq?limit=1000")["runs"]) == DEAD, timeout=120)
        yield d
    finally:
        d.cluster.stop()


def first_page_ms(page: Any, url: str) -> tuple[float, float]:
    """Open ``url`` (a jobs screen) and wait for its first page: (ms since the navigation
    started, ms the screen took from its start)."""
    page.goto(url)
    page.wait_for_selector("main[data-first-page-ms]")
    since_navigation = page.evaluate("() => performance.now()")
    screen = float(page.get_attribute("main", "data-first-page-ms"))
    return since_navigation, screen


def test_the_jobs_screen_shows_its_first_page_fast_with_10000_jobs(
    page: Any, big: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    login(page, big, "read", "/ui/jobs?namespace=default")  # the named ones, not the dead
    page.wait_for_selector("#jobs-table")
    samples = [first_page_ms(page, big.url + "/ui/jobs?namespace=default") for _ in range(3)]
    navigation = sorted(s[0] for s in samples)[1]
    screen = sorted(s[1] for s in samples)[1]
    assert page.eval_on_selector_all("#jobs-table tbody tr", "rs => rs.length") == 100
    # deep in the list: a page far on costs the same (the cursor, not an offset)
    started = time.monotonic()
    for _ in range(5):
        before = page.url
        page.click(".page-next")
        page.wait_for_function(f"() => location.href !== {before!r}")
        page.wait_for_selector("#jobs-table")
    per_page = (time.monotonic() - started) / 5 * 1000
    names = page.eval_on_selector_all("#jobs-table td.job b", "bs => bs.map(b => b.textContent)")
    assert names[0] == f"job-{JOBS - 1 - 500:05d}"  # newest first, five pages of 100 on
    with capsys.disabled():
        print(
            f"\n  jobs screen with {JOBS:,} jobs: first page {navigation:.0f} ms after navigation "
            f"({screen:.0f} ms in the screen), next page {per_page:.0f} ms"
        )
    assert navigation < FIRST_PAGE_BUDGET_MS


def test_the_dead_letter_screen_groups_1000_runs(
    page: Any, big: Daemon, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    login(page, big, "submit", "/ui/dlq?limit=1000")
    page.wait_for_selector("#dlq-table")
    page.goto(big.url + "/ui/dlq?limit=1000")  # logged in: the page itself, measured
    page.wait_for_selector("#dlq-table")
    shown = page.evaluate("() => performance.now()")  # ms since the navigation started
    assert page.eval_on_selector_all("#dlq-table tr[data-run]", "rs => rs.length") == DEAD
    groups = page.eval_on_selector_all(
        "#dlq-table .error-group", "gs => gs.map(g => g.textContent)"
    )
    # one group per error, the largest first (an attempt that lost its lease under the load
    # of the suite fails with another error: its own group)
    counts = [int(re.search(r"— (\d+) runs?$", g).group(1)) for g in groups]  # type: ignore[union-attr]
    assert sum(counts) == DEAD
    assert counts == sorted(counts, reverse=True)
    assert groups[0].startswith("OSError: disk full on /data — ")
    started = time.monotonic()
    for box in page.query_selector_all("#dlq-table tr.group-head input"):
        box.check()
    page.wait_for_selector(f"#selection button:text('Replay {DEAD}')")
    select_all = (time.monotonic() - started) * 1000
    with capsys.disabled():
        print(
            f"\n  dead letters: {DEAD:,} runs shown {shown:.0f} ms after navigation, all selected in {select_all:.0f} ms"
        )
    assert select_all < 2_000
