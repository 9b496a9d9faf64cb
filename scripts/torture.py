"""Seeded fault schedules against real three-node clusters, as many as wanted.

    scripts/torture --schedules N --seed S [--duration 30] [--kinds k1,k2] [--rate 8]
                    [--shards 1] [--time-budget SECONDS] [--json FILE] [--out DIR] [--keep]

Schedule i uses seed S+i (tests/cluster/faults.py: the same seed gives the same schedule).  Each
one gets a fresh cluster; its directory (node logs, worker logs, execution records, report.json)
is kept when an invariant is violated (or with --keep) and removed otherwise.  Prints one line per
schedule and the totals: schedules, jobs, faults by kind, each invariant's count (all must be
0), failover times p50/max, how the wiped followers caught up and how long the new nodes of
the membership kinds took to be promoted; writes everything as JSON.  Exit status 1 if any invariant is
violated.

Clock shifts are applied inside the node's Python process (time.time/time_ns; see
tests/cluster/harness.py SKEW_LAUNCHER): libfaketime 0.9.10 breaks Python 3.11's timed waits.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.checker import INVARIANTS
from tests.cluster.faults import KINDS, make_schedule, run_schedule, summary_line
from tests.cluster.harness import run_stoppable


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/torture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--schedules", type=int, default=10, help="how many schedules (default 10)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first schedule (default 1)")
    p.add_argument(
        "--duration", type=float, default=30.0, help="seconds of faults per schedule (default 30)"
    )
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated fault kinds (default all: {','.join(KINDS)})",
    )
    p.add_argument("--rate", type=float, default=8.0, help="one-off submissions per second")
    p.add_argument(
        "--shards",
        type=int,
        default=1,
        help="[cluster] shards of each cluster (default 1; several: every node fault hits a "
        "shard's leader, the checker waits for every shard)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="start no new schedule after this many seconds",
    )
    p.add_argument("--out", default=None, help="directory for the schedules' files")
    p.add_argument("--json", default=None, help="write the results here (default OUT/torture.json)")
    p.add_argument("--keep", action="store_true", help="keep every schedule's directory")
    p.add_argument(
        "--print-schedule",
        action="store_true",
        help="only print the schedules of these seeds, run nothing",
    )
    args = p.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kinds: {sorted(unknown)}")
    return args


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)  # nearest rank
    return round(s[max(0, min(len(s), math.ceil(len(s) * p)) - 1)], 3)


def totals(reports: list[dict[str, Any]]) -> dict[str, Any]:
    inv = {k: sum(r["invariants"][k] for r in reports) for k in INVARIANTS}
    faults = Counter(k for r in reports for k in (f["kind"] for f in r["faults"]))
    by_kind: dict[str, list[float]] = defaultdict(list)
    heal_by_kind: dict[str, list[float]] = defaultdict(list)
    measured: list[float] = []
    for r in reports:
        for rec in r["recovery"]:
            value = rec["from_start_s"] if rec["bound_from"] == "start" else rec["from_heal_s"]
            if value is not None:
                by_kind[rec["kind"]].append(value)
                measured.append(value)
            if rec["from_heal_s"] is not None:
                heal_by_kind[rec["kind"]].append(rec["from_heal_s"])
    runs = Counter[str]()
    for r in reports:
        runs.update(r["runs"])
    wiped = [f for r in reports for f in r["faults"] if f.get("wiped")]
    rebuilt = [f["rebuilt_s"] for f in wiped if f["rebuilt_s"] is not None]
    joined = [f for r in reports for f in r["faults"] if f.get("joined")]
    promoted = [f["promoted_s"] for f in joined if f["promoted_s"] is not None]
    interrupted = [f for f in joined if f["kind"] == "add_interrupted"]
    removed = [f for r in reports for f in r["faults"] if f.get("removed")]
    return {
        "schedules": len(reports),
        "schedules_ok": sum(1 for r in reports if r["ok"]),
        "jobs_submitted": sum(r["ops"]["submitted"] for r in reports),
        "jobs_acknowledged": sum(r["ops"]["acknowledged"] for r in reports),
        "runs": runs.get("runs", 0),
        "runs_succeeded": runs.get("runs_succeeded", 0),
        "attempts": runs.get("attempts", 0),
        "executions": sum(r["executions"] for r in reports),
        "refused_stale_completions": sum(r["refused_completions"] for r in reports),
        "faults": sum(faults.values()),
        "faults_by_kind": dict(sorted(faults.items())),
        "invariants": inv,
        "failover_bound_s": reports[0]["failover_bound_s"] if reports else None,
        "failover_p50_s": pct(measured, 0.5),
        "failover_p99_s": pct(measured, 0.99),
        "failover_max_s": max(measured) if measured else None,
        "failover_by_kind": {
            k: {
                "n": len(v),
                "p50_s": pct(v, 0.5),
                "max_s": max(v),
                "mean_s": round(statistics.fmean(v), 3),
                "measured_from": "heal"
                if any(
                    rec["bound_from"] == "heal"
                    for r in reports
                    for rec in r["recovery"]
                    if rec["kind"] == k
                )
                else "start",
            }
            for k, v in sorted(by_kind.items())
        },
        "after_heal_by_kind": {
            k: {"p50_s": pct(v, 0.5), "max_s": max(v)} for k, v in sorted(heal_by_kind.items())
        },
        "violated_seeds": [r["seed"] for r in reports if not r["ok"]],
        "rebuilds": {
            "wiped": len(wiped),
            "rebuilt": len(rebuilt),
            "from_snapshot": sum(1 for f in wiped if f["rebuilt_by"] == "snapshot"),
            "p50_s": pct(rebuilt, 0.5),
            "max_s": max(rebuilt) if rebuilt else None,
        },
        "new_nodes": {
            "joined": len(joined),
            "by_kind": dict(Counter(f["kind"] for f in joined)),
            "promoted": len(promoted),
            "promoted_s": sorted(promoted),
            "p50_s": pct(promoted, 0.5),
            "max_s": max(promoted) if promoted else None,
            "interrupted": len(interrupted),
            "learner_at_kill": sum(1 for f in interrupted if f.get("learner_at_kill")),
            "removed": len(removed),
            "removed_stopped": sum(1 for f in removed if f.get("refused")),
        },
    }


def print_totals(t: dict[str, Any], elapsed: float) -> None:
    print(f"\n== {t['schedules']} schedules ({t['schedules_ok']} clean) in {elapsed / 60:.1f} min")
    print(
        f"jobs: {t['jobs_acknowledged']} acknowledged of {t['jobs_submitted']} submitted; "
        f"{t['runs']} runs ({t['runs_succeeded']} succeeded), {t['attempts']} attempts, "
        f"{t['executions']} executions, {t['refused_stale_completions']} stale completions "
        "refused"
    )
    print(
        f"faults: {t['faults']}: " + ", ".join(f"{k} {n}" for k, n in t["faults_by_kind"].items())
    )
    print(
        "invariants (all must be 0): " + ", ".join(f"{k} {n}" for k, n in t["invariants"].items())
    )
    print(
        f"failover (first acknowledged submit; bound {t['failover_bound_s']}s): "
        f"p50 {t['failover_p50_s']}s p99 {t['failover_p99_s']}s max {t['failover_max_s']}s"
    )
    for k, v in t["failover_by_kind"].items():
        print(
            f"  {k:<20} n={v['n']:<3} p50 {v['p50_s']}s max {v['max_s']}s "
            f"(from the fault's {v['measured_from']})"
        )
    rb = t["rebuilds"]
    if rb["wiped"]:
        print(
            f"wiped followers: {rb['wiped']}, {rb['rebuilt']} caught up with the leader "
            f"({rb['from_snapshot']} from a whole copy of the state, the others from the "
            f"leader's log) p50 {rb['p50_s']}s max {rb['max_s']}s after the restart"
        )
    nn = t["new_nodes"]
    if nn["joined"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(nn["by_kind"].items()))
        each = ", ".join(f"{x:.2f}" for x in nn["promoted_s"])
        print(
            f"new nodes: {nn['joined']} ({kinds}), {nn['promoted']} promoted to voter p50 "
            f"{nn['p50_s']}s max {nn['max_s']}s after their start (each: {each} s); "
            f"add_interrupted: the leader killed while the new node was a learner "
            f"{nn['learner_at_kill']} of {nn['interrupted']} times; removed nodes that stopped "
            f"with status 2 (restarted with their data, or removed while running): "
            f"{nn['removed_stopped']} of {nn['removed']}"
        )
    if t["violated_seeds"]:
        print(f"VIOLATIONS in seeds {t['violated_seeds']}")


async def main_async(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="schedd-torture-"))
    out.mkdir(parents=True, exist_ok=True)
    json_path = Path(args.json) if args.json else out / "torture.json"
    print(
        f"scripts/torture: {args.schedules} schedules from seed {args.seed}, "
        f"{args.duration:g}s of faults each; files in {out}"
    )
    print(
        "note: clock_skew shifts the node's Python wall clock (time.time/time_ns) in-process; "
        "libfaketime is not used (0.9.10 breaks Python 3.11 timed waits)"
    )
    started = time.monotonic()
    reports: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for i in range(args.schedules):
        if args.time_budget is not None and time.monotonic() - started > args.time_budget:
            print(f"time budget of {args.time_budget:g}s reached after {i} schedules")
            break
        seed = args.seed + i
        root = out / f"seed-{seed}"
        try:
            report = await run_schedule(
                seed,
                root,
                duration=args.duration,
                kinds=args.kinds,
                rate=args.rate,
                shards=args.shards,
            )
        except Exception:  # noqa: BLE001 - the harness failed, not an invariant: say so, go on
            errors.append({"seed": seed, "error": traceback.format_exc(), "files": str(root)})
            print(
                f"seed {seed}: ERROR (harness, not an invariant; files kept in {root})\n"
                + traceback.format_exc(limit=3),
                flush=True,
            )
            continue
        (root / "report.json").write_text(json.dumps(report, indent=1, default=str))
        reports.append(report)
        print(summary_line(report), flush=True)
        if not report["ok"]:
            for name, items in report["violations"].items():
                for item in items[:5]:
                    print(f"    {name}: {item}")
            print(f"    schedule: {[s['text'] for s in report['schedule']]}")
            print(f"    files kept in {root}")
        elif not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        t = totals(reports)
        json_path.write_text(
            json.dumps(
                {
                    "command": " ".join(["scripts/torture", *sys.argv[1:]]),
                    "elapsed_s": round(time.monotonic() - started, 1),
                    "totals": t,
                    "errors": errors,
                    "schedules": reports,
                },
                indent=1,
                default=str,
            )
        )
    t = totals(reports)
    print_totals(t, time.monotonic() - started)
    if errors:
        print(
            f"{len(errors)} schedules could not run (harness errors): {[e['seed'] for e in errors]}"
        )
    print(f"results: {json_path}")
    return 0 if reports and not t["violated_seeds"] and not errors else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_schedule:
        for i in range(args.schedules):
            print(f"seed {args.seed + i}:")
            for step in make_schedule(args.seed + i, args.duration, args.kinds):
                print("  " + step.describe())
        return 0
    return run_stoppable(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
