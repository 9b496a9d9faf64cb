"""``schedctl dlq replay|drop`` of many runs: what filters or ``--all`` pick (or several run
ids) is counted first by a dry run of the bulk endpoint, printed, confirmed, and then exactly
the runs that were shown are sent by their ids (a run that failed into the queue meanwhile is
not taken along)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

from schedd.cli import render
from schedd.cli.client import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    CliError,
    Response,
    UsageError,
    write_text,
)
from schedd.cli.requests import ApiRequest
from schedd.cli.settings import Settings


def _ask(prompt: str, err: IO[str]) -> bool:
    """Whether the person at the terminal answers yes."""
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


def _show(answer: Response, settings: Settings, out: IO[bytes], text: str) -> None:
    """An answer as ``-o json`` (its body), ``-q`` (its run ids) or text."""
    if settings.output == "json":
        out.write(answer.body + b"\n")
    elif settings.quiet:
        write_text(out, "\n".join(str(r) for r in answer.json().get("run_ids") or ()))
    else:
        write_text(out, text)


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
    """Count (``req`` is the dry run), print, confirm (``ask``, on a terminal: ``interactive``,
    by default whether stdin is one), then replay or drop the runs shown."""
    answer = call(req)
    plan = answer.json()
    count = int(plan.get("count") or 0)
    named = (req.body or {}).get("run_ids")
    if count == 0 and named:  # the runs named are not in the queue: as for one run, a 404
        skipped = ", ".join(render.clean(str(r)) for r in plan.get("skipped") or named)
        raise CliError(
            f"not_found: none of these runs is in the dead-letter queue: {skipped}", EXIT_NOT_FOUND
        )
    if dry_run or count == 0:
        shown = plan_lines(plan) if count else f"no dead-lettered run matches: nothing to {action}"
        _show(answer, settings, out, shown)
        return EXIT_OK
    if not yes:
        if not (sys.stdin.isatty() if interactive is None else interactive):
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
    _show(done, settings, out, plan_lines(done.json()))
    return EXIT_OK
