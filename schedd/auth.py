"""Bearer tokens and roles.  Deny by default.

The tokens file (reloaded on SIGHUP) holds ``[[token]]`` entries with ``name``, ``secret`` and
``role`` (``admin`` | ``submit`` | ``read`` | ``worker``).  Secrets are kept in memory only as
SHA-256 digests and compared in constant time against every token; they are never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from schedd.errors import ConfigError, PermissionDenied, Unauthenticated

__all__ = [
    "ACTIONS",
    "MIN_SECRET_CHARS",
    "SESSION_PREFIX",
    "LoginCodes",
    "Role",
    "Token",
    "TokenStore",
    "ensure_admin_token",
    "load_tokens",
    "require",
]

log = logging.getLogger(__name__)

MIN_SECRET_CHARS: Final = 16


class Role(StrEnum):
    ADMIN = "admin"
    SUBMIT = "submit"
    READ = "read"
    WORKER = "worker"


#: which roles may perform each action
ACTIONS: Final[dict[str, frozenset[Role]]] = {
    "read": frozenset({Role.ADMIN, Role.SUBMIT, Role.READ, Role.WORKER}),
    "submit": frozenset({Role.ADMIN, Role.SUBMIT}),
    "admin": frozenset({Role.ADMIN}),
    "worker": frozenset({Role.ADMIN, Role.WORKER}),
}


@dataclass(frozen=True)
class Token:
    """An authenticated identity.  Holds no secret."""

    name: str
    role: Role


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


#: a dashboard session token: ``ui1.<name, base64url>.<role>.<expiry, unix s>.<mac, base64url>``
SESSION_PREFIX: Final = "ui1."
_SESSION_KEY_LABEL: Final = b"schedd dashboard session v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenStore:
    """The known tokens; :meth:`authenticate` turns an ``Authorization`` header into a Token.

    Besides the tokens of the file it takes the dashboard's session tokens (:meth:`session`):
    signed with a key derived from the secret of the token that opened the session, so any node
    that has that token verifies them without shared state, and changing or removing the token
    (a reload) ends its sessions."""

    def __init__(self, entries: Iterable[tuple[Token, str]] = ()) -> None:
        self._entries: tuple[tuple[bytes, Token], ...] = tuple(
            (_digest(secret), token) for token, secret in entries
        )
        self._keys: dict[str, tuple[bytes, Token]] = {
            token.name: (hmac.digest(digest, _SESSION_KEY_LABEL, "sha256"), token)
            for digest, token in self._entries
        }

    def session(self, token: Token, expires_s: int, read_only: bool = False) -> str:
        """A session token for ``token`` valid until ``expires_s`` (unix seconds), with its
        role or (``read_only``) the read role; :class:`Unauthenticated` when the store no longer
        has ``token`` as it was."""
        found = self._keys.get(token.name)
        if found is None or found[1] != token:
            raise Unauthenticated("the token that asked for this login was changed or removed")
        key = found[0]
        role = Role.READ if read_only else token.role
        body = f"{_b64(token.name.encode())}.{role.value}.{expires_s}"
        mac = hmac.digest(key, body.encode(), "sha256")
        return f"{SESSION_PREFIX}{body}.{_b64(mac)}"

    def _from_session(self, secret: str, now_s: float) -> Token:
        expired = Unauthenticated(
            "this dashboard session has expired or its token was changed: open a new one "
            "(schedctl ui) or log in with a token"
        )
        parts = secret.removeprefix(SESSION_PREFIX).split(".")
        if len(parts) != 4 or not parts[2].isdigit():
            raise Unauthenticated("invalid token")
        name_b64, role, expires, mac = parts
        try:
            name = _unb64(name_b64).decode()
            given = _unb64(mac)
        except (ValueError, UnicodeDecodeError):
            raise Unauthenticated("invalid token") from None
        found = self._keys.get(name)
        if found is None:
            raise expired
        key, token = found
        body = f"{name_b64}.{role}.{expires}".encode()
        if not hmac.compare_digest(hmac.digest(key, body, "sha256"), given):
            raise expired
        if int(expires) <= now_s:
            raise expired
        if role == token.role.value:
            return token
        if role == Role.READ.value and token.role in ACTIONS["submit"]:  # a read-only session
            return Token(token.name, Role.READ)
        raise expired  # the token's role changed since

    @property
    def tokens(self) -> tuple[Token, ...]:
        return tuple(token for _, token in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TokenStore({[t.name for t in self.tokens]!r})"

    def authenticate(self, authorization_header: str | None) -> Token:
        """``"Bearer <secret>"`` → the matching Token; :class:`Unauthenticated` otherwise."""
        if not authorization_header or not authorization_header.strip():
            raise Unauthenticated(
                "missing Authorization header: send 'Authorization: Bearer <token>'"
            )
        scheme, _, secret = authorization_header.strip().partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise Unauthenticated(
                "malformed Authorization header: expected 'Authorization: Bearer <token>'"
            )
        if secret.startswith(SESSION_PREFIX):
            return self._from_session(secret, time.time())
        presented = _digest(secret)
        found: Token | None = None
        for digest, token in self._entries:  # no early exit: every token is compared
            if hmac.compare_digest(digest, presented) and found is None:
                found = token
        if found is None:
            raise Unauthenticated("invalid token")
        return found


class LoginCodes:
    """One-time codes that open a dashboard session (``schedctl ui``), kept in this node's
    memory: each stands for the token that asked for it (and whether the session is to be
    read-only), is good once, for :attr:`ttl_s` seconds.  Kept as digests; at most
    :attr:`cap` at once (the oldest go first)."""

    def __init__(
        self, ttl_s: float = 60.0, cap: int = 1000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s, self.cap, self._clock = ttl_s, cap, clock
        self._codes: dict[bytes, tuple[float, Token, bool]] = {}  # digest -> (expiry, ...)

    def issue(self, token: Token, read_only: bool = False) -> str:
        now = self._clock()
        codes = self._codes
        for digest, (expires, _, _) in list(codes.items()):  # oldest first
            if expires > now and len(codes) < self.cap:
                break
            del codes[digest]
        code = secrets.token_urlsafe(32)
        codes[_digest(code)] = (now + self.ttl_s, token, read_only)
        return code

    def take(self, code: str) -> tuple[Token, bool]:
        """The token (and read-only) ``code`` stands for; it is used up.  :class:`Unauthenticated`
        when it is unknown, used or expired."""
        found = self._codes.pop(_digest(code), None)
        if found is None or found[0] <= self._clock():
            raise Unauthenticated(
                "this login code is unknown, used or expired (a code is good once, for "
                f"{self.ttl_s:g} s, on the node that made it): run schedctl ui again"
            )
        return found[1], found[2]


def require(token: Token, action: str) -> None:
    """Raise :class:`PermissionDenied` unless ``token``'s role may perform ``action``
    (``read`` | ``submit`` | ``admin`` | ``worker``)."""
    try:
        allowed = ACTIONS[action]
    except KeyError:
        raise ValueError(f"unknown action {action!r}") from None
    if token.role not in allowed:
        raise PermissionDenied(
            f"token {token.name!r} has role {token.role.value!r}, which may not perform "
            f"{action!r} (allowed: {', '.join(sorted(r.value for r in allowed))})"
        )


_ENTRY_KEYS: Final = ("name", "secret", "role")
_ROLE_NAMES: Final = frozenset(r.value for r in Role)


def _kind(value: object) -> str:
    """How an error names a value of the wrong type: never the value (it may be a secret)."""
    return "nothing" if value is None else type(value).__name__


def _parse_entry(i: int, entry: object, problems: list[str]) -> tuple[Token, str] | None:
    where = f"token[{i}]"
    if not isinstance(entry, dict):
        problems.append(f"{where}: expected a table with name, secret and role")
        return None
    start = len(problems)
    for key in entry:
        if key not in _ENTRY_KEYS:
            problems.append(f"{where}.{key}: unknown key (expected one of: name, secret, role)")
    name, secret, role = entry.get("name"), entry.get("secret"), entry.get("role")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{where}.name: expected a non-empty string")
    if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS:
        got = f"{len(secret)} characters" if isinstance(secret, str) else _kind(secret)
        problems.append(
            f"{where}.secret: expected a string of at least {MIN_SECRET_CHARS} characters, "
            f"got {got}"  # never the secret itself
        )
    elif secret.startswith(SESSION_PREFIX):
        problems.append(
            f"{where}.secret: starts with {SESSION_PREFIX!r}, which marks a dashboard session"
        )
    elif secret != secret.strip():
        # authenticate() strips the header, so such a token could never be presented
        problems.append(
            f"{where}.secret: starts or ends with whitespace, which a client cannot send"
        )
    # isinstance first: a list or a table is unhashable, and `in` a set would raise TypeError
    if not isinstance(role, str) or role not in _ROLE_NAMES:
        got = json.dumps(role) if isinstance(role, str) else _kind(role)
        problems.append(f"{where}.role: expected one of admin, submit, read, worker, got {got}")
    if len(problems) > start:
        return None
    assert isinstance(name, str) and isinstance(secret, str) and isinstance(role, str)
    return Token(name.strip(), Role(role)), secret


def _parse_tokens(path: Path) -> tuple[list[tuple[Token, str]], int]:
    """The entries of the tokens file and its mode: that of the file read, by its descriptor
    (a file replaced after the read is not the one whose mode matters)."""
    try:
        with path.open("rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError([f"{path}: tokens file not found"]) from None
    except OSError as e:
        raise ConfigError([f"{path}: cannot read the tokens file: {e.strerror or e}"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    problems: list[str] = []
    for key in data:
        if key != "token":
            problems.append(f"{key}: unknown key (expected [[token]] entries)")
    entries = data.get("token", [])
    if not isinstance(entries, list):
        problems.append("token: expected [[token]] entries (an array of tables)")
        entries = []
    if not entries and not problems:
        problems.append("token: expected at least one [[token]] entry")
    out: list[tuple[Token, str]] = []
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    for i, entry in enumerate(entries):
        parsed = _parse_entry(i, entry, problems)
        if parsed is None:
            continue
        token, secret = parsed
        if token.name in names:
            problems.append(f"token[{i}].name: duplicate of token[{names[token.name]}]")
        names.setdefault(token.name, i)
        digest = _digest(secret)
        if digest in digests:
            problems.append(f"token[{i}].secret: same secret as token[{digests[digest]}]")
        digests.setdefault(digest, i)
        out.append(parsed)
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return out, mode


def load_tokens(path: str | os.PathLike[str]) -> TokenStore:
    """Parse a tokens file; :class:`ConfigError` names each bad entry (``token[2].role``, 0-based)."""
    p = Path(path)
    entries, mode = _parse_tokens(p)
    if mode & 0o077:
        log.warning(
            "tokens file is readable by other users",
            extra={"fields": {"path": str(p), "mode": oct(mode & 0o777)}},
        )
    return TokenStore(entries)


def _admin_file_text(secret: str) -> bytes:
    return (
        "# schedd API tokens (reloaded on SIGHUP). Roles: admin | submit | read | worker.\n"
        "# Clients send 'Authorization: Bearer <secret>'.\n"
        "[[token]]\n"
        'name = "admin"\n'
        f'secret = "{secret}"\n'
        'role = "admin"\n'
    ).encode()


def _create_exclusive(path: Path, content: bytes) -> bool:
    """Create ``path`` with mode 0600 holding ``content``, atomically; False if it exists."""
    fd, tmp = tempfile.mkstemp(prefix=".tokens.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic and never replaces an existing file
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


def new_secret() -> str:
    """43 URL-safe random characters (256 bits) that never start with ``-``, so the secret can
    follow ``--token`` on a command line without being taken for an option."""
    while True:
        secret = secrets.token_urlsafe(32)
        if not secret.startswith("-"):
            return secret


def ensure_admin_token(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """Make sure a tokens file exists.  When it does not, create it (mode 0600; its directory,
    when missing, 0700, and any missing parents of that as ``mkdir -p`` does) holding one admin
    token named ``admin`` and return ``(secret, True)``.  When it does, return ``(secret of its
    first admin token or "", False)``."""
    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret = new_secret()
        if _create_exclusive(p, _admin_file_text(secret)):
            return secret, True
    entries, _ = _parse_tokens(p)
    for token, secret in entries:
        if token.role is Role.ADMIN:
            return secret, False
    return "", False
