"""What users read stands alone: no pointer to files outside the repository or to internal
planning material, and every relative link of the markdown reference resolves.

User-facing: README.md, CHANGELOG.md, everything under docs/, config/ and systemd/, the sources
of the ``schedd`` package (docstrings, help strings and comments ship with it) and
pyproject.toml.  BENCHMARKS.md and RELIABILITY.md are engineering records that may cite
measurements and commits; they are only held to staying inside the repository.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USER_FACING_FILES = ("README.md", "CHANGELOG.md", "pyproject.toml")
USER_FACING_DIRS = ("docs", "config", "systemd", "schedd")
ENGINEERING_RECORDS = ("BENCHMARKS.md", "RELIABILITY.md")
SKIP_DIRS = frozenset({"__pycache__"})

#: a path that only exists on the machines the project was planned on
OUTSIDE_PATHS = re.compile(r"\.\./shared\b|/work/shared\b")
#: internal planning material and issue tracker references
INTERNAL_REFERENCES = re.compile(
    r"raft-notes"
    r"|contract\.md"
    r"|\bissues?\s*#?\s*\d+"  # issue 5, issue #5, issues 4
    r"|\(\s*#\d+\b",  # (#12), (#5, #13)
    re.IGNORECASE,
)


def _text_files(rel: str) -> Iterator[Path]:
    path = ROOT / rel
    if path.is_file():
        yield path
        return
    for p in sorted(path.rglob("*")):
        if (
            p.is_file()
            and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
            and p.suffix not in (".pyc", ".pyo")
        ):
            yield p


def _offending_lines(paths: list[Path], pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def user_facing_paths() -> list[Path]:
    paths: list[Path] = []
    for rel in (*USER_FACING_FILES, *USER_FACING_DIRS):
        paths.extend(_text_files(rel))
    return paths


def test_the_scope_is_not_empty() -> None:
    rels = {p.relative_to(ROOT).as_posix() for p in user_facing_paths()}
    for expected in (
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "docs/api.md",
        "config/schedd.example.toml",
        "config/alerts.yml",
        "systemd/schedd.service",
        "schedd/metrics.py",
    ):
        assert expected in rels


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("The contract is in `../shared/contract.md`.", True),
        ("see /work/shared/raft-notes.md", True),
        ("a stalled follower (raft-notes #6)", True),
        ("Done (issue 2), operations (Issue #6)", True),
        ("targets from issue5", True),
        ("fixed in (#12)", True),
        ("both (#5, #13)", True),
        ("an issue with the network", False),
        ("404 when depends_on names an unknown job", False),
        ("jobs[3].task; depends_on[2]", False),
        ("color: #123456", False),
    ],
)
def test_the_patterns(line: str, bad: bool) -> None:
    hit = bool(OUTSIDE_PATHS.search(line) or INTERNAL_REFERENCES.search(line))
    assert hit is bad


def test_user_facing_text_has_no_internal_pointers() -> None:
    pattern = re.compile(f"{OUTSIDE_PATHS.pattern}|{INTERNAL_REFERENCES.pattern}", re.IGNORECASE)
    found = _offending_lines(user_facing_paths(), pattern)
    assert not found, (
        "user-facing text points at files outside the repository or at internal planning "
        "material; point into docs/ or explain it plainly:\n" + "\n".join(found)
    )


def test_engineering_records_stay_inside_the_repository() -> None:
    paths = [ROOT / name for name in ENGINEERING_RECORDS if (ROOT / name).is_file()]
    found = _offending_lines(paths, OUTSIDE_PATHS)
    assert not found, "paths outside the repository:\n" + "\n".join(found)


# -- relative markdown links -------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _without_code(text: str) -> str:
    """The text with fenced blocks blanked (line numbers kept) and inline code removed."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _INLINE_CODE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> Iterator[tuple[int, str]]:
    text = _without_code(path.read_text(encoding="utf-8"))
    for pattern in (_INLINE_LINK, _REFERENCE_LINK):
        for m in pattern.finditer(text):
            yield text.count("\n", 0, m.start()) + 1, m.group(1)


def test_slug() -> None:
    assert slug("The Raft secret") == "the-raft-secret"
    assert slug("`GET /jobs`") == "get-jobs"
    assert slug("Metrics and alerts") == "metrics-and-alerts"
    assert slug("The data directory and backups") == "the-data-directory-and-backups"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_markdown_links_resolve(path: Path) -> None:
    broken = []
    for line, target in _links(path):
        if _SCHEME.match(target):
            continue  # http:, https:, mailto:
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{line}: ({target})"
        if not dest.is_relative_to(ROOT):
            broken.append(f"{where} points outside the repository")
        elif not dest.exists():
            broken.append(f"{where}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)
