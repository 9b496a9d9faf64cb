"""Mutation testing of the promise-bearing code against the fast test tiers (scripts/mutants).

The tool is mutmut (pinned in pyproject's dev extra; scope in ``[tool.mutmut]``). mutmut never
edits a source file while testing: it writes every mutant of a function into a copy under
``mutants/`` behind a trampoline and switches between them with an environment variable, and it
runs only the tests that called the mutated function (recorded once, in a "stats" run). This
driver still never runs it in the checkout: it copies the working tree as it is (tracked and
untracked files, uncommitted edits included) into a temporary directory, runs mutmut there,
reports from the result files, and removes the copy (``--keep`` leaves it for ``mutmut
browse``/``mutmut show``). Never run ``mutmut apply`` in a checkout: that one does write a mutant
into the source file.

Modes (all can be combined; ``--budget`` bounds the wall clock of any of them):

* full (no selection): every mutant of ``[tool.mutmut] only_mutate``;
* ``PATH ...``: only those files or directories of the scope;
* ``--changed BASE``: only the functions (and methods) whose lines changed since the commit BASE,
  working-tree edits and new files included;
* ``--sample N [--seed S]``: a reproducible random sample of N mutants of the selection (the same
  tree, N and seed always draw the same mutants).

Tests: ``tests/unit`` and ``tests/property`` (``--no-property`` drops the latter). Hypothesis
tests run under a cap of ``--examples`` examples each (default 25, ``0`` keeps each test's own
settings), derandomized, without the example database and without shrinking, so the verdicts are
reproducible and a killed mutant is not slowed down by shrinking. This module is also the pytest
plugin that applies the cap (loaded as ``-p mutantslib`` inside the copy).

Score: (killed + timeout + crashed) / (every checked mutant that is not accepted as equivalent).
``no tests`` (no fast test calls the function) and survivors count against it. Equivalent
mutants accepted in ``config/mutants-equivalent.toml`` are left out of the score and the list;
an entry that matches no mutant, or matches one the tests kill, is printed as a stale warning.

Exit status: 0 the run finished (or was cut by the budget; then the report says how many were not
checked), 1 the score is below ``--fail-under``, 2 bad usage or mutmut itself failed (the clean
test run failed, for instance; the tail of its log is printed).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = Path("config/mutants-equivalent.toml")
PLUGIN = "mutantslib"
EXAMPLES_ENV = "SCHEDD_MUTANTS_EXAMPLES"
FAILURES_ENV = "SCHEDD_MUTANTS_UNMUTATED_FAILURES"  # where the plugin records the failures below
SKIP = {"mutants", ".venv"}  # mutmut's own work dir (a direct `mutmut run`), the environment
CLASS_SEP = "ǁ"  # mutmut's separator in mangled method names: xǁClassǁmethod

# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code in the pinned version).
# Any other code is the test process ending abnormally because of the mutant (e.g. 70, the
# journal's exit on a failed write): "crashed", which counts as killed (mutmut says
# "suspicious").
STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    35: "suspicious",
    36: "timeout",
    37: "killed",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "crashed",
    -9: "crashed",
    2: "not checked",
    None: "not checked",
}
KILLED = ("killed", "timeout", "crashed")
NOT_KILLED = ("survived", "no tests", "suspicious")
COLUMNS = (
    "killed",
    "timeout",
    "crashed",
    "survived",
    "no tests",
    "suspicious",
    "skipped",
    "not checked",
    "accepted",
)


# ----------------------------------------------------------------------------------------------
# pytest plugin, loaded by mutmut's pytest runs in the copy as -p mutantslib


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Regenerate parametrize ids on every collection. pytest keeps the ids it generated on the
    mark and escapes them once more when the same process collects again, so an id with a
    backslash in it changes. mutmut's fork server collects once to warm up, then each mutant's
    process asks for the ids the stats run recorded: pytest answers "not found" (exit 4) and
    mutmut counts the mutant as a timeout, that is, killed."""
    for mark in metafunc.definition.iter_markers(name="parametrize"):
        source = getattr(mark, "_param_ids_from", None)
        if source is not None and getattr(source, "_param_ids_generated", None) is not None:
            object.__setattr__(source, "_param_ids_generated", None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record a test that fails with no mutant active (mutmut's stats and clean runs). mutmut runs
    them in a forked child whose output it never shows, so without this a failing test there
    reads only "failed to collect stats. runner returned 1"."""
    path = os.environ.get(FAILURES_ENV)
    if (
        not path
        or not report.failed
        or os.environ.get("MUTANT_UNDER_TEST", "") not in ("", "stats")
    ):
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(
            f"--- {report.nodeid} ({report.when}) failed with no mutant active:\n"
            f"{report.longreprtext[-3000:]}\n"
        )


def pytest_collection_modifyitems(items: list[Any]) -> None:
    cap = int(os.environ.get(EXAMPLES_ENV, "0") or 0)
    if cap <= 0:
        return
    from hypothesis import Phase, settings

    def capped(s: Any) -> Any:
        return settings(
            s,
            max_examples=min(s.max_examples, cap),
            database=None,
            derandomize=True,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
        )

    for item in items:
        fn = getattr(item, "obj", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if getattr(fn, "is_hypothesis_test", False) and own is not None:
            fn._hypothesis_internal_use_settings = capped(own)  # type: ignore[union-attr]
        cls = getattr(item, "cls", None)  # stateful machines: TestCase.settings
        if cls is not None and isinstance(getattr(cls, "settings", None), settings):
            cls.settings = capped(cls.settings)


# ----------------------------------------------------------------------------------------------
# scope and selection


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def working_tree_files() -> list[str]:
    """Tracked and untracked (not ignored) files that exist on disk, as the developer has them."""
    out = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return sorted(
        {
            p
            for p in out.split("\0")
            if p and p.split("/", 1)[0] not in SKIP and (ROOT / p).is_file()
        }
    )


def mutmut_config() -> dict[str, Any]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    conf: dict[str, Any] = data.get("tool", {}).get("mutmut", {})
    if not conf.get("only_mutate"):
        raise SystemExit("mutants: pyproject.toml has no [tool.mutmut] only_mutate")
    return conf


def scope_files(files: Iterable[str], patterns: Sequence[str]) -> list[str]:
    return [f for f in files if f.endswith(".py") and any(fnmatch.fnmatch(f, p) for p in patterns)]


def top_level_functions(source: str) -> list[tuple[str, int, int]]:
    """(mutmut's mangled key, first line, last line) of every function and method mutmut can
    mutate: top-level functions and methods of top-level classes (nested ones belong to these)."""
    out: list[tuple[str, int, int]] = []
    for node in ast.parse(source).body:
        funcs: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            funcs.append((f"x_{node.name}", node))
        elif isinstance(node, ast.ClassDef):
            funcs += [
                (f"x{CLASS_SEP}{node.name}{CLASS_SEP}{m.name}", m)
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
        for key, f in funcs:
            first = min([f.lineno, *(d.lineno for d in getattr(f, "decorator_list", []))])
            out.append((key, first, f.end_lineno or f.lineno))
    return out


def changed_functions(base: str, files: Sequence[str]) -> dict[str, set[str] | None]:
    """file -> mangled keys of the functions whose lines changed since ``base`` (None: the whole
    file, which is new). Deleted lines count for the function they were deleted from."""
    try:
        git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"mutants: --changed {base}: not a commit here") from None
    known = set(git("ls-tree", "-r", "--name-only", base, "--", *files).split())
    result: dict[str, set[str] | None] = {}
    for f in files:
        if f not in known:
            result[f] = None
            continue
        lines: set[int] = set()
        for m in re.finditer(
            r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", git("diff", "-U0", base, "--", f), re.M
        ):
            start, count = int(m.group(1)), int(m.group(2) or "1")
            lines.update(range(start, start + count) if count else (start, start + 1))
        if lines:
            src = (ROOT / f).read_text("utf-8")
            keys = {k for k, a, b in top_level_functions(src) if any(a <= n <= b for n in lines)}
            if keys:
                result[f] = keys
    return result


def module_of(path: str) -> str:
    return path[: -len(".py")].replace("/", ".").removesuffix(".__init__")


# ----------------------------------------------------------------------------------------------
# the copy and the mutmut run


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def write_mutmut_section(pyproject: Path, conf: dict[str, Any]) -> None:
    """Replace the copy's [tool.mutmut] table by ``conf`` (mutmut reads only pyproject.toml)."""
    text = pyproject.read_text("utf-8")
    section = "[tool.mutmut]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in conf.items())
    pattern = re.compile(r"^\[tool\.mutmut\]\n(?:(?!\[).*\n?)*", re.M)
    text = (
        pattern.sub(lambda _: section + "\n", text)
        if pattern.search(text)
        else text.rstrip("\n") + "\n\n" + section
    )
    pyproject.write_text(text, "utf-8")


def make_copy(work: Path, files: Sequence[str]) -> None:
    for f in files:
        dest = work / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest)


def mutmut_bin() -> str:
    exe = Path(sys.executable).parent / "mutmut"
    if not exe.exists():
        raise SystemExit(
            "mutants: mutmut is not installed in this environment (scripts/setup "
            "installs the dev extra)"
        )
    return str(exe)


GENERATE = """
import sys
from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, setup_source_paths
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(int(sys.argv[1]))
"""


def generate(work: Path, env: dict[str, str], jobs: int, log: Path) -> None:
    """Only write the mutants (mutmut's own first step), to know their names before a sample."""
    with log.open("a") as out:
        proc = subprocess.run(
            [sys.executable, "-c", GENERATE, str(jobs)],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode:
        fail(f"generating the mutants failed (exit {proc.returncode})", log)


def fail(message: str, log: Path) -> None:
    lines = log.read_text("utf-8", "replace").replace("\r", "\n").splitlines()
    tail = [x for x in lines if x.strip()][-40:]
    print("\n".join(tail), file=sys.stderr)
    failures = log.parent / "unmutated-failures.txt"
    if failures.exists():
        print(failures.read_text("utf-8", "replace"), file=sys.stderr)
    print(f"mutants: {message} (log: {log})", file=sys.stderr)
    raise SystemExit(2)


PROGRESS = re.compile(r"(\d+)/(\d+)\s+🎉 (\d+) 🫥 (\d+)\s+⏰ (\d+)\s+🤔 (\d+)\s+🙁 (\d+)")


def last_progress(log: Path) -> str | None:
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = PROGRESS.findall(tail)
    if not found:
        return None
    done, total, killed, notests, timeout, susp, survived = found[-1]
    return (
        f"{done}/{total} checked: {killed} killed, {survived} survived, {notests} no tests, "
        f"{timeout} timeout, {susp} suspicious"
    )


def run_mutmut(
    work: Path,
    env: dict[str, str],
    names: Sequence[str],
    jobs: int,
    log: Path,
    deadline: float | None,
    every: float,
) -> bool:
    """Run ``mutmut run``; stop it at the deadline. True when it finished by itself."""
    with log.open("a") as out:
        proc = subprocess.Popen(
            [mutmut_bin(), "run", "--max-children", str(jobs), *names],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finished = True
    next_report = time.monotonic() + every
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                finished = False
                print(
                    "mutants: budget reached, stopping mutmut (results so far are kept)", flush=True
                )
                proc.send_signal(signal.SIGINT)  # mutmut stops its workers and saves
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    pass
                break
            if now >= next_report:
                print(
                    f"  [{time.strftime('%H:%M:%S')}] {last_progress(log) or 'starting'}",
                    flush=True,
                )
                next_report = now + every
            time.sleep(1)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # workers and the fork server, if any are left
        except ProcessLookupError:
            pass
        proc.wait()
    if finished and proc.returncode != 0:
        fail(f"mutmut exited with {proc.returncode}", log)
    return finished


# ----------------------------------------------------------------------------------------------
# results


@dataclass
class Mutant:
    name: str
    path: str
    status: str
    function: str = ""
    line: int = 0
    original: str = ""
    mutated: str = ""
    accepted_by: int | None = None

    def row(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.original}  →  {self.mutated}   in {self.function}"
            f"   [{self.status}; {self.name}]"
        )


def function_display(name: str) -> str:
    key = name.rpartition(".")[2].partition("__mutmut_")[0]
    if key.startswith(f"x{CLASS_SEP}"):
        _, cls, meth = key.split(CLASS_SEP)
        return f"{cls}.{meth}"
    return key.removeprefix("x_")


def norm(code: str) -> str:
    return " ".join(code.split())


class Describer:
    """Where a mutant is in the original file and what it changed, from mutmut's line index of
    the generated functions (``mutants/<file>.spans``) and the original source."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.cache: dict[str, tuple[dict[str, list[int]], list[str], dict[str, int]]] = {}

    def _file(self, path: str) -> tuple[dict[str, list[int]], list[str], dict[str, int]]:
        if path not in self.cache:
            spans = json.loads((self.work / "mutants" / f"{path}.spans").read_text("utf-8"))
            lines = (self.work / "mutants" / path).read_text("utf-8").splitlines()
            src = (self.work / path).read_text("utf-8")
            defs: dict[str, int] = {}  # mangled key -> line of its "def"
            for node in ast.parse(src).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    defs[f"x_{node.name}"] = node.lineno
                elif isinstance(node, ast.ClassDef):
                    for m in node.body:
                        if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef):
                            defs[f"x{CLASS_SEP}{node.name}{CLASS_SEP}{m.name}"] = m.lineno
            self.cache[path] = (spans["spans"], lines, defs)
        return self.cache[path]

    def describe(self, m: Mutant) -> None:
        m.function = function_display(m.name)
        try:
            spans, lines, defs = self._file(m.path)
        except (OSError, ValueError, KeyError):
            return
        gen = m.name.rpartition(".")[2]
        key = gen.partition("__mutmut_")[0]
        if f"{key}__mutmut_orig" not in spans or gen not in spans:
            return

        def body(name: str) -> list[str]:
            a, b = spans[name]
            return [x.replace(f"def {name}(", f"def {key}(") for x in lines[a - 1 : b]]

        orig, mut = body(f"{key}__mutmut_orig"), body(gen)
        def_idx = next(
            (i for i, x in enumerate(orig) if re.match(rf"\s*(async\s+)?def {key}\b", x)), 0
        )
        changes = [
            op
            for op in difflib.SequenceMatcher(None, orig, mut, autojunk=False).get_opcodes()
            if op[0] != "equal"
        ]
        if not changes:
            return
        i1, i2 = changes[0][1], changes[-1][2]
        j1, j2 = changes[0][3], changes[-1][4]
        m.line = defs.get(key, 0) + i1 - def_idx
        m.original = " ⏎ ".join(x.strip() for x in orig[i1:i2]) or "(nothing)"
        m.mutated = " ⏎ ".join(x.strip() for x in mut[j1:j2]) or "(removed)"
        plain = f"def {m.function.rpartition('.')[2]}("
        m.original = m.original.replace(f"def {key}(", plain)
        m.mutated = m.mutated.replace(f"def {key}(", plain)


def load_results(work: Path, files: Sequence[str], only: set[str] | None) -> list[Mutant]:
    out = []
    for f in files:
        meta = work / "mutants" / f"{f}.meta"
        if not meta.exists():
            continue
        codes = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
        for name, code in codes.items():
            if only is None or name in only:
                out.append(Mutant(name, f, STATUS_BY_EXIT_CODE.get(code, "crashed")))
    return out


@dataclass
class Equivalent:
    index: int
    file: str
    reason: str
    function: str | None = None
    original: str | None = None
    mutated: str | None = None
    mutant: str | None = None
    matched: list[Mutant] = field(default_factory=list)

    def matches(self, m: Mutant) -> bool:
        if m.path != self.file:
            return False
        if self.mutant is not None:
            return m.name == self.mutant
        return (
            self.function in (None, m.function)
            and norm(self.original or "") == norm(m.original)
            and norm(self.mutated or "") == norm(m.mutated)
        )

    def label(self) -> str:
        what = self.mutant or f"{self.original!r} -> {self.mutated!r}"
        return f"{EQUIVALENT_FILE} entry {self.index} ({self.file}: {what})"


def load_equivalents(path: Path) -> list[Equivalent]:
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text("utf-8"))
    out = []
    for i, e in enumerate(data.get("equivalent", []), 1):
        if (
            not isinstance(e, dict)
            or not e.get("file")
            or not e.get("reason")
            or not (e.get("mutant") or (e.get("original") and e.get("mutated")))
        ):
            raise SystemExit(
                f"mutants: {path} entry {i} needs file, reason, and either mutant or "
                "original + mutated"
            )
        unknown = set(e) - {"file", "reason", "function", "original", "mutated", "mutant"}
        if unknown:
            raise SystemExit(f"mutants: {path} entry {i}: unknown keys {sorted(unknown)}")
        out.append(
            Equivalent(
                i,
                e["file"],
                e["reason"],
                e.get("function"),
                e.get("original"),
                e.get("mutated"),
                e.get("mutant"),
            )
        )
    return out


def apply_equivalents(
    all_mutants: Sequence[Mutant],
    selected: set[str],
    files: Sequence[str],
    entries: Sequence[Equivalent],
    describer: Describer,
) -> list[str]:
    """Mark accepted mutants; return the warnings about stale entries of the files in this run."""
    warnings = []
    by_file: dict[str, list[Mutant]] = {}
    for m in all_mutants:
        by_file.setdefault(m.path, []).append(m)
    for e in entries:
        if e.file not in files:
            continue  # not generated in this run: cannot tell
        for m in by_file.get(e.file, []):
            if e.mutant is None and e.function not in (None, function_display(m.name)):
                continue
            if not m.original:
                describer.describe(m)
            if e.matches(m):
                e.matched.append(m)
        if not e.matched:
            warnings.append(f"stale: {e.label()} matches no mutant any more: delete it")
        for m in e.matched:
            if m.status in KILLED:
                warnings.append(
                    f"stale: {e.label()} matches {m.name}, which the tests kill: "
                    "it is not equivalent, delete the entry"
                )
            elif m.name in selected:
                m.accepted_by = e.index
    return warnings


def summarize(mutants: Sequence[Mutant]) -> Counter[str]:
    c: Counter[str] = Counter()
    for m in mutants:
        c["accepted" if m.accepted_by is not None and m.status in NOT_KILLED else m.status] += 1
    return c


def score(c: Counter[str]) -> float | None:
    killed = sum(c[s] for s in KILLED)
    checked = killed + sum(c[s] for s in NOT_KILLED)
    return None if not checked else 100.0 * killed / checked


def table(per_file: dict[str, Counter[str]]) -> str:
    head = ["file", "mutants", *COLUMNS, "score"]
    rows = []
    total: Counter[str] = Counter()
    for f, c in per_file.items():
        total.update(c)
        rows.append([f, c.total(), *(c[k] for k in COLUMNS), score(c)])
    rows.append(["TOTAL", total.total(), *(total[k] for k in COLUMNS), score(total)])
    cells = [head] + [
        [
            str(x)
            if not isinstance(x, float) and x is not None
            else ("-" if x is None else f"{x:.1f}%")
            for x in r
        ]
        for r in rows
    ]
    width = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join(
        "  ".join(v.ljust(width[0]) if i == 0 else v.rjust(width[i]) for i, v in enumerate(r))
        for r in cells
    )


# ----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/mutants",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mutation testing (mutmut) of schedd/core, schedd/raft/journal.py and "
        "schedd/auth.py against tests/unit and tests/property, in a temporary copy "
        "of the working tree (the checkout is never touched).",
        epilog="""\
CI: use the bounded mode
    scripts/mutants --sample 100 --budget 420 --fail-under 90
a fixed-seed sample of 100 of the ~6,370 mutants: about 4 min on 2 cores (about 2 minutes of
copy, mutant generation and mutmut's stats run of both tiers, then over 1 mutant/s). On a
branch with a known base,
    scripts/mutants --changed BASE --budget 600
tests only the functions changed since BASE (the same set-up, plus their mutants). The budget
is the backstop: when it is spent mutmut is stopped and the report says how many were not
checked. The full run (no options) takes about 70 min on 2 cores (the core about an hour,
journal and auth 10 min): run it as a habit (nightly, or before a release), not on every push.

Examples:
    scripts/mutants                                 # everything in scope
    scripts/mutants schedd/raft/journal.py          # one file
    scripts/mutants --changed main~3 --budget 900   # the functions changed in the last 3 commits
    scripts/mutants --sample 100 --seed 7 --survivors /tmp/survivors.txt
Accept an equivalent mutant in config/mutants-equivalent.toml (file, original, mutated, reason).
""",
    )
    p.add_argument(
        "paths",
        nargs="*",
        help="files or directories of the scope to mutate "
        "(default: all of [tool.mutmut] only_mutate)",
    )
    p.add_argument(
        "--changed", metavar="BASE", help="only functions whose lines changed since the commit BASE"
    )
    p.add_argument("--sample", type=int, metavar="N", help="a random sample of N mutants")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    p.add_argument(
        "--budget",
        type=float,
        metavar="SEC",
        help="wall-clock budget for the whole run; mutmut is stopped when it is spent "
        "and the report covers what was checked (default: none)",
    )
    p.add_argument(
        "--examples",
        type=int,
        default=25,
        metavar="N",
        help="cap on each Hypothesis test's examples (default 25; 0 = as written)",
    )
    p.add_argument("--no-property", action="store_true", help="only tests/unit")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 2,
        help="mutants tested in parallel (default: the number of cores)",
    )
    p.add_argument(
        "--survivors",
        type=Path,
        metavar="FILE",
        help="also write every mutant not killed, one per line, to FILE",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    p.add_argument(
        "--fail-under", type=float, metavar="PCT", help="exit 1 when the score is below PCT"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary copy (then: cd DIR && mutmut browse / mutmut show NAME)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines while mutmut runs")
    args = p.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        p.error("--sample must be at least 1")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    return args


def select(args: argparse.Namespace, scope: list[str]) -> dict[str, set[str] | None]:
    chosen = scope
    if args.paths:
        wanted = [os.path.relpath(Path(p).resolve(), ROOT) for p in args.paths]
        bad = [
            w for w in wanted if not any(f == w or f.startswith(w.rstrip("/") + "/") for f in scope)
        ]
        if bad:
            raise SystemExit(f"mutants: not in the scope ([tool.mutmut] only_mutate): {bad}")
        chosen = [
            f for f in scope if any(f == w or f.startswith(w.rstrip("/") + "/") for w in wanted)
        ]
    if args.changed:
        return dict(changed_functions(args.changed, chosen))
    return dict.fromkeys(chosen)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    start = time.monotonic()
    deadline = None if args.budget is None else start + args.budget
    conf = mutmut_config()
    files = working_tree_files()
    scope = scope_files(files, conf["only_mutate"])
    selection = select(args, scope)
    if not selection:
        print(f"mutants: nothing to mutate (no function in scope changed since {args.changed})")
        return 0
    sel_files = sorted(selection)
    entries = load_equivalents(ROOT / EQUIVALENT_FILE)

    work = Path(tempfile.mkdtemp(prefix="schedd-mutants-"))
    log = work / "mutmut.log"
    try:
        make_copy(work, files)
        tests = ["tests/unit"] + ([] if args.no_property else ["tests/property"])
        top = sorted({f.split("/", 1)[0] for f in files} - {"schedd", "tests", "pyproject.toml"})
        wconf = dict(
            conf, only_mutate=sel_files, pytest_add_cli_args_test_selection=tests, also_copy=top
        )
        wconf["pytest_add_cli_args"] = [*conf.get("pytest_add_cli_args", []), "-p", PLUGIN]
        write_mutmut_section(work / "pyproject.toml", wconf)
        (work / "mutants").mkdir()
        env = dict(
            os.environ,
            PYTHONPATH=str(work / "scripts"),
            **{
                EXAMPLES_ENV: str(max(args.examples, 0)),
                FAILURES_ENV: str(work / "unmutated-failures.txt"),
            },
        )
        env.pop("MUTANT_UNDER_TEST", None)

        mode = (
            ("changed functions" if args.changed else "files")
            if args.paths or args.changed
            else "full scope"
        )
        print(
            f"mutants: {mode}: {len(sel_files)} file(s); tests: {' + '.join(tests)}"
            f" (hypothesis ≤{args.examples or 'as written'} examples); copy in {work}",
            flush=True,
        )

        only: set[str] | None = None
        names: list[str] = []
        if args.changed or args.sample:
            generate(work, env, args.jobs, log)
            generated = load_results(work, sel_files, None)
            pool = [
                m.name
                for m in generated
                if selection[m.path] is None
                or m.name.rpartition(".")[2].partition("__mutmut_")[0] in (selection[m.path] or ())
            ]
            if args.sample and args.sample < len(pool):
                pool = sorted(random.Random(args.seed).sample(sorted(pool), args.sample))
            if not pool:
                print("mutants: the selection has no mutants")
                return 0
            only, names = set(pool), pool
            print(
                f"mutants: {len(pool)} mutant(s) selected"
                + (f" (sample, seed {args.seed})" if args.sample else ""),
                flush=True,
            )

        finished = run_mutmut(
            work, env, names, args.jobs, log, deadline, every=1e9 if args.quiet else 60.0
        )
        elapsed = time.monotonic() - start

        all_mutants = load_results(work, sel_files, None)
        chosen = [m for m in all_mutants if only is None or m.name in only]
        describer = Describer(work)
        warnings = apply_equivalents(
            all_mutants, {m.name for m in chosen}, sel_files, entries, describer
        )
        per_file = {f: summarize([m for m in chosen if m.path == f]) for f in sel_files}
        total: Counter[str] = sum(per_file.values(), Counter())
        survivors = [m for m in chosen if m.status in NOT_KILLED and m.accepted_by is None]
        for m in survivors:
            if not m.original:
                describer.describe(m)
        survivors.sort(key=lambda m: (m.path, m.line, m.name))

        print()
        print(table(per_file))
        s = score(total)
        print()
        if not finished:
            print(
                f"INCOMPLETE: the budget ({args.budget:.0f} s) ran out; "
                f"{total['not checked']} selected mutant(s) were not checked"
            )
        print(
            f"score: {'-' if s is None else f'{s:.1f}%'} "
            f"(killed+timeout+crashed / checked, {total['accepted']} accepted as equivalent); "
            f"wall time {elapsed:.0f} s"
        )
        for w in warnings:
            print(f"warning: {w}")
        if survivors:
            print(
                f"\nnot killed ({len(survivors)}): file:line: original  →  mutated   in function"
                "   [status; mutant]"
            )
            for m in survivors:
                print("  " + m.row())
        if args.survivors:
            args.survivors.write_text("".join(m.row() + "\n" for m in survivors), "utf-8")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "finished": finished,
                        "wall_seconds": round(elapsed, 1),
                        "score": s,
                        "files": {f: dict(c) for f, c in per_file.items()},
                        "total": dict(total),
                        "survivors": [m.__dict__ for m in survivors],
                    },
                    indent=2,
                    ensure_ascii=False,
                ),
                "utf-8",
            )
        if args.fail_under is not None and (s is None or s < args.fail_under):
            print(f"mutants: score below {args.fail_under}%")
            return 1
        return 0
    finally:
        if args.keep:
            print(f"mutants: kept the copy in {work} (log: {log})")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
