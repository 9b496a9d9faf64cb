"""The cluster bar on a real three-node cluster: a page served by a follower says so, and when
the leader is killed the page shows the election and then names the new leader."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import SECRETS, Daemon, chromium, screenshot
from tests.cluster.harness import Cluster

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


def test_a_follower_serves_the_page_and_a_new_leader_is_told(
    page: Any, three: Cluster, tmp_path: Path
) -> None:
    daemon = Daemon(three, three.urls[0], three.token)
    daemon.wait(lambda: leader_of(three) is not None, timeout=30)
    old = leader_of(three)
    assert old is not None
    follower = next(i for i in range(3) if i != old)
    page.goto(three.nodes[follower].url + "/ui/")
    page.fill("#token", SECRETS["read"])
    page.click("#login button[type=submit]")
    page.wait_for_selector("#cluster .facts")
    bar = page.inner_text("#cluster")
    me, lead = three.nodes[follower].node_id, three.nodes[old].node_id
    assert f"served by {me} (follower)" in bar
    page.wait_for_selector(f"#cluster .fact:has-text('leader {lead}')")
    three.kill(old)
    daemon.wait(lambda: leader_of(three) not in (None, old), timeout=30)
    new = leader_of(three)
    assert new is not None
    notice = page.wait_for_selector(".notice:has-text('leader')", timeout=20_000)
    term = re.search(r"term (\d+)", notice.inner_text())
    assert term is not None
    assert notice.inner_text().startswith(f"leader {lead} → {three.nodes[new].node_id} at term")
    page.wait_for_selector("#banner", state="hidden", timeout=10_000)
    screenshot(page, "leader-change", tmp_path)
