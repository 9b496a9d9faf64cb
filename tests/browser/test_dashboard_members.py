"""The cluster screen (/ui/cluster) in a real headless Chromium against a real node: the members
as GET /cluster/nodes gives them, with the quorum; a read or submit session sees no control; an
admin adds a learner (an address nothing listens on: it stays one), is told the API's 409 for a
second one, and removes it; the last voter is refused with the API's 400; a learner's lag
shrinks and it becomes a voter as the page watches; a real node started after it was added
becomes a voter, then is removed and stops; and at a phone's width nothing sticks out
sideways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import (
    Daemon,
    chromium,
    horizontal_overflow,
    login,
    screenshot,
    start_daemon,
)
from tests.cluster.members import exit_status, new_node, raft_addr
from tests.conftest import free_port

pytestmark = pytest.mark.browser

ROW = "#members-table tr[data-raft='{}']"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A one-node cluster of its own (no worker): the tests change its membership."""
    chromium()
    d = start_daemon(tmp_path_factory.mktemp("members"), worker=False)
    try:
        yield d
    finally:
        d.cluster.stop()


def nowhere() -> str:
    """A loopback Raft address that nothing listens on."""
    return f"127.0.0.1:{free_port()}"


def members(node: Daemon) -> dict[str, Any]:
    view: dict[str, Any] = node.api("GET", "/cluster/nodes")
    return view


def raft_of_n1(node: Daemon) -> str:
    return raft_addr(node.cluster, 0)


def call_off_learners(node: Daemon) -> None:
    """Leave the node as the tests found it: no learner."""
    for n in members(node)["nodes"]:
        if n["role"] == "learner":
            node.api("DELETE", f"/cluster/nodes/{n['raft']}")


def test_the_members_and_the_quorum_and_no_control_without_admin(page: Any, node: Daemon) -> None:
    me = members(node)["nodes"][0]
    for role in ("read", "submit"):
        login(page, node, role, "/ui/cluster")
        assert page.get_attribute("#nav a[data-screen='cluster']", "class") == "current"
        row = page.wait_for_selector(ROW.format(me["raft"]))
        cells = row.query_selector_all("td")
        texts = [c.inner_text().strip() for c in cells]
        assert texts[:3] == ["n1", me["raft"], me["http"]], texts
        assert texts[3] == "voter leader · this page", texts
        assert texts[5].isdigit(), texts  # its lag: this node leads
        assert row.get_attribute("data-role") == "voter"
        quorum = page.inner_text("#members-quorum")
        assert quorum.startswith("1 voter, a majority is 1; membership from"), quorum
        assert "as n1 applied it" in page.inner_text("#members-about")
        assert page.query_selector("#add-node") is None  # admin only
        assert page.query_selector("#members-table button") is None
        assert page.query_selector("#members-table th:text-is('')") is None
        page.click("#logout")


def test_an_admin_adds_a_learner_is_refused_a_second_and_removes_it(
    page: Any, node: Daemon, tmp_path: Path
) -> None:
    first, second = nowhere(), nowhere()
    login(page, node, "admin", "/ui/cluster")
    try:
        page.wait_for_selector(ROW.format(raft_of_n1(node)))
        page.fill("#add-raft", first)
        page.click("#add-node button[type=submit]")
        row = page.wait_for_selector(f"{ROW.format(first)}[data-role=learner]")
        text = row.inner_text()
        assert "id not known yet" in text and "learner" in text
        assert "catching up: not connected yet" in text
        assert row.query_selector("td.connected").inner_text() == "no"
        assert "added as a learner" in page.inner_text("#add-message")
        assert page.input_value("#add-raft") == ""  # the form is ready for the next one
        page.wait_for_selector("#members-quorum:has-text('1 voter, a majority is 1; 1 learner')")
        screenshot(page, "cluster", tmp_path)

        # a second one while the first is a learner: the API's 409, in its words
        page.fill("#add-raft", second)
        page.click("#add-node button[type=submit]")
        message = page.wait_for_selector("#add-message.error")
        said = message.inner_text()
        assert said.startswith("Not added (409): a membership change is in flight"), said
        assert first in said
        assert message.get_attribute("role") == "alert"
        assert page.query_selector(ROW.format(second)) is None
        assert {n["raft"] for n in members(node)["nodes"]} == {raft_of_n1(node), first}

        # removing it: a confirmation that names it, then it is gone and listed as removed
        page.click(f"{ROW.format(first)} button:text('Remove')")
        dialog = page.wait_for_selector("#remove-dialog[open]")
        said = dialog.inner_text()
        assert f"Remove {first} from the cluster?" in said  # (no id known: its address once)
        assert "calls its addition off" in said and "stops" in said
        page.click("#remove-confirm")
        page.wait_for_selector("#remove-dialog", state="hidden")
        page.wait_for_selector(ROW.format(first), state="detached")
        page.wait_for_selector(f"#members-removed li[data-raft='{first}']")
        page.wait_for_selector(f".notice:has-text('{first} removed')")
        assert [n["raft"] for n in members(node)["nodes"]] == [raft_of_n1(node)]
        assert first in members(node)["removed"]

        # the last voter, which leads and serves this page: the dialog says what would happen,
        # and the API's 400 is shown in it
        page.click(f"{ROW.format(raft_of_n1(node))} button:text('Remove')")
        dialog = page.wait_for_selector("#remove-dialog[open]")
        said = dialog.inner_text()
        assert f"Remove n1 ({raft_of_n1(node)}) from the cluster?" in said
        assert "n1 leads the cluster: it hands its leadership over to another voter first" in said
        assert "stops" in said and "n1 serves this page" in said
        page.click("#remove-confirm")
        refused = page.wait_for_selector("#remove-message.error")
        assert refused.inner_text().startswith("Not removed (400): n1 is the last voter")
        page.click("#remove-cancel")
        page.wait_for_selector("#remove-dialog", state="hidden")
        assert page.is_visible(ROW.format(raft_of_n1(node)))
    finally:
        call_off_learners(node)


