"""The Raft secret on real clusters: nodes that share it form a cluster and their traffic cannot
be read without it; a node with another secret, or one the peers do not list, is refused, and
both sides say so in their logs."""

from __future__ import annotations

import asyncio
import re
import secrets
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from cryptography.fernet import InvalidToken
from pysyncobj.encryptor import getEncryptor

from tests.cluster.harness import Cluster
from tests.conftest import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def new_secret(path: Path) -> Path:
    path.write_text(secrets.token_hex(48) + "\n")
    path.chmod(0o600)
    return path


async def wait_log(cluster: Cluster, i: int, pattern: str, timeout: float = 30.0) -> str:
    """The first line of node i's log matching ``pattern``."""
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        for line in cluster.nodes[i].log.read_text(errors="replace").splitlines():
            if regex.search(line):
                return line
        await asyncio.sleep(0.1)
    raise AssertionError(f"node {i} never logged {pattern!r}\n{cluster.logs()}")


async def submit(http: aiohttp.ClientSession, url: str, cluster: Cluster, payload: Any) -> None:
    async with http.post(
        url + "/api/v1/jobs",
        data=orjson.dumps({"task": "t", "payload": payload}),
        headers=cluster.headers(),
        timeout=aiohttp.ClientTimeout(total=10),
    ) as r:
        assert r.status == 201, await r.text()


async def metric(http: aiohttp.ClientSession, cluster: Cluster, i: int, name: str) -> float:
    async with http.get(cluster.nodes[i].url + "/metrics", headers=cluster.headers()) as r:
        text = await r.text()
    values = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name)]
    assert values, f"{name} not exported"
    return sum(values)


async def test_a_node_with_another_secret_is_refused_and_both_sides_say_so(tmp_path: Path) -> None:
    good = new_secret(tmp_path / "good.key")
    other = new_secret(tmp_path / "other.key")
    cluster = Cluster(
        tmp_path / "c", raft={"secret_file": str(good)}, node_raft={2: {"secret_file": str(other)}}
    )
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_leader(http)
            assert leader != 2, "the odd node out cannot lead"
            for i in range(3):
                line = await wait_log(cluster, i, r"raft\.peer_refused .*reason=wrong_secret")
                assert "raft.secret_file" in line
            # The two nodes that share the secret commit without the third.
            await submit(http, cluster.nodes[leader].url, cluster, {"n": 1})
            views = [await cluster.view(http, i) for i in range(3)]
            assert views[leader] and views[leader]["commit_index"] > 0
            odd = views[2]
            assert odd is not None and odd["leader"] is None
            assert odd["applied_index"] < views[leader]["commit_index"], "it applied nothing new"
            assert (
                await metric(
                    http, cluster, leader, 'schedd_raft_peer_refused_total{reason="wrong_secret"}'
                )
                >= 1
            )
            # The same node with the right secret joins and catches up.
            cluster.kill(2)
            text = cluster.nodes[2].config.read_text().replace(str(other), str(good))
            cluster.nodes[2].config.write_text(text)
            cluster.start(2)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                v = await cluster.view(http, 2)
                if v and v["applied_index"] >= views[leader]["commit_index"]:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(
                    f"the node with the right secret never caught up\n{cluster.logs()}"
                )
    finally:
        cluster.stop()


