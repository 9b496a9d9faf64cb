"""The network lab itself (tests/cluster/netns.py): what each kind of cut does to packets
between two namespaces, so that the partition tests and the fault schedules built on it cut
what they say they cut."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.netns import CLIENT, NetLab, available

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(60),
    pytest.mark.skipif(available() is not None, reason=str(available())),
]

PORT = 17900

# Receives UDP datagrams until told the sender has finished (its stop file exists), then
# takes what is still queued and prints how many arrived. The receive buffer is large enough
# for every datagram a test sends, so a receiver descheduled on a busy machine loses none.
COUNT_UDP = f"""
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root)
s.bind(("0.0.0.0", {PORT}))
print("ready", flush=True)
s.settimeout(0.1)
n = 0
while True:
    try:
        s.recv(100)
        n += 1
    except TimeoutError:
        if os.path.exists(sys.argv[1]):
            break
print(n, flush=True)
"""

SEND_UDP = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[2])):
    s.sendto(b"x", (sys.argv[1], {port}))
    time.sleep(0.0005)
"""

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], {port}), timeout=1.5).close()
    print("connected")
except TimeoutError:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
"""


def in_ns(lab: NetLab, host: str, code: str, *args: str) -> str:
    if host == CLIENT:
        cmd = [sys.executable, "-c", code, *args]
    else:
        cmd = [*lab.prefix(host), sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()


def udp_received(lab: NetLab, src: str, dst: str, count: int, tmp_path: Path) -> int:
    log = tmp_path / f"recv-{src}-{dst}.txt"
    stop = tmp_path / f"stop-{src}-{dst}"
    log.unlink(missing_ok=True)  # a pair measured twice: wait for this receiver's "ready"
    stop.unlink(missing_ok=True)
    recv = lab.run(dst, [sys.executable, "-u", "-c", COUNT_UDP, str(stop)], log)
    for _ in range(200):
        if log.exists() and "ready" in log.read_text():
            break
        subprocess.run(["sleep", "0.05"])
    in_ns(lab, src, SEND_UDP.format(port=PORT), lab.ip[dst], str(count))
    # The sender has exited: whatever the network delivers is in the receiver's queue or on
    # a veth pair's few microseconds of way there, well within the receiver's last 0.1 s wait.
    stop.touch()
    recv.wait(10)
    return int(log.read_text().split()[-1])


def connects(lab: NetLab, src: str, dst: str) -> str:
    """Whether a TCP connection from src reaches dst's port (nothing listens: 'refused')."""
    return in_ns(lab, src, CONNECT.format(port=PORT), lab.ip[dst])


def test_cuts_one_way_cuts_and_packet_loss_do_what_they_say(tmp_path: Path) -> None:
    with NetLab(["a", "b", "c"]) as lab:
        assert connects(lab, "a", "b") == "refused"  # reached: nothing listens there
        assert udp_received(lab, "a", "b", 400, tmp_path) == 400

        lab.cut("a", "b")  # dropped both ways: connections hang
        assert connects(lab, "a", "b") == "timeout"
        assert connects(lab, "b", "a") == "timeout"
        assert connects(lab, "a", "c") == "refused"  # other pairs untouched
        lab.heal()
        assert connects(lab, "a", "b") == "refused"

        lab.cut_one_way("a", "b")  # a's packets to b dropped, b's to a delivered
        assert udp_received(lab, "a", "b", 200, tmp_path) == 0
        assert udp_received(lab, "b", "a", 200, tmp_path) == 200
        lab.heal()

        lab.loss("a", "b", 30)
        got = udp_received(lab, "a", "b", 1000, tmp_path)
        assert 550 <= got <= 850, got  # 700 expected; binomial sd ~15
        assert udp_received(lab, "a", "c", 200, tmp_path) == 200
        lab.heal()
        assert udp_received(lab, "a", "b", 400, tmp_path) == 400

        lab.cut(CLIENT, "b")  # the test process (root namespace) cut from b
        assert connects(lab, CLIENT, "b") == "timeout"
        assert connects(lab, CLIENT, "a") == "refused"


# Makes a lab, prints its namespaces, bridge and subnet, and waits to be killed.
ABANDON = """
import json, sys, time
from tests.cluster.netns import NetLab
lab = NetLab(["a"]).__enter__()
print(json.dumps([list(lab.ns.values()), lab.bridge, str(lab.subnet)]), flush=True)
time.sleep(60)
"""


def test_a_lab_left_by_a_killed_process_is_avoided_then_removed() -> None:
    def names() -> str:
        return (
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            + subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        )

    with subprocess.Popen(
        [sys.executable, "-c", ABANDON], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            namespaces, bridge, subnet = json.loads(proc.stdout.readline())
            # While its process lives, its lab stays, and a new one takes another subnet.
            with NetLab(["a"]) as lab:
                assert str(lab.subnet) != subnet
                assert bridge in names() and namespaces[0] in names()
        finally:
            proc.kill()
    # Killed, it could not close its lab: the next lab made removes it.
    assert bridge in names()
    with NetLab(["a"]) as lab:
        assert bridge not in names() and namespaces[0] not in names()
        assert connects(lab, "a", CLIENT) == "refused"  # reached, nothing listens
