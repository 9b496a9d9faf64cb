"""``schedd-worker``: run a worker from the shell.

    schedd-worker --server http://10.0.0.1:7700 --queue default --concurrency 8 --import my.tasks
    schedd-worker --server https://10.0.0.1:7700 --cacert /etc/schedd/tls/ca.pem ...

Exit codes: 0 after a clean drain · 2 usage (bad flag, unreadable token file, module that
cannot be imported).
"""

from __future__ import annotations

import argparse
import importlib
import os
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from schedd import __version__
from schedd.cli.settings import DEFAULT_TOKENS_FILE, read_token_file
from schedd.logs import setup_logging
from schedd.net import is_loopback
from schedd.worker import Worker
from schedd.worker.client import WorkerRefused, normalise_server, tls_context

DEFAULT_SERVER = "http://127.0.0.1:7700"
LOG_LEVELS = ("debug", "info", "warning", "error")


def _concurrency(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"expected 1..10000, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="schedd-worker",
        description="Run a schedd worker: connect to the cluster, take leases, run handlers.",
        epilog="Environment: SCHEDD_SERVER (comma-separated URLs), SCHEDD_TOKEN, "
        "SCHEDD_CACERT. With no token and only local servers, the admin token of a local `schedd` in ./.schedd/tokens.toml "
        "is used.",
    )
    p.add_argument("--version", action="version", version=f"schedd-worker {__version__}")
    p.add_argument(
        "--server",
        action="append",
        metavar="URL",
        help=f"a schedd node (repeatable; default $SCHEDD_SERVER or {DEFAULT_SERVER})",
    )
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--token", metavar="T", help="bearer token (default $SCHEDD_TOKEN)")
    auth.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the token (or a tokens.toml: its first admin token)",
    )
    p.add_argument(
        "--cacert",
        metavar="FILE",
        help="PEM file with the CA certificate(s) to trust for https/wss servers instead of "
        "the system's (default $SCHEDD_CACERT)",
    )
    p.add_argument(
        "--queue",
        action="append",
        metavar="Q",
        help="queue to take work from (repeatable; default: default)",
    )
    p.add_argument(
        "--concurrency",
        type=_concurrency,
        default=8,
        metavar="N",
        help="leases run at once (1..10000; default 8)",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="module whose @schedd.worker.task handlers to serve (repeatable)",
    )
    p.add_argument(
        "--allow-shell",
        action="store_true",
        help="enable the built-in 'shell' task (argv lists, never through a shell)",
    )
    p.add_argument("--worker-id", metavar="ID", help="default: hostname-pid-random")
    p.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long to let running handlers finish (default 30)",
    )
    p.add_argument(
        "--log-level", type=str.lower, choices=LOG_LEVELS, default="info", help="default: info"
    )
    return p


def _servers(flags: list[str] | None) -> list[str]:
    raw = flags or os.environ.get("SCHEDD_SERVER", "").split(",")
    servers = [s.strip() for item in raw for s in item.split(",") if s.strip()]
    return servers or [DEFAULT_SERVER]


def _is_loopback(url: str) -> bool:
    try:
        return is_loopback(urlsplit(normalise_server(url)).hostname or "")
    except ValueError:
        return False


def _token(
    parser: argparse.ArgumentParser, args: argparse.Namespace, servers: list[str]
) -> str | None:
    """--token, else --token-file (the token itself, or a tokens.toml: its first admin token),
    else $SCHEDD_TOKEN, else -- for servers on this machine only -- the admin token that a
    local ``schedd`` with no config keeps in ./.schedd/tokens.toml."""
    if args.token_file:
        try:
            token = read_token_file(Path(args.token_file))
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--token-file: cannot read {args.token_file}: {exc}")
        if not token:
            parser.error(
                f"--token-file: no token in {args.token_file} (expected the token "
                "itself, or a tokens.toml with an admin [[token]])"
            )
        return token
    value: str | None = args.token if args.token is not None else os.environ.get("SCHEDD_TOKEN")
    if not value and all(_is_loopback(s) for s in servers):
        try:
            value = read_token_file(Path.cwd() / DEFAULT_TOKENS_FILE)
        except (OSError, UnicodeDecodeError):
            value = None
    return value or None


def _tls(parser: argparse.ArgumentParser, flag: str | None) -> ssl.SSLContext | None:
    """--cacert, else $SCHEDD_CACERT: the CAs trusted for https/wss servers (None: the
    system's)."""
    cafile, what = (
        (flag, "--cacert") if flag else (os.environ.get("SCHEDD_CACERT"), "SCHEDD_CACERT")
    )
    if not cafile:
        return None
    try:
        return tls_context(cafile, what)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        servers = _servers(args.server)
        token = _token(parser, args, servers)
        ssl_context = _tls(parser, args.cacert)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # `--import my.tasks` from the project directory
        for name in args.imports:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - whatever the user's module raises
                parser.error(f"--import {name}: {type(exc).__name__}: {exc}")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    # the nodes' format: UTC with milliseconds and a Z, fields as key=value (JSON lines under
    # systemd, or with SCHEDD_LOG_FORMAT=json)
    try:
        setup_logging(args.log_level, os.environ.get("SCHEDD_LOG_FORMAT", "auto"))
    except ValueError as exc:  # an unknown SCHEDD_LOG_FORMAT: a usage error, no traceback
        print(f"schedd-worker: SCHEDD_LOG_FORMAT: {exc}", file=sys.stderr)
        return 2
    try:
        worker = Worker(
            servers,
            token=token,
            queues=args.queue or ["default"],
            concurrency=args.concurrency,
            worker_id=args.worker_id,
            allow_shell=args.allow_shell,
            drain_timeout=args.drain_timeout,
            ssl_context=ssl_context,
        )
    except ValueError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    try:
        worker.run()
    except WorkerRefused as exc:
        sys.stderr.write(f"{parser.prog}: {exc}\n")
        return 3
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
