"""TLS end to end: a node with ``http.tls_cert``/``http.tls_key`` serves the API over https and
the worker websocket over wss; schedctl, the worker SDK and ``schedd-worker`` trust a private CA
through ``--cacert``/``SCHEDD_CACERT``/``cafile=``; a follower reaches the leader over https with
``http.tls_ca``; bad TLS settings are refused naming the key.

A throwaway CA and a server certificate for 127.0.0.1/localhost are made with the ``openssl``
command at test time (the ``cryptography`` package is not a dependency)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from schedd.auth import ensure_admin_token
from schedd.cli import daemon
from schedd.config import check_files, load_config
from schedd.errors import ConfigError
from schedd.worker import Worker
from schedd.worker.registry import Context, Registry
from tests.conftest import Node, free_port, wait_for

API = "/api/v1"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


# ---- a throwaway PKI ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed cert
    cert: Path  # for 127.0.0.1 and localhost
    key: Path
    other_ca: Path  # a CA that signed nothing here
    other_key: Path  # a key that is not cert's


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(d: Path, name: str) -> None:
    _openssl(
        d,
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=schedd test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-addext",
        "subjectKeyIdentifier=hash",
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other")
    _openssl(
        d,
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    )
    (d / "server.ext").write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid:always\n"
    )
    _openssl(
        d,
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-set_serial",
        f"0x{secrets.token_hex(8)}",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    )
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "other.pem", d / "other.key")


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


# ---- nodes -------------------------------------------------------------------------------------


def tls_overrides(pki: Pki, data_dir: Path, port: int, **extra: object) -> dict[str, object]:
    return {
        "node.data_dir": str(data_dir),
        "http.listen": f"127.0.0.1:{port}",
        "raft.listen": f"127.0.0.1:{port + 1}",
        "http.tls_cert": str(pki.cert),
        "http.tls_key": str(pki.key),
        "scheduler.drain_time": "2s",
        **extra,
    }


async def start_tls_nodes(
    pki: Pki, root: Path, size: int = 1, token_file: Path | None = None, **extra: object
) -> list[Node]:
    """``size`` in-process nodes serving https, every one with a tokens file in common."""
    from schedd.runtime import Runtime

    ports = [free_port() for _ in range(size)]
    tokens = token_file or root / "tokens.toml"
    token, _ = ensure_admin_token(tokens)
    nodes = []
    for i, port in enumerate(ports):
        peers = [f"127.0.0.1:{p + 1}" for p in ports if p != port]
        overrides = tls_overrides(pki, root / f"n{i + 1}", port, **extra)
        overrides.update(
            {"node.id": f"n{i + 1}", "raft.peers": peers, "auth.tokens_file": str(tokens)}
        )
        cfg = load_config(None, env={}, overrides=overrides)
        assert check_files(cfg) == []
        assert cfg.advertise_url() == f"https://127.0.0.1:{port}"
        rt = Runtime(cfg)
        await rt.start()
        nodes.append(Node(rt, cfg.advertise_url(), token, root / f"n{i + 1}"))
    await wait_for(
        lambda: any(n.rt.leader is not None and n.rt.leader.ready.is_set() for n in nodes),
        timeout=20,
    )
    return nodes


@pytest.fixture
async def tls_node(pki: Pki, tmp_path: Path) -> AsyncIterator[Node]:
    (node,) = await start_tls_nodes(pki, tmp_path)
    try:
        yield node
    finally:
        await node.rt.stop()


@pytest.fixture
async def https(pki: Pki) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session that trusts the test CA."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(pki.ca))) as s:
        yield s


async def submit(http: aiohttp.ClientSession, node: Node, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(
        node.url + API + "/jobs", data=orjson.dumps(body), headers=node.headers()
    ) as r:
        assert r.status == 201, await r.text()
        job: dict[str, Any] = await r.json()
        return job


async def run_states(http: aiohttp.ClientSession, node: Node, job_id: str) -> list[str]:
    async with http.get(node.url + API + f"/jobs/{job_id}/runs", headers=node.headers()) as r:
        assert r.status == 200, await r.text()
        return [run["state"] for run in (await r.json())["runs"]]


async def succeeded(http: aiohttp.ClientSession, node: Node, job_id: str) -> bool:
    return await run_states(http, node, job_id) == ["succeeded"]


# ---- the API over https ------------------------------------------------------------------------


async def test_https_api_works_with_the_ca(tls_node: Node, https: aiohttp.ClientSession) -> None:
    async with https.get(tls_node.url + "/healthz") as r:
        assert r.status == 200
    async with https.get(tls_node.url + API + "/cluster", headers=tls_node.headers()) as r:
        assert r.status == 200
        view = await r.json()
    assert view["nodes"][0]["http"] == tls_node.url and tls_node.url.startswith("https://")
    job = await submit(https, tls_node, {"task": "tls.nothing"})
    assert len(await run_states(https, tls_node, job["id"])) == 1


async def test_plain_http_to_the_tls_port_fails(tls_node: Node) -> None:
    plain = tls_node.url.replace("https://", "http://")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(plain + "/healthz") as r:
                await r.read()


async def test_a_client_without_the_ca_is_refused(tls_node: Node, pki: Pki) -> None:
    # the system's trusted CAs, then a CA that did not sign the node's certificate
    for connector in (aiohttp.TCPConnector(), aiohttp.TCPConnector(ssl=trusting(pki.other_ca))):
        async with aiohttp.ClientSession(connector=connector) as s:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(tls_node.url + "/healthz"):
                    pass


# ---- schedctl ----------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SCHEDD_SERVER", "SCHEDD_TOKEN", "SCHEDD_CACERT")
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


async def run_tool(
    module: str,
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """A CLI in a subprocess (so this event loop keeps serving the node meanwhile)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=cwd,
        env=env or _env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def schedctl(
    node: Node, *args: str, cwd: Path, env: dict[str, str] | None = None, server: str | None = None
) -> tuple[int, str, str]:
    return await run_tool(
        "schedd.cli.schedctl",
        "--server",
        server or node.url,
        "--token",
        node.token,
        "--timeout",
        "5",
        *args,
        cwd=cwd,
        env=env,
    )


