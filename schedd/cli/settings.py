"""Where ``schedctl`` connects and as whom: the servers, token, output format, timeout and CA
from flags (before or after the command), the environment and defaults."""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from schedd.cli.client import (
    UsageError,
    parse_server,
    tls_context,
)
from schedd.client.servers import DEFAULT_SERVER, Server

DEFAULT_TOKENS_FILE = Path(".schedd") / "tokens.toml"

# ---- settings: servers and token -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    servers: tuple[Server, ...]
    token: str | None
    output: str
    timeout: float
    #: the CAs of --cacert / SCHEDD_CACERT for https servers; None: the system's trusted CAs
    ssl_context: ssl.SSLContext | None = None
    quiet: bool = False  # -q: ids only


def _split(values: Sequence[str]) -> list[str]:
    return [part for value in values for part in value.split(",") if part.strip()]


def read_token_file(path: Path) -> str | None:
    """A plain token file (the whole file, stripped), or a tokens.toml: its first admin token."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml" or "[[token]]" in text:
        import tomllib

        try:
            tokens = tomllib.loads(text).get("token")
        except tomllib.TOMLDecodeError:
            return None
        if not isinstance(tokens, list):
            return None
        for entry in tokens:
            if isinstance(entry, dict) and entry.get("role") == "admin":
                secret = entry.get("secret")
                if isinstance(secret, str) and secret:
                    return secret
        return None
    return text.strip() or None


def local_token(servers: Sequence[Server], cwd: Path | None = None) -> str | None:
    """The admin token the embedded default (``schedd`` with no config) keeps in
    ``./.schedd/tokens.toml``, for servers that are all on this machine (it is never sent
    elsewhere); None when there is none (yet)."""
    if not all(s.is_loopback for s in servers):
        return None
    try:
        return read_token_file((cwd or Path.cwd()) / DEFAULT_TOKENS_FILE)
    except (OSError, UnicodeDecodeError):
        return None


def resolve_settings(
    args: argparse.Namespace, env: Mapping[str, str], cwd: Path | None = None
) -> Settings:
    """Flags (before or after the command) over environment over defaults."""
    flags = list(args.server or []) + list(getattr(args, "server_after", []))
    raw = _split(flags) or _split([env.get("SCHEDD_SERVER", "")]) or [DEFAULT_SERVER]
    servers = tuple(parse_server(s) for s in raw)
    output = getattr(args, "output_after", None) or args.output or "table"
    token = getattr(args, "token_after", None) or args.token
    token_file = getattr(args, "token_file_after", None) or args.token_file
    if token is None and token_file is not None:
        try:
            token = read_token_file(Path(token_file))
        except OSError as exc:
            raise UsageError(
                f"--token-file: cannot read {token_file!r}: {exc.strerror or exc}"
            ) from None
        if token is None:
            raise UsageError(
                f"--token-file: no token in {token_file!r} (expected the token "
                f"itself, or a tokens.toml with an admin [[token]])"
            )
    if token is None:
        token = env.get("SCHEDD_TOKEN") or None
    if token is None:
        token = local_token(servers, cwd)
    ssl_context = None
    if getattr(args, "cacert", None):
        ssl_context = tls_context(args.cacert, "--cacert")
    elif env.get("SCHEDD_CACERT"):
        ssl_context = tls_context(env["SCHEDD_CACERT"], "SCHEDD_CACERT")
    quiet = bool(getattr(args, "quiet", False) or getattr(args, "quiet_after", False))
    return Settings(servers, token, output, args.http_timeout, ssl_context, quiet)
