"""The arrows in architecture.md, enforced: core and protocol are pure; only raft imports
pysyncobj; core imports nothing from the outer layers."""

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


@pytest.mark.parametrize("path", modules("core") + modules("protocol"), ids=lambda p: p.name)
def test_core_and_protocol_are_pure(path: Path) -> None:
    found = imports(path)
    bad = {m for m in found if m.split(".")[0] in IMPURE or m in IMPURE}
    assert not bad, (
        f"{path.name} imports {sorted(bad)}: core and protocol take time and I/O as inputs"
    )
    outer = {m for m in found if m.startswith(OUTER)}
    assert not outer, f"{path.name} imports outer layers {sorted(outer)}"


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
