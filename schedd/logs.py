"""Logging: one event per line, JSON (for machines, e.g. under systemd) or readable text.

Every record is an *event* with fields.  Use :func:`log_event`::

    log_event(log, "raft.leader_elected", term=7, leader="n2")

which is ``log.info("raft.leader_elected", extra={"fields": {"term": 7, "leader": "n2"}})``.
JSON lines carry ``ts``, ``level``, ``logger``, ``event`` and the fields; text lines read
``ts LEVEL logger event key=value ...``.  An exception becomes one ``exc`` field, so every
event stays on one line.  Fields whose name says they hold a secret are redacted.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, Any, Final

import orjson

__all__ = [
    "JsonFormatter",
    "TextFormatter",
    "log_event",
    "parse_level",
    "set_level",
    "setup_logging",
]

LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_RESERVED: Final = frozenset({"ts", "level", "logger", "event", "exc"})
_SECRET_NAME = re.compile(r"secret|password|passwd|authorization|credential", re.IGNORECASE)
REDACTED: Final = "[redacted]"


def parse_level(level: str | int) -> int:
    """``"info"`` → ``logging.INFO``; raises :class:`ValueError` for an unknown level."""
    if isinstance(level, int):
        return level
    try:
        return LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown log level {level!r} (expected debug, info, warning, error, critical)"
        ) from None


def _ts(created: float) -> str:
    dt = datetime.fromtimestamp(created, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    raw = getattr(record, "fields", None)
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key)
        if name in _RESERVED:
            name = f"field_{name}"
        out[name] = REDACTED if _SECRET_NAME.search(name) else value
    return out


def _exc(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    if record.exc_info and record.exc_info[0] is not None:
        return formatter.formatException(record.exc_info)
    if record.exc_text:
        return record.exc_text
    return None


def _default(value: object) -> str:
    return str(value)


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": "info", "logger": ..., "event": ..., <fields>, "exc": ...}``"""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": _ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        body.update(_fields(record))
        exc = _exc(self, record)
        if exc is not None:
            body["exc"] = exc
        if record.stack_info:
            body["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(body, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()


_BARE = re.compile(r"^[A-Za-z0-9_.:/@+,\-\[\]]+$")


def _text_value(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return orjson.dumps(value).decode()
    if isinstance(value, int | float):
        return repr(value)
    text = value if isinstance(value, str) else None
    if text is not None and _BARE.match(text):
        return text
    if text is not None:
        return orjson.dumps(text).decode()
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(logging.Formatter):
    """``2026-11-25T02:00:00.000Z INFO schedd.raft leader_elected term=7 leader=n2``"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_ts(record.created), record.levelname, record.name, record.getMessage()]
        fields = _fields(record)
        exc = _exc(self, record)
        if exc is not None:
            fields["exc"] = exc
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        parts.extend(f"{k}={_text_value(v)}" for k, v in fields.items())
        return " ".join(parts)


class _SchedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler :func:`setup_logging` installed, so a second call replaces it."""


def _wants_json(fmt: str, env: Mapping[str, str]) -> bool:
    fmt = fmt.strip().lower()
    if fmt == "json":
        return True
    if fmt == "text":
        return False
    if fmt == "auto":
        return bool(env.get("JOURNAL_STREAM"))
    raise ValueError(f"unknown log format {fmt!r} (expected auto, json, text)")


def setup_logging(
    level: str | int = "info",
    fmt: str = "auto",
    *,
    stream: IO[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> logging.Handler:
    """Send every log record to ``stream`` (default stderr) at ``level`` or above, as JSON
    lines when ``fmt`` is ``json`` (or ``auto`` under systemd, i.e. ``JOURNAL_STREAM`` set),
    as text otherwise.  Calling it again (on SIGHUP) replaces the previous setup."""
    numeric = parse_level(level)
    use_json = _wants_json(fmt, os.environ if env is None else env)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _SchedHandler)]:
        root.removeHandler(old)
        old.close()
    handler = _SchedHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler


def set_level(level: str | int) -> None:
    """Change the root level (SIGHUP reload of ``log.level``)."""
    logging.getLogger().setLevel(parse_level(level))


def log_event(
    logger: logging.Logger | str,
    event: str,
    level: int = logging.INFO,
    *,
    exc_info: Any = None,
    **fields: Any,
) -> None:
    """Log one event with fields: ``log_event(log, "lease.granted", run_id=..., fence=7)``."""
    lg = logging.getLogger(logger) if isinstance(logger, str) else logger
    if lg.isEnabledFor(level):
        lg.log(level, event, exc_info=exc_info, extra={"fields": fields}, stacklevel=2)
