"""One schedd node: the config, the start-up checks, the runtime and its signals.

Started by the ``schedd`` command (:mod:`schedd.cli.daemon`).  Every start-up failure an operator
can cause is one line on stderr naming the key or path, and a non-zero exit: 2 for the config
(and for a node that no peer accepts as configured), 1 for the machine (a port in use, a data
directory the service user cannot write, a missing package).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from schedd import __version__, aio, auth, datadir, preflight
from schedd.aio import first_set
from schedd.cli.settings import DEFAULT_TOKENS_FILE
from schedd.config import Config, check_files, load_config
from schedd.errors import ConfigError
from schedd.logs import JsonFormatter, log_event, set_level, setup_logging
from schedd.notify import Notifier

log = logging.getLogger("schedd.daemon")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="schedd",
        description="A schedd node. With no arguments: a single-node cluster on loopback, "
        "data in ./.schedd. schedd restore --from FILE --config PATH seeds a node of a new "
        "cluster from a backup (schedd restore --help). schedd inspect --data-dir DIR shows "
        "what a stopped node's data directory holds (schedd inspect --help). schedd recover "
        "--force-new-cluster --config PATH makes a survivor of a lost majority a one-node "
        "cluster (schedd recover --help).",
    )
    p.add_argument("--version", action="version", version=f"schedd {__version__}")
    _config_options(p)
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration, print problems, and exit",
    )
    return p.parse_args(argv)


def parse_restore_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="schedd restore",
        description="Seed this node of a new cluster from a backup (schedctl snapshot save): "
        "the image is checked whole and its state written into the empty node.data_dir, with "
        "a Raft log that starts at the image's applied index. Restore every node of the new "
        "cluster from the same file, then start them. Run it as the user the service runs as "
        "(sudo -u schedd schedd restore ...); run as root, it gives the files it writes to "
        "the owner of node.data_dir.",
    )
    p.add_argument(
        "--from",
        dest="image",
        required=True,
        metavar="FILE",
        help="the image to restore (schedctl snapshot save FILE)",
    )
    _config_options(p)
    return p.parse_args(argv)


def _config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="TOML config file (see config/schedd.example.toml)")
    p.add_argument("--node-id", help="this node's id (node.id)")
    p.add_argument(
        "--data-dir", help="where Raft journal, snapshots and tokens live (node.data_dir)"
    )
    p.add_argument("--http", help="HTTP API listen address host:port (http.listen)")
    p.add_argument("--raft", help="Raft listen address host:port (raft.listen)")
    p.add_argument(
        "--peer",
        action="append",
        default=None,
        help="another node's Raft host:port (repeatable; raft.peers)",
    )
    p.add_argument("--log-level", help="debug | info | warning | error (log.level)")


def build_config(args: argparse.Namespace) -> Config:
    overrides: dict[str, object] = {
        "node.id": args.node_id,
        "node.data_dir": args.data_dir,
        "http.listen": args.http,
        "raft.listen": args.raft,
        "raft.peers": args.peer,
        "log.level": args.log_level,
    }
    cfg = load_config(args.config, overrides={k: v for k, v in overrides.items() if v is not None})
    problems = check_files(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


async def serve(cfg: Config, args: argparse.Namespace) -> int:
    from schedd.runtime import Runtime

    notifier = Notifier()
    rt = Runtime(cfg)
    await rt.start()
    notifier.ready(f"node {cfg.node.id} serving {cfg.advertise_url()}")
    watchdog = asyncio.create_task(notifier.watchdog())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: reload_node(rt, args))
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    await first_set(stop, rt.failed)
    log_event(log, "node.stopping", node_id=cfg.node.id)
    notifier.stopping()
    watchdog.cancel()
    await rt.stop()
    if rt.failure is not None:
        print(f"schedd: {rt.failure}", file=sys.stderr)
        return 2
    return 0


async def _serve_sharded(cfg: Config, args: argparse.Namespace, argv: list[str]) -> int:
    from schedd.shard.supervisor import serve_sharded

    return await serve_sharded(cfg, argv, lambda: reload_log_level(args))


def _dump_tasks() -> None:
    """SIGUSR1: log every asyncio task with its stack (for a node that seems stuck)."""
    for task in asyncio.all_tasks():
        frames = [
            f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}" for f in task.get_stack()
        ]
        log_event(
            log,
            "debug.task",
            level=logging.WARNING,
            task=task.get_name(),
            coro=repr(task.get_coro()),
            stack=frames,
        )


def reload_node(rt: object, args: argparse.Namespace) -> None:
    """SIGHUP: reload the tokens file and the log level; anything else needs a restart."""
    from schedd.runtime import Runtime

    assert isinstance(rt, Runtime)
    try:
        rt.tokens = auth.load_tokens(rt.config.tokens_path)
        log_event(log, "tokens.reloaded", count=len(rt.tokens))
    except ConfigError as exc:
        log_event(log, "tokens.reload_failed", level=logging.ERROR, problems=exc.problems)
    reload_log_level(args)


def reload_log_level(args: argparse.Namespace) -> None:
    """Read ``log.level`` again from the config the node was started with."""
    try:
        level = build_config(args).log.level
    except ConfigError as exc:
        log_event(log, "config.reload_failed", level=logging.ERROR, problems=exc.problems)
        return
    set_level(level)
    log_event(log, "log.level_reloaded", level_name=level)


def _print_problems(problems: list[str], prefix: str = "schedd: ") -> None:
    for problem in problems:
        print(f"{prefix}{problem}", file=sys.stderr)


def _prepare_tokens(cfg: Config) -> tuple[bool, list[str]]:
    """Create the tokens file with an admin token when there is none: (created, problems)."""
    key = "auth.tokens_file" if cfg.auth.tokens_file is not None else "node.data_dir"
    try:
        _, created = auth.ensure_admin_token(cfg.tokens_path)
    except ConfigError as exc:
        return False, exc.problems
    except OSError as exc:
        return False, [
            f'{key}: cannot read or create the tokens file "{cfg.tokens_path}": '
            f"{exc.strerror or exc} (schedd runs as {preflight.run_as()})"
        ]
    return created, []


def _banner(cfg: Config, created: bool) -> None:
    url = cfg.advertise_url()
    print(
        f"schedd node {cfg.node.id}: API {url}  raft {cfg.raft.listen}"
        + (f"  peers {', '.join(cfg.raft.peers)}" if cfg.raft.peers else "  (single-node cluster)"),
        file=sys.stderr,
    )
    print(
        f"  tokens: {cfg.tokens_path}" + (" (admin token created)" if created else ""),
        file=sys.stderr,
    )
    if cfg.tokens_path.resolve() == DEFAULT_TOKENS_FILE.resolve():
        how = "schedctl and schedd-worker run here read the admin token from ./.schedd/tokens.toml"
    else:
        how = (
            f"give schedctl and schedd-worker a token: --token-file {cfg.tokens_path} "
            "or SCHEDD_TOKEN"
        )
    print(
        f"  try:    SCHEDD_SERVER={url} schedctl submit demo.echo --payload '{{\"hi\": 1}}'\n"
        f"          schedd-worker --server {url} --import schedd.worker.demo_tasks\n"
        f"  dashboard: {url}/ui/ (SCHEDD_SERVER={url} schedctl ui logs you in)\n"
        f"  ({how})",
        file=sys.stderr,
    )


def _check_config(cfg: Config) -> int:
    """``schedd --check-config``: 2 with the problems, else "config ok" (and what the size of
    the cluster means for failures, as warnings)."""
    problems = preflight.check_modules(cfg) + datadir.check_record(cfg)
    if problems:
        _print_problems(problems, "schedd: config: ")
        return 2
    for warning in preflight.size_warnings(cfg):
        print(f"schedd: config: warning: {warning}", file=sys.stderr)
    print("config ok")
    return 0


def _node_config(args: argparse.Namespace) -> Config | int:
    """The node's config, or 2 once its problems are printed."""
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        _print_problems(exc.problems, "schedd: config: ")
        return 2
    return cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["inspect"]:
        from schedd.cli.inspect import main as inspect_main

        return inspect_main(argv[1:])
    if argv[:1] == ["restore"]:
        from schedd.cli.restore import restore

        args = parse_restore_args(argv[1:])
        try:
            cfg = build_config(args)
        except ConfigError as exc:
            _print_problems(exc.problems, "schedd restore: config: ")
            return 2
        return restore(cfg, args.image)
    if argv[:1] == ["recover"]:
        from schedd.cli import recover

        args = recover.parse_args(argv[1:], _config_options)
        try:
            cfg = build_config(args)
        except ConfigError as exc:
            _print_problems(exc.problems, "schedd recover: config: ")
            return 2
        return recover.recover(cfg)
    args = parse_args(argv)
    loaded = _node_config(args)
    if isinstance(loaded, int):
        return loaded
    cfg = loaded
    if args.check_config:
        return _check_config(cfg)
    json_logs = isinstance(setup_logging(cfg.log.level, cfg.log.format).formatter, JsonFormatter)
    problems = preflight.check(cfg)
    if problems:
        _print_problems(problems)
        return 1
    problems = datadir.ensure_record(cfg)
    if problems:
        _print_problems(problems, "schedd: config: ")
        return 2
    created, problems = _prepare_tokens(cfg)
    if problems:
        _print_problems(problems)
        return 2
    if json_logs:  # under systemd: the journal gets JSON lines, not a banner for a terminal
        log_event(log, "tokens.ready", path=str(cfg.tokens_path), created=created)
    else:
        _banner(cfg, created)
    main_coro = serve(cfg, args) if cfg.cluster.shards == 1 else _serve_sharded(cfg, args, argv)
    try:
        return aio.run(main_coro)
    except ConfigError as exc:
        _print_problems(exc.problems, "schedd: config: ")
        return 2
    except OSError as exc:
        print(f"schedd: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
