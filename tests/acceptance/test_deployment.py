"""The README's "A real three-node cluster", done the way an operator does it, as literally as a
test can: this tree's wheel installed into a fresh venv by the README's own commands (step 1),
``scripts/make-secrets`` (step 2), the README's ``schedd.toml`` on three hosts (step 3), each
node started by the ``ExecStart`` of ``systemd/schedd.service`` as an unprivileged user, with a
notify socket (step 4), a worker started as ``systemd/schedd-worker@.service`` would start it
from the env file of step 5 -- then jobs through ``schedctl`` and the leader SIGKILLed while
runs are in flight.  Every acknowledged job must succeed, every run must execute exactly once.

The "VMs" are network namespaces on one bridge (tests/acceptance/netns.py): each node has its
own address and the README's ports 7700 and 7701; the worker has a fourth namespace; schedctl
runs in the root namespace, which has an address on the bridge too.  Nothing comes from the
developer's .venv or this checkout at run time: every process runs the fresh venv's entry points
with a clean environment (no PYTHONPATH) and cwd ``/``, as systemd starts them.  The README,
the units and make-secrets are read from this checkout; :data:`WHEEL_SOURCE` is what is built.

systemd does not run here; what its units ask for is emulated:
  * ``User=schedd`` / ``DynamicUser=yes``: ``setpriv`` to uid/gid 65534 (nobody) without groups,
    with the unit's ``NoNewPrivileges=yes`` and empty ``CapabilityBoundingSet=``.  Step 1's
    ``useradd`` is not run (the host keeps its users).
  * ``StateDirectory=schedd`` + ``StateDirectoryMode=0700``: the data dir is 0700, owned by the
    service user.  ``ConfigurationDirectory=schedd``: systemd creates a missing one 0755 owned by
    root and leaves an existing one as it is (so make-secrets' choice on the first VM stands).
  * ``Type=notify``: a datagram socket per node in ``NOTIFY_SOCKET``; the test waits for
    ``READY=1`` from each (no sleeping); ``WATCHDOG_USEC`` from ``WatchdogSec=``.
  * ``JOURNAL_STREAM`` IS set, to the log file's device:inode as systemd sets it to the
    journal stream's, so the nodes log JSON lines as they do under systemd.
  * ``EnvironmentFile=`` and ExecStart's ``%H``, ``%i`` and ``$WORKER_ARGS`` (a whole word,
    split on whitespace) for the worker.
  * ``ProtectSystem=strict``: each node runs in its own mount namespace in which every file
    system is read-only but its data dir (``StateDirectory=``), so a write anywhere else fails.
  * ``MemoryDenyWriteExecute=yes``: the kernel's equivalent per process, ``PR_SET_MDWE``
    (Linux >= 6.3; noted and skipped on an older kernel).
  * Not emulated: ``Restart=`` (the killed leader must stay dead), ``PrivateTmp=`` (the test's
    /opt lives in /tmp), the other sandboxing options, ``LimitNOFILE=``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.netns import ROOT_HOST, Lab
from tests.cluster.harness import _votes

REPO = Path(__file__).resolve().parents[2]
#: the tree whose wheel is deployed
WHEEL_SOURCE = REPO
SERVICE_UID = 65534  # nobody: stands in for User=schedd and for the worker's DynamicUser=
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd's default
README_PREFIX, README_ETC, README_STATE = "/opt/schedd", "/etc/schedd", "/var/lib/schedd"
NODES = (1, 2, 3)  # host numbers: 10.0.0.N in the README
WORKER_HOST = 10
WORKER_INSTANCE = "deploy"  # schedd-worker@deploy
TASK_MODULE = "deploy_tasks"
JOBS_BEFORE = JOBS_AFTER = 10
HANDLER_SLEEP_S = 3.0  # longer than a failover: the first batch runs on across it
# Shorter than the handlers and than the cluster's scheduler.heartbeat_interval (5s: the README's
# schedd.toml sets none): the lease asks the worker for a heartbeat every second, and a lease held
# on the killed leader is recovered quickly.
HEARTBEAT_TIMEOUT = "3s"

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: network namespaces, a bridge, setpriv to uid 65534"
    ),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's `ip`"),
]

TASKS_SOURCE = '''\
"""The operator's own task package (written into the schedd venv by the deployment test)."""

