"""Where a client connects: the server URLs that ``schedctl``, the worker SDK's users and
:mod:`schedd.client` write, and the ``Retry-After`` a server answers.  One definition, so every
client reads ``--server`` / ``SCHEDD_SERVER`` the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import quote, urlsplit

from schedd.errors import InvalidArgument
from schedd.net import is_loopback

DEFAULT_SERVER = "http://127.0.0.1:7700"
DEFAULT_PORT = 7700


@dataclass(frozen=True)
class Server:
    scheme: str
    host: str
    port: int
    base_path: str
    url: str  # as shown in messages

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)


def parse_server(text: str, field: str = "--server") -> Server:
    """``http://host:port``, ``https://host``, or a bare ``host:port`` (then http on 7700).
    A worker's ``ws://``/``wss://`` URL means the same node over ``http``/``https``.  A bad one
    is an ``InvalidArgument`` naming ``field``."""
    raw = text.strip()
    expected = f"{field}: expected a URL like {DEFAULT_SERVER}, got {text!r}"
    if not raw:
        raise InvalidArgument(expected, field=field)
    if "://" not in raw:
        raw = "http://" + raw
    elif raw.lower().startswith(("ws://", "wss://")):
        raw = "http" + raw[2:]  # ws:// → http://, wss:// → https://
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        raise InvalidArgument(expected, field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(expected, field=field)
    if port is None:
        port = DEFAULT_PORT if "://" not in text else (443 if parts.scheme == "https" else 80)
    host = parts.hostname
    shown_host = f"[{host}]" if ":" in host else host
    base = parts.path.rstrip("/")
    return Server(parts.scheme, host, port, base, f"{parts.scheme}://{shown_host}:{port}{base}")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def job_path(job_id: str, suffix: str = "") -> str:
    """``/api/v1/jobs/<id><suffix>`` with the (opaque) id escaped."""
    return f"/api/v1/jobs/{quote(job_id, safe='')}{suffix}"


def run_path(run_id: str, suffix: str = "", *, under: str = "runs") -> str:
    """``/api/v1/<under>/<run id><suffix>`` (``under`` is ``runs`` or ``dlq``) with the run id
    escaped: run ids are ``<job id>@<milliseconds>``, and the job id part is opaque."""
    return f"/api/v1/{under}/{quote(run_id, safe='')}{suffix}"