async def test_a_node_no_peer_lists_exits_with_one_line(tmp_path: Path) -> None:
    """The node whose address sorts highest opens the connections; when both peers list it under
    another address, both refuse it and it stops with the reason instead of waiting forever."""
    cluster = Cluster(tmp_path / "c")
    hi = max(range(3), key=lambda i: cluster.nodes[i].raft_port)
    wrong = free_port()
    real = f'"127.0.0.1:{cluster.nodes[hi].raft_port}"'
    for i, n in enumerate(cluster.nodes):
        if i != hi:
            n.config.write_text(n.config.read_text().replace(real, f'"127.0.0.1:{wrong}"'))
    try:
        cluster.start()
        proc = cluster.nodes[hi].proc
        assert proc is not None
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 60)
        assert code == 2
        lines = cluster.nodes[hi].log.read_text().splitlines()
        assert not any("Traceback" in ln for ln in lines), cluster.logs()
        final = [ln for ln in lines if ln.startswith("schedd: ")]
        assert len(final) == 1, cluster.logs()
        assert final[0].startswith(
            f"schedd: raft.listen: no peer lists this node's address "
            f"127.0.0.1:{cluster.nodes[hi].raft_port} in its raft.peers"
        )
        assert f"127.0.0.1:{wrong}" in final[0], "it says what the peers list instead"
        for i in range(3):
            if i != hi:
                line = await wait_log(cluster, i, r"raft\.peer_refused .*reason=not_in_peers")
                assert f"127.0.0.1:{cluster.nodes[hi].raft_port}" in line
    finally:
        cluster.stop()


class Tap:
    """A TCP forwarder to ``target`` that records the bytes of each direction."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self.sent = bytearray()  # client -> target
        self.received = bytearray()  # target -> client
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10)

    def captured(self) -> tuple[bytes, bytes]:
        with self._lock:
            return bytes(self.sent), bytes(self.received)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        for w in self._writers:
            w.close()
        for t in self._tasks:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers.append(up_writer)

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, into: bytearray
        ) -> None:
            while chunk := await src.read(65536):
                with self._lock:
                    into += chunk
                dst.write(chunk)
                await dst.drain()
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, self.sent),
            pipe(up_reader, writer, self.received),
            return_exceptions=True,
        )


def frames(data: bytes) -> list[bytes]:
    """pysyncobj frames: a native 4-byte length, then the (maybe encrypted) message."""
    out, off = [], 0
    while off + 4 <= len(data):
        (size,) = struct.unpack_from("i", data, off)
        out.append(data[off + 4 : off + 4 + size])
        off += 4 + size
    return out


@pytest.mark.parametrize("with_secret", [True, False], ids=["secret", "no-secret"])
async def test_raft_traffic_cannot_be_read_without_the_secret(
    tmp_path: Path, with_secret: bool
) -> None:
    """Two nodes; node 2 (the higher address, so the one that opens the connection) reaches
    node 1 through a tap that records both directions.  A job's payload crosses the link before
    its submit is answered (a majority of two is both)."""
    p1, tap_port, p2 = sorted(free_port() for _ in range(3))  # raft 1 < tap < raft 2
    key = new_secret(tmp_path / "raft.key")
    cluster = Cluster(
        tmp_path / "c",
        size=2,
        http_ports=[p1, p2],
        raft={"secret_file": str(key)} if with_secret else {},
        node_raft={
            1: {"peers": [f"127.0.0.1:{tap_port}"], "peer_http": [f"http://127.0.0.1:{p1}"]}
        },
    )
    tap = Tap(tap_port, p1 + 1)
    tap.start()
    marker = "payload-" + secrets.token_hex(8)
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_leader(http)
            await submit(http, cluster.nodes[leader].url, cluster, {"marker": marker})
        captured = tap.captured()
    finally:
        cluster.stop()
        tap.stop()
    messages = frames(captured[0]) + frames(captured[1])
    assert messages, "the link carried the cluster's Raft traffic"
    if not with_secret:  # the control: without a secret anyone on the path reads the job
        assert any(marker.encode() in zlib.decompress(m) for m in messages)
        return
    assert marker.encode() not in captured[0] + captured[1]
    for m in messages:
        with pytest.raises(zlib.error):
            zlib.decompress(m)
    wrong = getEncryptor(secrets.token_hex(48).encode())
    for m in messages:
        with pytest.raises(InvalidToken):
            wrong.decrypt(m)
    right = getEncryptor(key.read_bytes().strip())
    assert any(marker.encode() in zlib.decompress(right.decrypt(m)) for m in messages), (
        "with the secret the same bytes hold the job: the capture saw it"
    )