import asyncio

import schedd.worker

RECORD = {record!r}


@schedd.worker.task("deploy.record")
async def record(ctx, payload):
    # One line per execution, written as the handler starts, so a second start shows.
    with open(RECORD, "a", encoding="utf-8") as fh:
        fh.write(f"{{ctx.run_id}} {{ctx.fence}} {{ctx.attempt}}\\n")
    await asyncio.sleep(float((payload or {{}}).get("sleep", 0)))
    return {{"run_id": ctx.run_id}}
'''


# -- what the repository says --------------------------------------------------------------------
def readme_step(n: int) -> str:
    """Step ``n`` of the README's "A real three-node cluster"."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## A real three-node cluster\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "README.md has no '## A real three-node cluster' section"
    step = re.search(rf"^{n}\. (.*?)(?=^\d+\. |\Z)", section.group(1), re.M | re.S)
    assert step, f"README step {n} not found"
    return step.group(1)


def unit_value(unit: str, key: str) -> str:
    values = [
        line.split("=", 1)[1].strip()
        for line in (REPO / "systemd" / unit).read_text().splitlines()
        if line.startswith(f"{key}=")
    ]
    assert len(values) == 1, f"{unit}: expected one {key}=, found {values}"
    return values[0]


def parse_environment_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile=: KEY=VALUE lines, '#'/';' comments, one level of quotes."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def expand_exec(line: str, specifiers: dict[str, str], env: dict[str, str]) -> list[str]:
    """systemd's ExecStart= expansion: words, %-specifiers, ``$VAR`` as a whole word split on
    whitespace, ``${VAR}`` within a word."""
    words: list[str] = []
    for word in shlex.split(line):
        word = re.sub(r"%(.)", lambda m: "%" if m.group(1) == "%" else specifiers[m.group(1)], word)
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            words += env.get(whole.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def readme_addresses(text: str, mapping: dict[int, str]) -> str:
    """Replace the README's 10.0.0.N by ``mapping[N]``."""
    return re.sub(r"\b10\.0\.0\.(\d+)\b", lambda m: mapping[int(m.group(1))], text)


# -- processes -----------------------------------------------------------------------------------
def clean_env(**extra: str) -> dict[str, str]:
    return {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", **extra}


def as_service_user(argv: list[str], ns: str | None = None) -> list[str]:
    user = [
        "setpriv",
        f"--reuid={SERVICE_UID}",
        f"--regid={SERVICE_UID}",
        "--clear-groups",
        "--no-new-privs",
        "--bounding-set=-all",
        *argv,
    ]
    return user if ns is None else ["ip", "netns", "exec", ns, *user]


def system_python() -> str:
    """The machine's python3 (>= 3.11, with venv) that the service user can run: a venv's
    interpreter links to it, and e.g. a pyenv under /root is out of uid 65534's reach."""
    tried: list[str] = []
    for cand in (
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        shutil.which("python3"),
        shutil.which("python3.13"),
        shutil.which("python3.12"),
        shutil.which("python3.11"),
    ):
        if not cand or cand in tried:
            continue
        tried.append(cand)
        probe = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))"
        if (
            subprocess.run(
                as_service_user([cand, "-c", probe]),
                capture_output=True,
                env=clean_env(),
                cwd="/",
                timeout=30,
            ).returncode
            == 0
        ):
            return cand
    raise AssertionError(f"no python3 >= 3.11 with venv that uid {SERVICE_UID} can run: {tried}")


# ProtectSystem=strict with StateDirectory=: in a private mount namespace, the data dir ($1)
# stays writable and everything else becomes read-only, then the rest of the command line runs.
PROTECT_SYSTEM = 'mount --bind "$1" "$1" && mount -o remount,bind,ro / && shift && exec "$@"'
# MemoryDenyWriteExecute=yes: PR_SET_MDWE (65) with PR_MDWE_REFUSE_EXEC_GAIN (1), kept across
# fork and execve, then the rest of the command line.
DENY_WRITE_EXECUTE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    print(f"PR_SET_MDWE not applied (errno {ctypes.get_errno()}): kernel older than 6.3?",
          file=sys.stderr)
os.execvp(sys.argv[1], sys.argv[1:])
"""


def sandboxed(argv: list[str], data: Path) -> list[str]:
    """``argv`` under the node unit's ProtectSystem=strict and MemoryDenyWriteExecute=yes."""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        PROTECT_SYSTEM,
        "sh",
        str(data),
        sys.executable,
        "-c",
        DENY_WRITE_EXECUTE,
        *argv,
    ]


def check_run(argv: list[str], what: str, timeout: float, **kw: Any) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    assert out.returncode == 0, (
        f"{what}: {shlex.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    )
    return str(out.stdout)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, by PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines)}


@dataclass
class Node:
    name: str
    ns: str
    addr: str
    etc: Path
    data: Path
    log: Path
    notify: socket.socket
    proc: subprocess.Popen[bytes] | None = None
    notified: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:7700"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Deployment:
    root: Path
    lab: Lab
    started: float = field(default_factory=time.monotonic)
    prefix: Path = Path(README_PREFIX)
    tokens: dict[str, str] = field(default_factory=dict)  # role -> secret
    nodes: list[Node] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs_: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: ``[cluster] shards`` added to the README's schedd.toml (1: the file as it is)
    shards: int = 1

    def vm(self, name: str, path: str) -> Path:
        """``path`` (e.g. /etc/schedd) on the VM ``name``."""
        return self.root / "vm" / name / path.lstrip("/")

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic() - self.started:6.1f}s {text}")

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.root / "log" / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
            )
        self.procs.append(proc)
        self.logs_[name] = log
        return proc

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The nodes' JSON log events (JOURNAL_STREAM is set, so they log JSON lines)."""
        for n in self.nodes:
            for line in n.log.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    yield n.name, json.loads(line)

    def logs(self) -> str:
        out = ["==== notes", *self.notes]
        out += [f"==== {n.name} notify: {n.notified}" for n in self.nodes]
        for name, path in self.logs_.items():
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            out.append(f"==== {name}.log\n{text[-6000:]}")
        return "\n".join(out)


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    """A scratch root the service user can traverse (pytest's tmp_path is 0700 root) and a lab
    network; at the end every process is stopped by PID, every namespace and link removed."""
    root = Path(tempfile.mkdtemp(prefix="schedd-deploy-", dir="/tmp"))
    root.chmod(0o755)
    (root / "log").mkdir()
    problems: list[str] = []
    try:
        with Lab() as lab:
            dep = Deployment(root, lab)
            try:
                yield dep
            finally:
                for p in dep.procs:
                    with contextlib.suppress(Exception):
                        stop(p)
                for n in dep.nodes:
                    n.notify.close()
                problems += lab.close()
        problems += [f"left behind: {name}" for name in lab.leftovers()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert not problems, problems


# -- the API and the CLI, as the test uses them ----------------------------------------------------
def api(url: str, path: str, token: str, timeout: float = 2.0) -> Any:
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_leader(
    dep: Deployment, timeout: float, exclude: Node | None = None
) -> tuple[Node, dict[str, Any]]:
    """The node that reports itself leader with its claim applied (``leader`` is its own id),
    and its ``GET /api/v1/cluster``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in dep.nodes:
            if n is exclude or not n.alive:
                continue
            view = api(n.url, "/api/v1/cluster", dep.tokens["submit"])
            if view and view["role"] == "leader" and view["leader"] == n.name:
                return n, view
        time.sleep(0.05)
    raise AssertionError(f"no leader within {timeout}s")


def wait_formed(dep: Deployment, timeout: float) -> tuple[Node, dict[str, Any]]:
    """:func:`wait_leader`, once every live node names that leader and votes (a node that first
    heard from a follower abstains until it has caught up with the leader: a leader killed
    before that leaves no majority to elect another)."""
    deadline = time.monotonic() + timeout
    while True:
        leader, view = wait_leader(dep, max(0.1, deadline - time.monotonic()))
        views = [api(n.url, "/api/v1/cluster", dep.tokens["submit"]) for n in dep.nodes if n.alive]
        if all(v and v["leader"] == leader.name and _votes(v) for v in views):
            return leader, view
        assert time.monotonic() < deadline, f"not every node votes under {leader.name}: {views}"
        time.sleep(0.05)


def schedctl(dep: Deployment, servers: list[str], *args: str) -> list[str]:
    argv = [str(dep.prefix / "bin" / "schedctl"), "--token", dep.tokens["submit"], "-o", "json"]
    for url in servers:
        argv += ["--server", url]
    return argv + list(args)


def run_all(argvs: list[list[str]], timeout: float = 90) -> list[Any]:
    """Run the commands at once (from the root namespace); each must exit 0; their JSON."""
    procs = [
        subprocess.Popen(
            a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), cwd="/"
        )
        for a in argvs
    ]
    results = []
    deadline = time.monotonic() + timeout
    try:
        for argv, p in zip(argvs, procs, strict=True):
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, (
                f"schedctl {shlex.join(argv[5:])} exited {p.returncode}: {stderr.decode()}"
            )
            results.append(json.loads(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    return results


# -- the operator's steps ------------------------------------------------------------------------
def install(dep: Deployment, record: Path) -> None:
    """Step 1: the wheel of WHEEL_SOURCE, installed by the README's commands into a fresh venv
    made by the system python; then the operator's task module beside it."""
    python = system_python()
    src = dep.root / "build" / "src"
    junk = {".git", ".venv", "build", "dist", ".schedd", ".cluster", ".demo", "bench-results"}
    shutil.copytree(
        WHEEL_SOURCE,
        src,
        ignore=lambda d, names: {  # never a stale build/ tree
            n
            for n in names
            if n == "__pycache__"
            or n.endswith((".egg-info", "_cache"))
            or (Path(d) == WHEEL_SOURCE and n in junk)
        },
    )
    wheels = dep.root / "build" / "wheels"
    pip_env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    check_run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
        "building the wheel",
        180,
        env=pip_env,
    )
    (wheel,) = wheels.glob("schedd-*.whl")
    with zipfile.ZipFile(wheel) as built:  # typed (py.typed) and with the client library
        names = set(built.namelist())
    assert {"schedd/py.typed", "schedd/client/aio.py", "schedd/client/sync.py"} <= names
    dep.prefix = dep.root / "opt" / "schedd"
    commands = next(code for code in re.findall(r"`([^`]+)`", readme_step(1)) if "-m venv" in code)
    for command in commands.split("&&"):
        argv = [
            python
            if w == "python3"
            else w.replace(README_PREFIX, str(dep.prefix)).replace("/path/to/schedd", str(wheel))
            for w in shlex.split(command)
        ]
        check_run(argv, "README step 1", 240, env=pip_env, cwd="/")
    py = str(dep.prefix / "bin" / "python")
    where, no_tests, purelib = check_run(
        [
            py,
            "-c",
            "import importlib.util as u, sysconfig, schedd; print(schedd.__file__, "
            "u.find_spec('pytest') is None, sysconfig.get_paths()['purelib'])",
        ],
        "import schedd from the venv",
        60,
        env=clean_env(),
        cwd="/",
    ).split()
    assert where.startswith(f"{dep.prefix}/") and no_tests == "True", (where, no_tests)
    (Path(purelib) / f"{TASK_MODULE}.py").write_text(TASKS_SOURCE.format(record=str(record)))
    dep.note(f"installed {wheel.name} with {python} into {dep.prefix}")


def make_secrets(dep: Deployment) -> None:
    """Step 2: scripts/make-secrets into the first VM's /etc/schedd (not there yet), the two
    files copied to the other VMs and owned by the service user everywhere."""
    first = dep.vm("n1", README_ETC)
    first.parent.mkdir(parents=True)
    check_run(
        [str(REPO / "scripts" / "make-secrets"), str(first)],
        "make-secrets",
        60,
        env=clean_env(),
        cwd="/",
    )
    dep.tokens = {
        t["role"]: t["secret"] for t in tomllib.loads((first / "tokens.toml").read_text())["token"]
    }
    for k in NODES:
        etc = dep.vm(f"n{k}", README_ETC)
        if k != 1:
            etc.mkdir(parents=True, mode=0o755)  # as ConfigurationDirectory= makes it
            for name in ("raft.key", "tokens.toml"):
                shutil.copy2(first / name, etc / name)
        for name in ("raft.key", "tokens.toml"):
            os.chown(etc / name, SERVICE_UID, SERVICE_UID)
            assert (etc / name).stat().st_mode & 0o777 == 0o600


def configure_nodes(dep: Deployment) -> None:
    """Step 3: the README's schedd.toml on each node VM.  It is n1's (10.0.0.1, peers .2 and
    .3): on VM k, 10.0.0.1 becomes k's own address and .2, .3 the two others'."""
    block = re.search(r"```toml\n(.*?)```", readme_step(3), re.S)
    assert block, "README step 3 has no ```toml block"
    template = textwrap.dedent(block.group(1))
    run_dir = dep.root / "run"
    run_dir.mkdir(mode=0o755)
    for k in NODES:
        others = [j for j in NODES if j != k]
        seen_from_k = {1: dep.lab.addr(k), 2: dep.lab.addr(others[0]), 3: dep.lab.addr(others[1])}
        etc, data = dep.vm(f"n{k}", README_ETC), dep.vm(f"n{k}", README_STATE)
        text = (
            readme_addresses(template, seen_from_k)
            .replace('"n1"', f'"n{k}"')
            .replace(README_STATE, str(data))
            .replace(README_ETC, str(etc))
        )
        if dep.shards > 1:  # what docs/operations.md tells an operator to add for shards
            text = text.replace("[cluster]", f"[cluster]\nshards = {dep.shards}", 1)
            if "[cluster]" not in text:
                text += f"\n[cluster]\nshards = {dep.shards}\n"
        cfg = tomllib.loads(text)
        assert cfg.get("cluster", {}).get("shards", 1) == dep.shards, text
        assert (cfg["node"]["id"], cfg["http"]["listen"]) == (f"n{k}", f"{dep.lab.addr(k)}:7700")
        assert sorted(cfg["raft"]["peers"]) == sorted(f"{dep.lab.addr(j)}:7701" for j in others)
        (etc / "schedd.toml").write_text(text)
        (etc / "schedd.toml").chmod(0o644)
        data.mkdir(parents=True)  # StateDirectory=schedd, StateDirectoryMode=0700
        data.chmod(0o700)
        os.chown(data, SERVICE_UID, SERVICE_UID)
        ns = dep.lab.add_host(f"n{k}", k)
        # README step 3: "sudo -u schedd /opt/schedd/bin/schedd --config … --check-config"
        check = re.search(r"`sudo -u schedd ([^`]*--check-config)`", readme_step(3))
        assert check, "README step 3: the --check-config command run as the service user"
        argv = shlex.split(
            check.group(1).replace(README_PREFIX, str(dep.prefix)).replace(README_ETC, str(etc))
        )
        out = check_run(
            as_service_user(argv, ns),
            "README step 3 --check-config",
            60,
            env=clean_env(),
            cwd="/",
        )
        assert "config ok" in out, out
        path = run_dir / f"notify-n{k}.sock"
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(path))
        path.chmod(0o777)  # as /run/systemd/notify: the service user may send
        dep.nodes.append(
            Node(f"n{k}", ns, dep.lab.addr(k), etc, data, dep.root / "log" / f"n{k}.log", notify)
        )


def start_nodes(dep: Deployment) -> None:
    """Step 4: each node by the unit's ExecStart, in its namespace, as the service user; then
    Type=notify: READY=1 from every node, or the log of each node that exited first."""
    exec_start = unit_value("schedd.service", "ExecStart")
    watchdog_usec = int(unit_value("schedd.service", "WatchdogSec")) * 1_000_000
    for n in dep.nodes:
        argv = shlex.split(
            exec_start.replace(README_PREFIX, str(dep.prefix)).replace(README_ETC, str(n.etc))
        )
        n.log.touch()
        st = n.log.stat()
        env = clean_env(
            HOME=str(n.data),
            USER="schedd",
            LOGNAME="schedd",  # useradd --home /var/lib/schedd
            NOTIFY_SOCKET=n.notify.getsockname(),
            WATCHDOG_USEC=str(watchdog_usec),
            JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}",
            INVOCATION_ID=os.urandom(16).hex(),
            STATE_DIRECTORY=str(n.data),
            CONFIGURATION_DIRECTORY=str(n.etc),
        )
        n.proc = dep.spawn(
            n.name, ["ip", "netns", "exec", n.ns, *sandboxed(as_service_user(argv), n.data)], env
        )
    deadline = time.monotonic() + 60
    pending = {n.notify: n for n in dep.nodes}
    while pending:
        exited = [n for n in pending.values() if not n.alive]
        assert not exited, "\n".join(
            f"{n.name} exited with {n.proc and n.proc.returncode} before READY=1:\n"
            + n.log.read_text(errors="replace")[-3000:]
            for n in exited
        )
        left = deadline - time.monotonic()
        assert left > 0, f"no READY=1 within 60s from {sorted(n.name for n in pending.values())}"
        # poll, not select: the test process may hold more than 1024 descriptors by now
        poller = select.poll()
        by_fd = {sock.fileno(): sock for sock in pending}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(min(0.5, left) * 1000):
            sock = by_fd[fd]
            node = pending[sock]
            node.notified.append(sock.recv(4096).decode())
            if "READY=1" in node.notified[-1].splitlines():
                del pending[sock]
    for n in dep.nodes:
        assert n.proc is not None
        status = proc_status(n.proc.pid)  # the PID is schedd's own (ip and setpriv exec it)
        assert status["Uid"].split() == [str(SERVICE_UID)] * 4, status["Uid"]
        assert status["NoNewPrivs"] == "1" and int(status["CapEff"], 16) == 0, status
        mounts = {
            f[1]: f[3].split(",")
            for f in (
                ln.split() for ln in Path(f"/proc/{n.proc.pid}/mounts").read_text().splitlines()
            )
        }
        assert "ro" in mounts["/"] and "rw" in mounts[str(n.data)], "ProtectSystem=strict"
        assert str(dep.prefix / "bin" / "schedd").encode() in Path(
            f"/proc/{n.proc.pid}/cmdline"
        ).read_bytes().split(b"\0")
    dep.note("READY=1 from every node")


def start_worker(dep: Deployment) -> tuple[subprocess.Popen[bytes], str]:
    """Step 5: the env file of the README, and the worker unit's ExecStart expanded as systemd
    does, run from a fourth VM as the service user.  Returns the process and the worker id."""
    lines = [
        readme_addresses(line, {k: dep.lab.addr(k) for k in NODES})
        .replace("<worker token>", dep.tokens["worker"])
        .replace("my.tasks", TASK_MODULE)
        for line in re.findall(
            r"`((?:SCHEDD_SERVER|SCHEDD_TOKEN|WORKER_ARGS)=[^`]*)`", readme_step(5)
        )
    ]
    assert len(lines) == 3, f"README step 5: SCHEDD_SERVER, SCHEDD_TOKEN, WORKER_ARGS? {lines}"
    env_file = Path(
        unit_value("schedd-worker@.service", "EnvironmentFile")
        .replace("%i", WORKER_INSTANCE)
        .replace(README_ETC, str(dep.vm("w", README_ETC)))
    )
    env_file.parent.mkdir(parents=True)
    env_file.write_text("\n".join(lines) + "\n")
    env_file.chmod(0o600)  # systemd (root) reads it, the worker does not
    env = parse_environment_file(env_file.read_text())
    assert env["SCHEDD_SERVER"] == ",".join(n.url for n in dep.nodes), env
    hostname = socket.gethostname()
    argv = expand_exec(
        unit_value("schedd-worker@.service", "ExecStart").replace(README_PREFIX, str(dep.prefix)),
        {"H": hostname, "i": WORKER_INSTANCE},
        env,
    )
    worker_id = f"{hostname}-{WORKER_INSTANCE}"
    assert argv[1:] == ["--worker-id", worker_id, "--import", TASK_MODULE, "--concurrency", "16"]
    log = dep.root / "log" / "worker.log"
    log.touch()
    st = log.stat()
    proc = dep.spawn(
        "worker",
        as_service_user(argv, dep.lab.add_host("w", WORKER_HOST)),
        clean_env(
            **env, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}", INVOCATION_ID=os.urandom(16).hex()
        ),
    )
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"the worker exited with {proc.returncode}"
        leader, _ = wait_leader(dep, timeout=30)
        workers = api(leader.url, "/api/v1/workers", dep.tokens["submit"]) or {"workers": []}
        if any(w["worker_id"] == worker_id for w in workers["workers"]):
            break
        assert time.monotonic() < deadline, f"worker {worker_id} never connected: {workers}"
        time.sleep(0.1)
    dep.note(f"worker {worker_id} connected")
    return proc, worker_id


# -- the test ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shards", [pytest.param(1, id="1"), pytest.param(3, marks=pytest.mark.long, id="shards3")]
)
def test_readme_deployment_survives_a_killed_leader(deployment: Deployment, shards: int) -> None:
    """With three shards (``[cluster] shards = 3`` added to the README's file), each node runs a
    process per shard under its supervisor: the node killed is the one leading shard 0, which
    kills the shard processes with it (a leader of one or more shards)."""
    dep = deployment
    dep.shards = shards
    try:
        _deploy_and_run(dep)
    except BaseException:
        print(dep.logs())
        raise


def _deploy_and_run(dep: Deployment) -> None:
    record = dep.root / "work" / "executions.txt"
    record.parent.mkdir()
    record.touch()
    for path in (record.parent, record):
        os.chown(path, SERVICE_UID, SERVICE_UID)
    install(dep, record)
    make_secrets(dep)
    dep.note(f"lab {dep.lab.subnet} on bridge {dep.lab.bridge}; the test is .{ROOT_HOST}")
    configure_nodes(dep)
    start_nodes(dep)

    # README step 4: `schedctl --server http://10.0.0.1:7700 --token … cluster` shows the leader
    # (asked of the leader; asked again if leadership moved in between, as it may on a busy host),
    # once every node votes: the leader is killed later.
    deadline = time.monotonic() + 60
    while True:
        leader, _ = wait_formed(dep, timeout=60)
        (view,) = run_all([schedctl(dep, [leader.url], "cluster")])
        if view["role"] == "leader" and view["leader"] == leader.name:
            break
        assert time.monotonic() < deadline, f"schedctl cluster never showed a stable leader: {view}"
    assert view["has_quorum"], view
    assert sorted(n["raft"] for n in view["nodes"]) == sorted(f"{n.addr}:7701" for n in dep.nodes)

    worker, worker_id = start_worker(dep)
    urls = [n.url for n in dep.nodes]

    def submit(servers: list[str], sleep: float, count: int) -> list[str]:
        args = [
            "submit",
            "deploy.record",
            "--payload",
            json.dumps({"sleep": sleep}),
            "--heartbeat-timeout",
            HEARTBEAT_TIMEOUT,
        ]
        return [job["id"] for job in run_all([schedctl(dep, servers, *args)] * count)]

    # The first batch; once every one of its runs has started, SIGKILL to the leader of the moment.
    acked = submit(urls, HANDLER_SLEEP_S, JOBS_BEFORE)
    deadline = time.monotonic() + 30
    while len(record.read_text().splitlines()) < JOBS_BEFORE:
        assert time.monotonic() < deadline, f"not all {JOBS_BEFORE} runs started within 30s"
        time.sleep(0.02)
    leader, view = wait_leader(dep, timeout=30)
    assert leader.proc is not None
    killed_at = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGKILL)
    dep.note(f"SIGKILL to leader {leader.name} (term {view['term']}, pid {leader.proc.pid})")
    assert leader.proc.wait(10) == -signal.SIGKILL
    new_leader, new_view = wait_leader(dep, timeout=60, exclude=leader)
    assert new_view["term"] > view["term"], (view, new_view)
    dep.note(
        f"new leader {new_leader.name} (term {new_view['term']}) "
        f"{time.monotonic() - killed_at:.1f}s after the kill"
    )
    # The second batch, the dead node first in --server: schedctl must pass over it.
    acked += submit([leader.url] + [u for u in urls if u != leader.url], 0.1, JOBS_AFTER)
    assert len(set(acked)) == JOBS_BEFORE + JOBS_AFTER, acked

    # Every acknowledged job succeeds ...
    live = [n.url for n in dep.nodes if n.alive]
    pending = set(acked)
    deadline = time.monotonic() + 90
    while pending:
        for job_id in sorted(pending):
            body = api(new_leader.url, f"/api/v1/jobs/{job_id}/runs", dep.tokens["submit"])
            if body and body["runs"] and body["runs"][0]["state"] == "succeeded":
                pending.discard(job_id)
        assert worker.poll() is None, f"the worker exited with {worker.returncode}"
        assert time.monotonic() < deadline, f"not succeeded within 90s: {sorted(pending)}"
        time.sleep(0.2)
    dep.note("every job succeeded")
    # ... and every run executed exactly once: one start, by the attempt its history says won.
    executions: dict[str, list[tuple[int, int]]] = {}
    for line in record.read_text().splitlines():
        run_id, fence, attempt = line.split()
        executions.setdefault(run_id, []).append((int(fence), int(attempt)))
    histories = run_all([schedctl(dep, live, "runs", job_id) for job_id in acked])
    run_ids = set()
    for job_id, history in zip(acked, histories, strict=True):
        (run,) = history["runs"]
        run_ids.add(run["id"])
        assert run["id"].startswith(f"{job_id}@") and run["state"] == "succeeded", run
        (won,) = [a for a in run["attempts"] if a["outcome"] == "succeeded"]
        assert won["worker_id"] == worker_id, run
        assert executions.get(run["id"]) == [(won["fence"], won["attempt"])], (
            f"{run['id']} started as {executions.get(run['id'])}; history {run['attempts']}"
        )
    assert set(executions) == run_ids, set(executions) ^ run_ids
    if dep.shards > 1:  # the jobs were spread: a killed node's shards and the others' ran
        used = {history["runs"][0]["shard"] for history in histories}
        assert len(used) >= 2 and used <= set(range(dep.shards)), used
    for n in dep.nodes:  # under systemd (JOURNAL_STREAM) a node logs JSON lines only
        text = [ln for ln in n.log.read_text(errors="replace").splitlines() if ln.strip()]
        assert all(ln.startswith("{") for ln in text), [ln for ln in text if ln[:1] != "{"]
    elections = [
        (e["node_id"], e["term"]) for _, e in dep.events() if e.get("event") == "leader.elected"
    ]
    dep.note(f"done; elections (node, term): {sorted(elections, key=lambda e: e[1])}")
    print("\n".join(dep.notes))