def test_a_learner_catching_up_then_a_voter_as_the_page_watches(page: Any, node: Daemon) -> None:
    """The node's answers with a learner in them, its lag shrinking, then with it a voter: the
    screen follows by itself (here by asking again every few seconds, as it does for the lags;
    a real change is also a "cluster" event, which the test below sees)."""
    learner = {
        "id": None,
        "raft": "127.0.0.1:31999",
        "http": None,
        "role": "learner",
        "leader": False,
        "self": False,
        "connected": True,
    }
    state: dict[str, Any] = {"learner": {**learner, "match_index": 10, "lag": 1200}}

    def answer(route: Any) -> None:
        view = members(node)
        view["nodes"].append(state["learner"])
        view["quorum"] = sum(n["role"] == "voter" for n in view["nodes"]) // 2 + 1
        route.fulfill(json=view)

    page.route("**/api/v1/cluster/nodes", answer)
    login(page, node, "read", "/ui/cluster")
    row = ROW.format(learner["raft"])
    page.wait_for_selector(f"{row} .catching-up:text-is('catching up: 1200 entries behind')")
    assert page.get_attribute(f"{row} .catching-up", "title") == "match index 10"
    state["learner"] = {**learner, "match_index": 1150, "lag": 60}
    page.wait_for_selector(f"{row} .catching-up:text-is('catching up: 60 entries behind')")
    quorum = page.inner_text("#members-quorum")
    assert "1 voter, a majority is 1; 1 learner, which does not count" in quorum, quorum
    state["learner"] = {
        **learner,
        "id": "n9",
        "http": "http://127.0.0.1:31998",
        "role": "voter",
        "match_index": 1210,
        "lag": 0,
    }
    page.wait_for_selector(f"{row}[data-role=voter][data-node=n9]")
    assert page.query_selector(f"{row} .catching-up") is None
    assert page.inner_text(f"{row} td.lag") == "0"
    quorum = page.inner_text("#members-quorum")
    assert quorum.startswith("2 voters, a majority is 2"), quorum


class StoppedAsRemoved(Exception):
    """The new node stopped before it was a voter, saying it was removed."""


def test_a_node_started_after_it_was_added_becomes_a_voter_and_is_removed(
    page: Any, node: Daemon
) -> None:
    cluster = node.cluster
    n2 = new_node(cluster, "n2", {"peers": [raft_of_n1(node)]})
    addr = raft_addr(cluster, n2)
    login(page, node, "admin", "/ui/cluster")
    try:
        page.fill("#add-raft", addr)
        page.click("#add-node button[type=submit]")
        page.wait_for_selector(f"{ROW.format(addr)}[data-role=learner]")
        # the page follows by itself: it catches up and the leader makes it a voter, with the
        # id it says
        cluster.start(n2)
        proc = cluster.nodes[n2].proc
        assert proc is not None
        voter = f"{ROW.format(addr)}[data-role=voter][data-node=n2]"
        node.wait(lambda: proc.poll() is not None or page.query_selector(voter), timeout=60)
        if proc.poll() is not None:
            said = cluster.nodes[n2].log.read_text()[-600:]
            if "was removed from its cluster" in said:
                raise StoppedAsRemoved(said)
            raise AssertionError(f"n2 stopped:\n{said}")
        assert page.inner_text(f"{voter} td.connected") == "yes"
        page.wait_for_selector("#members-quorum:has-text('2 voters, a majority is 2')")

        page.click(f"{ROW.format(addr)} button:text('Remove')")
        said = page.wait_for_selector("#remove-dialog[open]").inner_text()
        assert f"Remove n2 ({addr}) from the cluster?" in said
        assert "n2 stops being a voter: 1 voter remains, and a majority becomes 1" in said
        assert "told so and stops" in said and "hands its leadership" not in said
        page.click("#remove-confirm")
        page.wait_for_selector(ROW.format(addr), state="detached", timeout=20_000)
        page.wait_for_selector("#members-quorum:has-text('1 voter, a majority is 1')")
        assert exit_status(cluster, n2) == 2  # a removed node stops
        assert "was removed from its cluster" in cluster.nodes[n2].log.read_text()
    finally:
        call_off_learners(node)


def test_on_a_phone_nothing_sticks_out_sideways(page: Any, node: Daemon, tmp_path: Path) -> None:
    learner = nowhere()
    node.api("POST", "/cluster/nodes", {"raft": learner})
    try:
        page.set_viewport_size({"width": 390, "height": 844})
        login(page, node, "admin", "/ui/cluster")
        page.wait_for_selector(f"{ROW.format(learner)}[data-role=learner]")
        assert horizontal_overflow(page) == []
        screenshot(page, "cluster-phone", tmp_path)
        page.click(f"{ROW.format(learner)} button:text('Remove')")
        page.wait_for_selector("#remove-dialog[open]")
        assert horizontal_overflow(page) == []
        page.click("#remove-cancel")
        # a refusal's long message wraps too
        page.fill("#add-raft", nowhere())
        page.click("#add-node button[type=submit]")
        page.wait_for_selector("#add-message.error")
        assert horizontal_overflow(page) == []
    finally:
        call_off_learners(node)