async def test_schedctl_trusts_the_ca_from_cacert_or_env(
    tls_node: Node, pki: Pki, tmp_path: Path
) -> None:
    code, out, err = await schedctl(
        tls_node, "--cacert", str(pki.ca), "-o", "json", "cluster", cwd=tmp_path
    )
    assert (code, err) == (0, ""), err
    assert orjson.loads(out)["nodes"][0]["http"] == tls_node.url
    code, out, err = await schedctl(
        tls_node,
        "-o",
        "json",
        "submit",
        "tls.nothing",
        cwd=tmp_path,
        env=_env(SCHEDD_CACERT=str(pki.ca)),
    )
    # no worker runs the task: the submit says so, and that is all it says on stderr
    assert code == 0 and err == (
        "schedctl: warning: no worker is connected: task 'tls.nothing' on queue 'default' "
        "waits for one\n"
    ), err
    assert orjson.loads(out)["task"] == "tls.nothing"
    # a worker's wss:// URL names the same node
    wss = tls_node.url.replace("https://", "wss://")
    code, out, err = await schedctl(
        tls_node, "--cacert", str(pki.ca), "list", cwd=tmp_path, server=wss
    )
    assert (code, err) == (0, "") and "tls.nothing" in out, err


@pytest.mark.parametrize("trust", ["system", "other CA"])
async def test_schedctl_without_the_ca_says_so(
    tls_node: Node, pki: Pki, tmp_path: Path, trust: str
) -> None:
    extra = () if trust == "system" else ("--cacert", str(pki.other_ca))
    code, out, err = await schedctl(tls_node, *extra, "cluster", cwd=tmp_path)
    assert code == 4 and out == ""
    assert err.startswith(f"schedctl: cannot reach {tls_node.url}: TLS certificate not trusted ")
    assert "--cacert" in err and "SCHEDD_CACERT" in err
    assert "Traceback" not in err and err.count("\n") == 1


async def test_schedctl_plain_http_to_the_tls_port(tls_node: Node, tmp_path: Path) -> None:
    plain = tls_node.url.replace("https://", "http://")
    code, out, err = await schedctl(tls_node, "cluster", cwd=tmp_path, server=plain)
    assert code == 4 and out == ""
    assert "use an https:// URL" in err and "Traceback" not in err


async def test_schedctl_bad_cacert_is_a_usage_error(
    tls_node: Node, pki: Pki, tmp_path: Path
) -> None:
    code, _, err = await schedctl(
        tls_node, "--cacert", str(tmp_path / "nope.pem"), "cluster", cwd=tmp_path
    )
    assert (
        code == 2 and err.startswith("schedctl: --cacert: file ") and "nope.pem' not found" in err
    )
    code, _, err = await schedctl(
        tls_node, "cluster", cwd=tmp_path, env=_env(SCHEDD_CACERT=str(pki.key))
    )
    assert code == 2 and err.startswith("schedctl: SCHEDD_CACERT: ") and "no PEM certificate" in err


