"""``schedctl dlq replay|drop`` of many runs: what filters or ``--all`` pick (or several run
ids) is counted first by a dry run of the bulk endpoint, printed, confirmed, and then exactly
the runs that were shown are sent by their ids (a run that failed into the queue meanwhile is
not taken along)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

from schedd.cli import render
from schedd.cli.client import Response, UsageError
from schedd.cli.requests import ApiRequest
from schedd.cli.settings import Settings

EXIT_OK = 0


def _ask(prompt: str, err: IO[str]) -> bool:
    """Whether the person at the terminal answers yes; None of it without a terminal."""
    err.write(prompt)
    err.flush()
    try:
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    except (OSError, ValueError):
        return False


def plan_lines(plan: Mapping[str, Any]) -> str:
    """The dry run's message, then the count of each task, the most first."""
    lines = [render.clean(str(plan.get("message", "")))]
    for entry in plan.get("tasks") or ():
        if isinstance(entry, Mapping):
            task, count = render.clean(str(entry.get("task"))), entry.get("count")
            lines.append(f"  {count:>7,}  {task}" if isinstance(count, int) else f"  {task}")
    return "\n".join(lines)


def bulk(
    call: Callable[[ApiRequest], Response],
    req: ApiRequest,
    action: str,
    *,
    dry_run: bool,
    yes: bool,
    settings: Settings,
    out: IO[bytes],
    err: IO[str],
    interactive: bool | None = None,
    ask: Callable[[str, IO[str]], bool] = _ask,
) -> int:
    """Count (``req`` is the dry run), print, confirm, then replay or drop the runs shown."""
    answer = call(req)
    plan = answer.json()
    count = int(plan.get("count") or 0)
    if dry_run or count == 0:
        if settings.output == "json":
            out.write(answer.body + b"\n")
        elif settings.quiet:
            out.write("\n".join(str(r) for r in plan.get("run_ids") or ()).encode() + b"\n")
        else:
            shown = (
                plan_lines(plan) if count else f"no dead-lettered run matches: nothing to {action}"
            )
            out.write(shown.encode() + b"\n")
        return EXIT_OK
    if not yes:
        tty = sys.stdin.isatty() if interactive is None else interactive
        if not tty:
            raise UsageError(
                f"{plan.get('message')}: pass --yes to {action} them without asking, or "
                "--dry-run to only count them"
            )
        err.write(plan_lines(plan) + "\n")
        if not ask(f"schedctl: {action} these {count:,} runs? [y/N] ", err):
            err.write("schedctl: nothing was done\n")
            return EXIT_OK
    body = {"dry_run": False, "run_ids": list(plan.get("run_ids") or ())}
    done = call(ApiRequest("POST", req.path, body=body))
    if settings.output == "json":
        out.write(done.body + b"\n")
    elif settings.quiet:
        out.write("\n".join(str(r) for r in done.json().get("run_ids") or ()).encode() + b"\n")
    else:
        out.write(plan_lines(done.json()).encode() + b"\n")
    return EXIT_OK
