"""The Raft thread's time around a journal compaction, against another revision's journal.

    .venv/bin/python scripts/benchlib/journal_compaction.py [--rev 506517a~1] [--rounds 5]

A journal of 300 entries of 200 KB, synced; the head of 100 dropped (a 40 MB tail kept); then
five more entries appended and synced, as the next moments of a busy node.  For each round and
each implementation (alternating, in one process): the longest call made on the Raft thread
(``deleteEntriesTo``, each ``sync``, and for a background compaction the call that puts the
copy in place).  Prints the median and every round, in milliseconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
ENTRY = os.urandom(200_000)


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def one_round(mod: ModuleType, directory: str) -> float:
    path, dump = os.path.join(directory, "raft.journal"), os.path.join(directory, "raft.dump")
    Path(dump).write_bytes(b"x" * 1000)
    journal = mod.DurableJournal(path, snapshot_path=dump)
    for i in range(1, 301):
        journal.add(ENTRY, i, 1)
    journal.sync()
    os.sync()
    calls = []
    started = time.perf_counter()
    journal.deleteEntriesTo(100)
    calls.append(time.perf_counter() - started)
    for i in range(301, 306):
        journal.add(ENTRY, i, 1)
        started = time.perf_counter()
        journal.sync()
        calls.append(time.perf_counter() - started)
        time.sleep(0.05)
    pending = getattr(journal, "_compaction", None)
    if pending is not None:
        pending.join()
        started = time.perf_counter()
        journal.finish_compaction()
        calls.append(time.perf_counter() - started)
    journal._destroy()
    return max(calls) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--rev",
        default="506517a~1",
        help="the other revision (default: before the background compaction)",
    )
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="journal-bench-"))
    try:
        old = work / "journal_old.py"
        old.write_text(
            subprocess.run(
                ["git", "show", f"{args.rev}:schedd/raft/journal.py"],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        impls = {
            args.rev: load("journal_old", old),
            "this tree": load("journal_new", ROOT / "schedd/raft/journal.py"),
        }
        results: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(args.rounds):
            for name, mod in impls.items():
                directory = tempfile.mkdtemp(dir=work)
                results[name].append(one_round(mod, directory))
                shutil.rmtree(directory)
        for name, values in results.items():
            print(
                f"{name}: longest Raft-thread call, median {statistics.median(values):.1f} ms;"
                f" all {[round(v, 1) for v in values]}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
