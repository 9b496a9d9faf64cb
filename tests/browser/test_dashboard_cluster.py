"""The dashboard on a real three-node cluster: a page served by a follower says so; when the
leader is killed the page shows the election and then names the new leader; its event stream,
cut at the same moment, resumes where it was and loses no run's change; and a run that spanned
the failover shows the new term on its timeline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import SECRETS, Daemon, chromium, screenshot
from tests.browser.test_dashboard import schedctl_ui
from tests.cluster.harness import Cluster
from tests.cluster.members import raft_addr

pytestmark = [pytest.mark.browser, pytest.mark.cluster]


@pytest.fixture
def three(tmp_path: Path) -> Iterator[Cluster]:
    chromium()
    cluster = Cluster(tmp_path / "c", size=3)
    tokens = cluster.root / "tokens.toml"
    tokens.write_text(
        tokens.read_text()
        + f'\n[[token]]\nname = "viewer"\nsecret = "{SECRETS["read"]}"\nrole = "read"\n'
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def leader_of(cluster: Cluster) -> int | None:
    for i, n in enumerate(cluster.nodes):
        if not n.alive:
            continue
        try:
            req = urllib.request.Request(f"{n.url}/api/v1/cluster", headers=cluster.headers())
            with urllib.request.urlopen(req, timeout=2) as r:
                view: dict[str, Any] = json.load(r)
        except OSError:
            continue
        if view["role"] == "leader" and view["leader"] == n.node_id and view["has_quorum"]:
            return i
    return None


def leader_and_follower(three: Cluster) -> tuple[Daemon, int, int]:
    """Once every node serves its API, names the leader and votes: a client of it, the
    leader's index and a follower's (a leader can be elected before a follower's HTTP site is
    up, and the tests then talk to that follower; and while a node still abstains, killing the
    leader would leave no majority to elect another)."""
    daemon = Daemon(three, three.urls[0], three.token)
    old = three.wait_formed(timeout=30)
    return daemon, old, next(i for i in range(3) if i != old)


def test_a_follower_serves_the_page_and_a_new_leader_is_told(
    page: Any, three: Cluster, tmp_path: Path
) -> None:
    daemon, old, follower = leader_and_follower(three)
    page.goto(three.nodes[follower].url + "/ui/")
    page.fill("#token", SECRETS["read"])
    page.click("#login button[type=submit]")
    page.wait_for_selector("#cluster .facts")
    bar = page.inner_text("#cluster")
    me, lead = three.nodes[follower].node_id, three.nodes[old].node_id
    assert f"served by {me} (follower)" in bar
    page.wait_for_selector(f"#cluster .fact:has-text('leader {lead}')")
    # the cluster screen, as a follower applied the membership: the lags are the leader's
    page.click("#nav a[data-screen='cluster']")
    # (by Raft address: a follower may not know every node's id yet)
    page.wait_for_selector(f"#members-table tr.leader[data-raft='{raft_addr(three, old)}']")
    assert page.locator("#members-table tbody tr").count() == 3
    assert page.inner_text("#members-quorum").startswith("3 voters, a majority is 2")
    assert set(page.locator("#members-table td.lag").all_inner_texts()) == {"—"}
    link = page.get_attribute("#leader-link", "href")
    assert link == f"{three.nodes[old].url}/ui/cluster", link
    three.kill(old)
    daemon.wait(lambda: leader_of(three) not in (None, old), timeout=30)
    new = leader_of(three)
    assert new is not None
    notice = page.wait_for_selector(".notice:has-text('leader')", timeout=20_000)
    term = re.search(r"term (\d+)", notice.inner_text())
    assert term is not None
    assert notice.inner_text().startswith(f"leader {lead} → {three.nodes[new].node_id} at term")
    page.wait_for_selector("#banner", state="hidden", timeout=10_000)
    # the new leader is marked on the cluster screen, and the old one is not connected
    page.wait_for_selector(f"#members-table tr.leader[data-raft='{raft_addr(three, new)}']")
    page.wait_for_selector(
        f"#members-table tr[data-raft='{raft_addr(three, old)}'] td.connected .bad"
    )
    screenshot(page, "leader-change", tmp_path)


class CuttableProxy:
    """A TCP proxy on 127.0.0.1:``port`` to ``target``, in a thread of its own: :meth:`cut`
    aborts every connection open through it (the listener stays)."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self.loop = asyncio.new_event_loop()
        self.writers: set[asyncio.StreamWriter] = set()
        self.cuts = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the proxy did not start"

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        ready.set()
        self.loop.run_forever()
        server.close()
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):  # closed meanwhile: no socket left open
            writer.transport.abort()
            return
        pair = {writer, up_writer}
        self.writers |= pair

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            for w in pair:
                w.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= pair

    def cut(self) -> None:
        def abort() -> None:
            for w in list(self.writers):
                w.transport.abort()
            self.writers.clear()
            self.cuts += 1

        self.loop.call_soon_threadsafe(abort)

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


