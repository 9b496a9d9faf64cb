"""Browser tests of the dashboard: a real headless Chromium (Debian's ``chromium``, driven by
Playwright without its own browser download) against a real ``schedd`` daemon.

Skipped, saying why, where Chromium or Playwright is missing; under CI (``CI=true``) that is
a failure instead, so CI cannot pass without running them (``.ci/run`` installs both).
Screenshots of each screen go to a temporary folder, or to ``docs/img/`` with
``SCHEDD_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import REPO, Cluster

CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWER_ZONE = "America/New_York"
SECRETS = {
    "read": "read-secret-0123456789abcdef",
    "submit": "submit-secret-0123456789abcdef",
}


def _missing(what: str) -> None:
    message = f"browser tests need {what}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI installs it: .ci/run)")
    pytest.skip(message)


def chromium() -> str:
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("chromium")
    if found is None:
        _missing("Chromium (apt-get install chromium)")
    return str(found)


@dataclass
class Daemon:
    cluster: Cluster
    url: str
    admin: str

    def token(self, role: str) -> str:
        return self.admin if role == "admin" else SECRETS[role]

    def api(self, method: str, path: str, body: Any = None, role: str = "admin") -> Any:
        """Call the API as a client would (``path`` under /api/v1); the answer's JSON."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}/api/v1{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token(role)}"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def wait(self, what: Any, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = what()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s\n{self.cluster.logs()}")
            time.sleep(0.1)


def start_daemon(root: Path, worker: bool = True, **scheduler: Any) -> Daemon:
    cluster = Cluster(root, size=1, scheduler=scheduler)
    tokens = root / "tokens.toml"
    extra = "".join(
        f'\n[[token]]\nname = "{role}-viewer"\nsecret = "{secret}"\nrole = "{role}"\n'
        for role, secret in SECRETS.items()
    )
    tokens.write_text(tokens.read_text() + extra)
    cluster.start()
    daemon = Daemon(cluster, cluster.urls[0], cluster.token)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{daemon.url}/readyz", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    try:
        daemon.wait(ready, timeout=30)
        if worker:
            cluster.start_worker(
                "--import", "tests.browser.tasks", "--concurrency", "16", name="w1"
            )
            daemon.wait(lambda: daemon.api("GET", "/workers")["workers"])
    except BaseException:
        cluster.stop()
        raise
    return daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    chromium()  # skip before starting anything
    d = start_daemon(tmp_path_factory.mktemp("schedd"))
    try:
        yield d
    finally:
        d.cluster.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright (pip install -e '.[browser]')")
    profile = tempfile.mkdtemp(prefix="schedd-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=path,
                headless=True,
                args=ARGS,
                timezone_id=VIEWER_ZONE,
                locale="en-US",
                viewport={"width": 1400, "height": 900},
            )
            context.set_default_timeout(10_000)
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A new tab (its own sessionStorage: logged out); fails the test on any script error or
    console error (a refused Content-Security-Policy is one)."""
    tab = browser.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda err: problems.append(f"page error: {err}"))

    def console(msg: Any) -> None:
        # an API error answer (a 401 on a bad token, a 409) is logged by the browser as a
        # failed load; anything else at error level (a refused policy, a script error) counts
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            problems.append(f"console {msg.type}: {msg.text}")

    tab.on("console", console)
    try:
        yield tab
    finally:
        if not tab.is_closed() and tab.url.startswith("http"):  # (about:blank has none)
            # (a browser error page, the tab having moved to a node the test stopped, has none
            # either)
            from playwright.sync_api import Error as PlaywrightError

            with contextlib.suppress(PlaywrightError):
                tab.evaluate("localStorage.clear()")
        tab.close()
    assert not problems, "\n".join(problems)


def login(page: Any, daemon: Daemon, role: str = "admin", path: str = "/ui/") -> None:
    page.goto(daemon.url + path)
    page.fill("#token", daemon.token(role))
    page.click("#login button[type=submit]")
    page.wait_for_selector(f"#role:text-is('{role}')")
    page.wait_for_selector(".cluster .facts")


def screenshot(page: Any, name: str, tmp_path: Path) -> Path:
    """Save a screenshot of the page: to docs/img/ when asked, else beside the test."""
    folder = REPO / "docs" / "img" if os.environ.get("SCHEDD_UPDATE_SCREENSHOTS") else tmp_path
    out = folder / f"dashboard-{name}.png"
    page.screenshot(path=str(out), full_page=True)
    return out


#: what reaches past the right (or left) edge of the viewport: the document's own scroll width,
#: and each visible element that sticks out or scrolls sideways inside (form fields aside)
_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + (el.classList.length ? "." + [...el.classList].join(".") : "");
  const out = [];
  if (document.documentElement.scrollWidth > width) {
    out.push(`the document is ${document.documentElement.scrollWidth}px wide in ${width}px`);
  }
  for (const el of document.querySelectorAll("body *")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.right > width + 0.5 || r.left < -0.5) {
      out.push(`${name(el)} spans ${Math.round(r.left)}..${Math.round(r.right)}px`);
    }
    if (["INPUT", "SELECT", "TEXTAREA"].includes(el.tagName)) continue;
    const scrolls = ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
    if (scrolls && el.scrollWidth > el.clientWidth + 1) {
      out.push(`${name(el)} scrolls sideways: ${el.scrollWidth}px in ${el.clientWidth}px`);
    }
  }
  return out;
}"""


def horizontal_overflow(page: Any) -> list[str]:
    """What overflows the page horizontally at its viewport's width (nothing: ``[]``)."""
    found: list[str] = page.evaluate(_OVERFLOW)
    return found
