"""The layers, enforced: core and protocol are pure; only raft imports pysyncobj; each part of
schedd imports only the parts its layer may (``ALLOWED``), by any kind of import; and no import
cycle exists anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "schedd"
IMPURE = {
    "time",
    "asyncio",
    "random",
    "uuid",
    "socket",
    "os",
    "io",
    "logging",
    "threading",
    "subprocess",
    "aiohttp",
    "aiosqlite",
    "sqlite3",
    "pysyncobj",
    "secrets",
    "datetime.now",
}
OUTER = (
    "schedd.api",
    "schedd.leader",
    "schedd.raft",
    "schedd.runtime",
    "schedd.cli",
    "schedd.worker",
    "schedd.storage",
    "schedd.clock",
    "schedd.ids",
    "schedd.config",
)


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


#: the leader's decisions (sans-I/O, like core): its shell, schedd/leader/leader.py, reads the
#: clocks, logs, records the metrics and talks to Raft and the sockets
LEADER_PURE = [PKG / "leader" / "core.py", PKG / "leader" / "progress.py"]
#: what the leader's pure modules may import of the leader package (its data, no I/O)
LEADER_DATA = ("schedd.leader.core", "schedd.leader.progress", "schedd.leader.workers")


@pytest.mark.parametrize(
    "path", modules("core") + modules("protocol") + LEADER_PURE, ids=lambda p: p.name
)
def test_core_and_protocol_are_pure(path: Path) -> None:
    found = imports(path)
    bad = {m for m in found if m.split(".")[0] in IMPURE or m in IMPURE}
    assert not bad, (
        f"{path.name} imports {sorted(bad)}: core and protocol take time and I/O as inputs"
    )
    outer = {m for m in found if m.startswith(OUTER) and not m.startswith(LEADER_DATA)}
    assert not outer, f"{path.name} imports outer layers {sorted(outer)}"
    if path in LEADER_PURE:  # logs and observations are actions the shell carries out
        shell = found & {"schedd.logs", "schedd.metrics"}
        assert not shell, f"{path.name} imports {sorted(shell)}: return Log or an Observation"


def test_only_raft_imports_pysyncobj() -> None:
    offenders = [
        p.relative_to(PKG)
        for p in PKG.rglob("*.py")
        if p.parent.name != "raft" and any(m.startswith("pysyncobj") for m in imports(p))
    ]
    assert not offenders, f"pysyncobj imported outside schedd/raft: {offenders}"


def test_the_sdk_does_not_depend_on_the_server() -> None:
    server = ("schedd.api", "schedd.leader", "schedd.raft", "schedd.runtime", "schedd.core.state")
    offenders = {
        str(p.relative_to(PKG)): sorted(m for m in imports(p) if m.startswith(server))
        for p in modules("worker")
    }
    assert not any(offenders.values()), offenders


# -- the layers, and no cycle ------------------------------------------------------------------
#: what each part of schedd may import of schedd, by any kind of import (at the top, inside a
#: function, or for type checking only).  The parts are the packages and the top-level modules;
#: anything not named here may import nothing of schedd.
FOUNDATION = {
    "schedd.errors",
    "schedd.aio",
    "schedd.clock",
    "schedd.ids",
    "schedd.logs",
    "schedd.net",
}
ALLOWED: dict[str, set[str]] = {
    "schedd.errors": set(),
    "schedd.aio": set(),
    "schedd.clock": set(),
    "schedd.ids": set(),
    "schedd.logs": set(),
    "schedd.net": set(),
    "schedd.notify": set(),
    "schedd.auth": {"schedd.errors"},
    "schedd.gcpolicy": {"schedd.logs"},
    # the pure rules, and what travels between nodes and workers
    "schedd.core": {"schedd.errors"},
    "schedd.protocol": {"schedd.core", "schedd.errors"},
    "schedd.config": {"schedd.core", "schedd.errors", "schedd.ids", "schedd.net"},
    # the record in a node's data directory of the cluster its data belongs to
    "schedd.datadir": {"schedd.config", "schedd.storage"},
    # where the state is kept, and how it is replicated
    "schedd.storage": {"schedd.core", *FOUNDATION},
    "schedd.raft": {"schedd.core", "schedd.storage", *FOUNDATION},
    "schedd.metrics": {"schedd.core", "schedd.raft"},
    "schedd.leader": {
        "schedd.core",
        "schedd.protocol",
        "schedd.raft",
        "schedd.metrics",
        *FOUNDATION,
    },
    # the outside: the HTTP API sees the rest through its ports, the SDK never sees the server
    "schedd.api": {
        "schedd.core",
        "schedd.protocol",
        "schedd.storage",
        "schedd.leader",
        "schedd.metrics",
        "schedd.config",
        "schedd.auth",
        "schedd.ui",
        *FOUNDATION,
    },
    "schedd.ui": set(),  # the dashboard's files: served by the API, a client of it
    "schedd.worker": {"schedd.core", "schedd.protocol", "schedd.client", *FOUNDATION},
    # the client library: the public API from Python (and task handles for producers)
    "schedd.client": {"schedd.core", "schedd.protocol", *FOUNDATION},
    "schedd.preflight": {"schedd.config", "schedd.raft"},
    # the wiring, and the programs
    "schedd.runtime": {
        "schedd.api",
        "schedd.auth",
        "schedd.config",
        "schedd.core",
        "schedd.gcpolicy",
        "schedd.leader",
        "schedd.metrics",
        "schedd.preflight",
        "schedd.raft",
        "schedd.storage",
        *FOUNDATION,
    },
    # a node of several shards: the supervisor, its shards' processes and its front door
    "schedd.shard": {
        "schedd.aio",
        "schedd.clock",
        "schedd.protocol",  # the front door serves workers from every shard
        "schedd.cli",
        "schedd.config",
        "schedd.core",
        "schedd.errors",
        "schedd.ids",
        "schedd.logs",
        "schedd.notify",
        "schedd.runtime",
    },
    "schedd.cli": {
        "schedd.auth",
        "schedd.client",
        "schedd.protocol",
        "schedd.config",
        "schedd.core",
        "schedd.datadir",
        "schedd.notify",
        "schedd.preflight",
        "schedd.raft",  # schedd restore: seeds a node's Raft directory from an image
        "schedd.runtime",
        "schedd.shard",  # a node of several shards runs their supervisor
        "schedd.storage",  # schedctl snapshot: checks images as they come, and files
        "schedd.worker",
        *FOUNDATION,
    },
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def schedd_imports(name: str) -> set[str]:
    """The schedd modules ``name`` imports, by any kind of import statement."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import"
            module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    out = set()
    for target in found:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target not in (name, "schedd"):
            out.add(target)
    return out


def part_of(name: str) -> str:
    return ".".join(name.split(".")[:2])


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "schedd"))
def test_each_module_imports_only_what_its_layer_may(name: str) -> None:
    part = part_of(name)
    allowed = ALLOWED.get(part, set()) | {part}
    bad = sorted(t for t in schedd_imports(name) if part_of(t) not in allowed)
    assert not bad, f"{name} imports {bad}; {part} may import only {sorted(allowed - {part})}"


def test_no_import_cycle_of_any_kind() -> None:
    graph = {name: schedd_imports(name) for name in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