#: every chunk the page's event-stream decoders decode, by decoder: what the page was told
CAPTURE_STREAM = """
(() => {
  const decode = TextDecoder.prototype.decode;
  let n = 0;
  window.__streams = [];
  TextDecoder.prototype.decode = function (...args) {
    const text = decode.apply(this, args);
    if (this.__n === undefined) this.__n = n++;
    if (text) window.__streams.push([this.__n, text]);
    return text;
  };
})();
"""


def parse_streams(chunks: list[list[Any]]) -> list[list[tuple[str, str | None, Any]]]:
    """The server-sent events of each stream the page read: (type, id, data) each."""
    texts: dict[int, str] = {}
    for n, text in chunks:
        texts[n] = texts.get(n, "") + text
    streams = []
    for n in sorted(texts):
        events = []
        for block in re.split(r"\n\n", texts[n]):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                if line.startswith(":") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key] = value[1:] if value.startswith(" ") else value
            if "event" in fields:
                events.append((fields["event"], fields.get("id"), json.loads(fields["data"])))
        streams.append(events)
    return streams


def submit_to_any(cluster: Cluster, body: dict[str, Any]) -> str | None:
    """A job submitted through any live node (None: none took it now)."""
    for n in cluster.nodes:
        if not n.alive:
            continue
        req = urllib.request.Request(
            f"{n.url}/api/v1/jobs",
            data=json.dumps(body).encode(),
            method="POST",
            headers={**cluster.headers(), "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                job_id: str = json.load(r)["id"]
                return job_id
        except (urllib.error.URLError, OSError):
            continue
    return None


def asked(daemon: Daemon, path: str) -> dict[str, Any] | None:
    """``GET path`` of the API; None when the node does not have it yet (404, 503)."""
    try:
        answer: dict[str, Any] = daemon.api("GET", path)
        return answer
    except urllib.error.HTTPError as e:
        if e.code in (404, 503):
            return None
        raise


def test_the_event_stream_resumes_across_a_failover_and_loses_no_run(
    page: Any, three: Cluster
) -> None:
    daemon, old, follower = leader_and_follower(three)
    daemon = Daemon(three, three.nodes[follower].url, three.token)  # it outlives the leader
    three.start_worker("--import", "tests.browser.tasks", "--concurrency", "16", name="w1")
    # the follower asks its leader, which it may not know yet (503)
    daemon.wait(lambda: (asked(daemon, "/workers") or {}).get("workers"), timeout=30)
    host, port = three.nodes[follower].url.removeprefix("http://").split(":")
    proxy = CuttableProxy(int(port) + 7, (host, int(port)))  # a free port next to its own
    try:
        page.add_init_script(CAPTURE_STREAM)
        page.goto(f"http://127.0.0.1:{proxy.port}/ui/jobs?namespace=tfail")
        page.fill("#token", SECRETS["read"])
        page.click("#login button[type=submit]")
        page.wait_for_selector("body[data-live=live]")
        # a run that is still running when the leader dies, and a job every 0.1 s around it
        long_id = submit_to_any(
            three, {"task": "ui.ok", "namespace": "tfail", "payload": {"sleep": 3}}
        )
        assert long_id is not None
        ids = [long_id]

        def latest_run(job_id: str) -> dict[str, Any]:
            """The job's latest run as the follower sees it ({} before it has the job: it
            may apply a submit acknowledged by the leader a moment later)."""
            return (asked(daemon, f"/jobs/{job_id}") or {}).get("latest_run") or {}

        daemon.wait(lambda: latest_run(long_id).get("state") == "running")
        for _ in range(10):
            job = submit_to_any(three, {"task": "ui.ok", "namespace": "tfail"})
            ids += [job] if job else []
            time.sleep(0.1)  # a steady trickle of work, not a synchronisation
        killed_at = time.monotonic()
        three.kill(old)
        proxy.cut()  # the page's stream breaks with the leader
        for _ in range(20):
            job = submit_to_any(three, {"task": "ui.ok", "namespace": "tfail"})
            ids += [job] if job else []
            time.sleep(0.1)
        notice = page.wait_for_selector(".notice:has-text('leader')", timeout=20_000)
        told_after = time.monotonic() - killed_at
        new = leader_of(three)
        assert new is not None and new != old
        term = re.search(r"term (\d+)", notice.inner_text())
        assert term is not None
        assert f"→ {three.nodes[new].node_id} at term {term.group(1)}" in notice.inner_text()
        assert told_after < 10, f"the page named the new leader {told_after:.1f} s after the kill"

        # every acknowledged job ran, and the page was told each run's end over the stream
        def runs_done() -> dict[str, str] | None:
            done = {}
            for job_id in ids:
                run = latest_run(job_id)
                if run.get("state") != "succeeded":
                    return None
                done[run["id"]] = job_id
            return done

        done = daemon.wait(runs_done, timeout=60)

        def told() -> list[list[tuple[str, str | None, Any]]] | None:
            streams = parse_streams(page.evaluate("window.__streams"))
            seen = {
                c["id"]
                for events in streams
                for kind, _, data in events
                if kind == "run"
                for c in data
                if c["state"] == "succeeded"
            }
            return streams if set(done) <= seen else None

        streams = daemon.wait(told, timeout=20)
        assert len(streams) >= 2, "the stream was not cut and resumed"
        kinds = [kind for events in streams for kind, _, _ in events]
        assert "reset" not in kinds  # resumed from where it was, not read again
        ids_seen = [int(i) for events in streams for _, i, _ in events if i is not None]
        assert ids_seen == sorted(ids_seen)
        # each new stream resumed at the last event id the page had (Last-Event-ID)
        last_id: str | None = None
        for events in streams:
            if not events:
                continue
            kind, _, hello = events[0]
            assert kind == "hello"
            if last_id is not None:
                assert hello["after"] == int(last_id)
            last_id = next((i for _, i, _ in reversed(events) if i is not None), last_id)

        # the run that spanned the failover shows the new term on its timeline
        long_run = latest_run(long_id)
        page.goto(f"http://127.0.0.1:{proxy.port}/ui/runs/{long_run['id']}")
        mark = page.wait_for_selector(f"svg.timeline g.term[data-term='{term.group(1)}']")
        assert f"term {term.group(1)} · {three.nodes[new].node_id}" in (mark.text_content() or "")
    finally:
        proxy.close()


def test_a_page_whose_node_dies_moves_to_another_logged_in(
    page: Any, three: Cluster, tmp_path: Path
) -> None:
    """The node serving the page is killed: the page moves by itself to another node that
    serves the dashboard, on the same screen, still logged in (its dashboard session goes
    along), with the session out of the address."""
    daemon, _, follower = leader_and_follower(three)
    job = daemon.api(
        "POST", "/jobs", {"task": "ui.ok", "name": "survivor", "schedule": {"in": "1h"}}
    )
    served = three.nodes[follower]
    page.goto(schedctl_ui(Daemon(three, served.url, three.token), "read"))  # a session
    page.wait_for_selector("#role:text-is('read')")
    page.goto(served.url + "/ui/jobs")
    page.wait_for_selector(f"tr[data-job='{job['id']}']")
    page.wait_for_selector("#cluster .node >> nth=2")  # it has seen every node
    three.kill(follower)
    # it moves to another node by itself, logged in, the session out of the address
    page.wait_for_url(lambda url: not url.startswith(served.url), timeout=30_000)
    page.wait_for_selector(f"tr[data-job='{job['id']}']", timeout=15_000)
    assert page.query_selector("#login") is None or not page.is_visible("#login")
    assert "#" not in page.url and "schedd-session" not in page.url
    assert page.url.endswith("/ui/jobs")
    others = {n.url for i, n in enumerate(three.nodes) if i != follower}
    assert any(page.url.startswith(u) for u in others)
    screenshot(page, "moved-to-another-node", tmp_path)


def test_a_page_whose_node_dies_keeps_its_data_greyed_and_names_the_other_nodes(
    page: Any, three: Cluster, tmp_path: Path
) -> None:
    """The node serving the page dies while the other nodes cannot be reached from the browser
    either: the jobs stay on screen, greyed, under the error; the banner links the other nodes
    by name. Once they can be reached, the page moves to one of them by itself."""
    daemon, _, follower = leader_and_follower(three)
    job = daemon.api("POST", "/jobs", {"task": "ui.ok", "name": "kept", "schedule": {"in": "1h"}})
    served = three.nodes[follower]
    page.goto(schedctl_ui(Daemon(three, served.url, three.token), "read"))
    page.wait_for_selector("#role:text-is('read')")
    page.goto(served.url + "/ui/jobs")
    page.wait_for_selector(f"tr[data-job='{job['id']}']")
    page.wait_for_selector("#cluster .node >> nth=2")  # it has seen every node
    # ... and knows each by its id (a follower learns a peer's id from the peer's Raft hello;
    # until then the bar can only show its address)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#cluster .node b')]"
        ".every(b => !b.textContent.includes(':'))",
        timeout=20_000,
    )
    others = {n.url: n.node_id for i, n in enumerate(three.nodes) if i != follower}

    def elsewhere(url: str) -> bool:
        return any(url.startswith(u) for u in others)

    page.route(elsewhere, lambda route: route.abort())
    three.kill(follower)
    page.wait_for_selector("#banner a.other-node >> nth=1", timeout=20_000)
    banner = page.inner_text("#banner")
    assert "cannot be reached" in banner and "Other nodes:" in banner, banner
    named = page.eval_on_selector_all("#banner a.other-node", "as => as.map(a => a.textContent)")
    assert sorted(named) == sorted(others.values()), named
    # the screen's data stays, greyed, with the error above it
    page.wait_for_selector(".table-wrap.stale > .error", timeout=20_000)
    row = page.query_selector(f".table-wrap.stale tr[data-job='{job['id']}']")
    assert row is not None and "kept" in row.inner_text()
    faded = page.eval_on_selector(
        ".table-wrap.stale > table", "t => Number(getComputedStyle(t).opacity)"
    )
    assert faded < 1, faded
    assert page.url.startswith(served.url)
    screenshot(page, "node-gone", tmp_path)
    page.unroute(elsewhere)
    page.wait_for_url(lambda url: elsewhere(url), timeout=30_000)
    page.wait_for_selector(f"tr[data-job='{job['id']}']", timeout=15_000)
    assert page.query_selector(".table-wrap.stale") is None