# ---- workers over wss --------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["https", "wss"])
async def test_sdk_worker_over_wss_leases_and_completes(
    tls_node: Node, pki: Pki, https: aiohttp.ClientSession, scheme: str
) -> None:
    registry = Registry()

    @registry.task("tls.echo")
    async def echo(ctx: Context, payload: Any) -> Any:
        return {"echo": payload, "fence": ctx.fence}

    url = tls_node.url.replace("https://", f"{scheme}://")
    worker = Worker(
        [url], token=tls_node.token, registry=registry, cafile=pki.ca, drain_timeout=2.0
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        await wait_for(lambda: worker.connected, timeout=10)
        job = await submit(https, tls_node, {"task": "tls.echo", "payload": {"n": 1}})
        await wait_for(lambda: succeeded(https, tls_node, job["id"]), timeout=15)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)


async def test_sdk_worker_without_the_ca_logs_why_and_never_connects(
    tls_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="schedd.worker.client")
    worker = Worker([tls_node.url], token=tls_node.token, registry=Registry(), drain_timeout=1.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        await wait_for(lambda: "TLS certificate refused" in caplog.text, timeout=10)
        assert not worker.connected
        assert "cafile" in caplog.text and "--cacert" in caplog.text
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)


def test_sdk_refuses_a_bad_cafile(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cafile: file '.*nope\.pem' not found"):
        Worker("https://127.0.0.1:1", cafile=tmp_path / "nope.pem")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        Worker("https://127.0.0.1:1", cafile=pki.key)
    with pytest.raises(ValueError, match="one or the other"):
        Worker("https://127.0.0.1:1", cafile=pki.ca, ssl_context=trusting(pki.ca))


async def test_schedd_worker_cli_with_cacert_completes_a_job(
    tls_node: Node, pki: Pki, https: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "schedd.cli.worker",
            "--server",
            tls_node.url,
            "--token",
            tls_node.token,
            "--import",
            "schedd.worker.demo_tasks",
            "--drain-timeout",
            "2",
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=_env(SCHEDD_CACERT=str(pki.ca)),
        )
    try:
        job = await submit(https, tls_node, {"task": "demo.echo", "payload": {"tls": True}})
        await wait_for(lambda: succeeded(https, tls_node, job["id"]), timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, log.read_text()
    assert "connect_failed" not in log.read_text()


async def test_schedd_worker_cli_bad_cacert_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = await run_tool(
        "schedd.cli.worker",
        "--server",
        "https://127.0.0.1:1",
        "--cacert",
        str(tmp_path / "nope.pem"),
        cwd=tmp_path,
    )
    assert code == 2 and "--cacert: file " in err and "nope.pem' not found" in err


# ---- a cluster over https ----------------------------------------------------------------------


async def test_cluster_forwarding_and_worker_redirects_over_https(
    pki: Pki, tmp_path: Path, https: aiohttp.ClientSession
) -> None:
    nodes = await start_tls_nodes(pki, tmp_path, size=3, **{"http.tls_ca": str(pki.ca)})
    try:

        def settled() -> Node | None:
            # one ready leader every other node names (a first election can be followed by a
            # second one right after the start, so the first leader seen may not be the one)
            ready = [n for n in nodes if n.rt.leader is not None and n.rt.leader.ready.is_set()]
            if len(ready) != 1:
                return None
            lead = ready[0]
            return (
                lead if all(n.rt.leader_url() == lead.url for n in nodes if n is not lead) else None
            )

        leader = await wait_for(settled, timeout=20)
        followers = [n for n in nodes if n is not leader]
        # GET /workers on a follower is answered by the leader, over https, trusting http.tls_ca
        for f in followers:
            async with https.get(f.url + API + "/workers", headers=f.headers()) as r:
                assert r.status == 200, await r.text()
        # a worker that knows only a follower is redirected to the leader's https URL (wss)
        registry = Registry()

        @registry.task("tls.cluster")
        async def handler(ctx: Context, payload: Any) -> Any:
            return payload

        worker = Worker(
            [followers[0].url],
            token=leader.token,
            registry=registry,
            cafile=pki.ca,
            drain_timeout=2.0,
        )
        stop = asyncio.Event()
        runner = asyncio.create_task(worker.serve(stop))
        try:
            await wait_for(lambda: worker.connected, timeout=15)
            assert worker.node_id == leader.rt.config.node.id
            job = await submit(https, followers[1], {"task": "tls.cluster", "payload": [1]})
            await wait_for(lambda: succeeded(https, leader, job["id"]), timeout=15)
        finally:
            stop.set()
            await asyncio.wait_for(runner, 15)
        # without the CA (the system's trusted CAs) a follower says what to set
        followers[0].rt.proxy.ssl = True
        async with https.get(
            followers[0].url + API + "/workers", headers=followers[0].headers()
        ) as r:
            assert r.status == 503
            message = (await r.json())["error"]["message"]
        assert "TLS certificate was refused" in message and "http.tls_ca" in message
    finally:
        await asyncio.gather(*(n.rt.stop() for n in nodes))


# ---- bad TLS settings are refused, naming the key ----------------------------------------------


def _check_config(tmp_path: Path, http: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    cfg = tmp_path / "schedd.toml"
    cfg.write_text(f'[node]\ndata_dir = "{tmp_path / "data"}"\n[http]\n{http}')
    code = daemon.main(["--config", str(cfg), "--check-config"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _toml_pki(pki: Pki, tmp_path: Path, case: str) -> tuple[str, str]:
    """(the [http] lines, the problem expected) for one bad TLS setting."""
    cert, key = f'tls_cert = "{pki.cert}"\n', f'tls_key = "{pki.key}"\n'
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = {
        "cert without key": (cert, "http.tls_key: required when the other of"),
        "key without cert": (key, "http.tls_cert: required when the other of"),
        "missing key": (
            cert + f'tls_key = "{tmp_path / "nope.key"}"\n',
            f'http.tls_key: file "{tmp_path / "nope.key"}" not found',
        ),
        "key is a directory": (
            cert + f'tls_key = "{tmp_path}"\n',
            f'http.tls_key: "{tmp_path}" is a directory',
        ),
        "cert is not PEM": (
            f'tls_cert = "{garbage}"\n' + key,
            f'http.tls_cert: "{garbage}" holds no PEM certificate',
        ),
        "key is not PEM": (
            cert + f'tls_key = "{garbage}"\n',
            f'http.tls_key: "{garbage}" holds no PEM private key',
        ),
        "key of another cert": (
            cert + f'tls_key = "{pki.other_key}"\n',
            f'http.tls_key: "{pki.other_key}" is not the private key of the '
            f"certificate in http.tls_cert",
        ),
        "missing ca": (
            cert + key + f'tls_ca = "{tmp_path / "nope.pem"}"\n',
            f'http.tls_ca: file "{tmp_path / "nope.pem"}" not found',
        ),
        "ca is not PEM": (
            cert + key + f'tls_ca = "{pki.key}"\n',
            f'http.tls_ca: "{pki.key}" holds no PEM certificate',
        ),
    }
    return cases[case]


@pytest.mark.parametrize(
    "case",
    [
        "cert without key",
        "key without cert",
        "missing key",
        "key is a directory",
        "cert is not PEM",
        "key is not PEM",
        "key of another cert",
        "missing ca",
        "ca is not PEM",
    ],
)
def test_bad_tls_settings_are_refused_naming_the_key(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    http, problem = _toml_pki(pki, tmp_path, case)
    code, out = _check_config(tmp_path, http, capsys)
    assert code == 2, out
    assert f"schedd: config: {problem}" in out, out
    assert out.count("schedd: config: ") == 1, out


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_key_is_refused(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "server.key"
    key.write_bytes(pki.key.read_bytes())
    key.chmod(0)
    code, out = _check_config(tmp_path, f'tls_cert = "{pki.cert}"\ntls_key = "{key}"\n', capsys)
    assert code == 2 and f'http.tls_key: "{key}" cannot be read: Permission denied' in out, out


def test_good_tls_settings_pass_check_config(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    http = f'tls_cert = "{pki.cert}"\ntls_key = "{pki.key}"\ntls_ca = "{pki.ca}"\n'
    assert _check_config(tmp_path, http, capsys) == (0, "config ok\n")


def test_the_runtime_refuses_an_unusable_key_without_check_files(pki: Pki, tmp_path: Path) -> None:
    from schedd.runtime import Runtime

    cfg = load_config(
        None,
        env={},
        overrides={**tls_overrides(pki, tmp_path, free_port()), "http.tls_key": str(pki.other_key)},
    )
    ensure_admin_token(cfg.tokens_path)
    with pytest.raises(ConfigError) as info:
        Runtime(cfg)
    assert info.value.problems == [
        f'http.tls_key: "{pki.other_key}" is not the private key of the certificate in '
        f'http.tls_cert ("{pki.cert}")'
    ]
