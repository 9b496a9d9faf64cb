"""The repository stands alone: what a user or an operator reads (the README, docs/, the
config samples, the systemd unit, the package metadata, the code's help strings and comments,
the scripts, the benchmark and reliability reports) points at nothing outside the repository
and at no internal issue."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USER_FACING = (
    "README.md",
    "BENCHMARKS.md",
    "RELIABILITY.md",
    "pyproject.toml",
    "docs",
    "config",
    "systemd",
    "schedd",
    "scripts",
    ".ci",
)
TEXT_SUFFIXES = {"", ".md", ".toml", ".py", ".yml", ".yaml", ".service", ".txt", ".json", ".sh"}
FORBIDDEN = re.compile(
    r"\.\./shared|/work/shared|shared/(?:contract|architecture|research)|contract\.md"
    r"|architecture\.md|raft-notes|\bissues?[ _-]?#?\d+",
    re.IGNORECASE,
)


def files() -> list[Path]:
    out = []
    for name in USER_FACING:
        path = ROOT / name
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += [
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
            ]
    return out


def test_user_facing_files_point_at_nothing_outside_the_repository() -> None:
    checked = files()
    assert len(checked) > 50 and ROOT / "README.md" in checked
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for path in checked
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert found == []


def test_the_check_catches_what_it_is_for() -> None:
    for bad in (
        "see ../shared/contract.md",
        "as in raft-notes #6",
        "targets from issue 5",
        "(Issue #12)",
        "bench-results/issue5-final.json",
    ):
        assert FORBIDDEN.search(bad), bad
    for fine in ("docs/pysyncobj.md #6", "issued a lease", "tissue 5"):
        assert not FORBIDDEN.search(fine), fine
