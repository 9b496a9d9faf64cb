"""The daemon's configuration: TOML file, then ``SCHEDD_<SECTION>_<KEY>`` env vars, then flags.

Every key lives in one frozen dataclass per section; each field carries its TOML key and its
parser in the field metadata, so the schema, the defaults and the validation cannot drift
apart.  Durations are written as ``"60s"``/``"1h30m"`` or a number of seconds in TOML and are
held as integer milliseconds (the attribute carries an ``_ms`` suffix, the TOML key does not:
``scheduler.heartbeat_timeout`` → ``SchedulerConfig.heartbeat_timeout_ms``).

:func:`load_config` collects every problem and raises one :class:`~schedd.errors.ConfigError`
with one message per problem, each naming its key path (``raft.peers[1]: expected host:port,
got "x"``).  Indexes in key paths are 0-based.  File checks that touch the disk (secret file,
TLS files) are kept apart in :func:`check_files`, the Raft secret is read by
:func:`read_raft_secret` and the TLS contexts are built by :func:`server_ssl_context` and
:func:`peer_ssl_context`.  Relative paths are relative to the working directory.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from schedd.core.durations import format_duration, parse_duration
from schedd.core.runs import FIRE_AHEAD_MAX_MS
from schedd.core.state import HOT_WINDOW_MS
from schedd.errors import ConfigError, InvalidArgument
from schedd.ids import MAX_SHARDS
from schedd.net import PEM_CERT, TrustError, ca_context, is_loopback

__all__ = [
    "MIN_SECRET_BYTES",
    "AuthConfig",
    "Config",
    "HistoryConfig",
    "HttpConfig",
    "LimitsConfig",
    "LogConfig",
    "NodeConfig",
    "RaftConfig",
    "SchedulerConfig",
    "check_files",
    "config_keys",
    "is_wildcard_host",
    "join_hostport",
    "load_config",
    "peer_ssl_context",
    "read_raft_secret",
    "server_ssl_context",
    "split_hostport",
]

MIN_SECRET_BYTES: Final = 32
KIB: Final = 1024
MIB: Final = 1024 * 1024
GIB: Final = 1024 * MIB

# --------------------------------------------------------------------------------------------
# value parsers: (value, key path) -> parsed value, or raise _Bad with full "path: ..." messages


class _Bad(Exception):
    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


Parser = Callable[[object, str], Any]


def _show(value: object) -> str:
    """A value as a user wrote it: strings in double quotes, otherwise its TOML type."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)
_DOTTED = re.compile(r"^[0-9.]+$")


def _check_host(host: str) -> None:
    if _DOTTED.match(host):
        ipaddress.IPv4Address(host)  # raises ValueError on 10.0.0.300
    elif not _HOSTNAME.match(host):
        raise ValueError("not a host name or IP address")


def split_hostport(address: str) -> tuple[str, int]:
    """``"10.0.0.1:7701"`` → ``("10.0.0.1", 7701)``; ``"[::1]:7701"`` → ``("::1", 7701)``.

    Raises :class:`ValueError` saying what is wrong.
    """
    text = address.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError("expected [ipv6]:port")
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("expected an IPv6 address inside [brackets]") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError("expected host:port")
        if ":" in host:
            raise ValueError("expected host:port (put IPv6 addresses in [brackets])")
        try:
            _check_host(host)
        except ValueError:
            raise ValueError("expected host:port with a valid host name or IP address") from None
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError("expected host:port with a numeric port")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError("expected host:port with a port from 1 to 65535")
    return host, port


def join_hostport(host: str, port: int) -> str:
    """The inverse of :func:`split_hostport` (IPv6 hosts get their brackets back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_wildcard_host(host: str) -> bool:
    """``0.0.0.0`` or ``::`` (listen on every interface)."""
    ip = _ip(host)
    return ip is not None and ip.is_unspecified


def _hostport(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{path}: expected host:port, got {_show(value)}")
    try:
        host, port = split_hostport(value)
    except ValueError as e:
        raise _Bad(f"{path}: {e}, got {_show(value)}") from None
    return join_hostport(host, port)


def _list_of(item: Parser) -> Parser:
    def parse(value: object, path: str) -> tuple[Any, ...]:
        if isinstance(value, str):  # from env or a flag: comma-separated
            value = _split_commas(value)
        if not isinstance(value, list | tuple):
            raise _Bad(f"{path}: expected an array, got {_show(value)}")
        out: list[Any] = []
        problems: list[str] = []
        for i, v in enumerate(value):
            try:
                out.append(item(v, f"{path}[{i}]"))
            except _Bad as e:
                problems.extend(e.problems)
        if problems:
            raise _Bad(*problems)
        return tuple(out)

    return parse


def _mapping_of(item: Parser) -> Parser:
    """A TOML table ``{ namespace = value }`` (env/flags: ``"a=1,b=2"``) → sorted pairs."""

    def parse(value: object, path: str) -> tuple[tuple[str, Any], ...]:
        if isinstance(value, str):
            pairs = [p.partition("=") for p in _split_commas(value)]
            if any(not sep for _, sep, _ in pairs):
                raise _Bad(
                    f'{path}: expected name=value pairs like "reports=10", got {_show(value)}'
                )
            value = {k.strip(): _number_text(v.strip()) for k, _, v in pairs}
        if not isinstance(value, dict):
            raise _Bad(f"{path}: expected a table like {{ reports = 10 }}, got {_show(value)}")
        out: list[tuple[str, Any]] = []
        problems: list[str] = []
        for name, v in value.items():
            if not re.fullmatch(r"[a-z0-9_-]{1,64}", str(name)):
                problems.append(f"{path}.{name}: expected a namespace name (a-z, 0-9, - and _)")
                continue
            try:
                out.append((str(name), item(v, f"{path}.{name}")))
            except _Bad as e:
                problems.extend(e.problems)
        if problems:
            raise _Bad(*problems)
        return tuple(sorted(out))

    return parse


def _number_text(text: str) -> object:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            continue
    return text


def _rate(value: object, path: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1e9:
        raise _Bad(f"{path}: expected a positive number of jobs per second, got {_show(value)}")
    return float(value)


def _url(value: object, path: str) -> str:
    expected = 'expected an http(s) URL like "http://10.0.0.1:7700"'
    if not isinstance(value, str):
        raise _Bad(f"{path}: {expected}, got {_show(value)}")
    text = value.strip()
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises ValueError when out of range
    except ValueError:
        raise _Bad(f"{path}: {expected}, got {_show(value)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise _Bad(f"{path}: {expected}, got {_show(value)}")
    return text.rstrip("/")


def _optional(inner: Parser) -> Parser:
    def parse(value: object, path: str) -> Any:
        return None if value is None else inner(value, path)

    return parse


def _path(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{path}: expected a non-empty path, got {_show(value)}")
    return os.path.expanduser(value.strip())


_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _cluster_id(value: object, path: str) -> str:
    if not isinstance(value, str) or (value and not re.fullmatch(r"[0-9a-f]{16}", value)):
        raise _Bad(
            f"{path}: expected the cluster's id as schedctl node list shows it (16 hex digits), "
            f"got {_show(value)}"
        )
    return value


def _node_id(value: object, path: str) -> str:
    if not isinstance(value, str) or not _NODE_ID.match(value):
        raise _Bad(
            f"{path}: expected 1 to 63 letters, digits, '_', '.' or '-' starting with a letter "
            f"or digit, got {_show(value)}"
        )
    return value


def _int(lo: int, hi: int) -> Parser:
    def parse(value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"{path}: expected an integer, got {_show(value)}")
        if not lo <= value <= hi:
            raise _Bad(f"{path}: expected an integer from {lo} to {hi}, got {value}")
        return value

    return parse


_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib|kb|mb|gb)?\s*$", re.IGNORECASE)
_SIZE_UNIT = {
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}


def _bytes(n: int) -> str:
    """``n`` bytes as a size would be written: ``1048576`` → ``1048576 (1MiB)``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size and n % size == 0:
            return f"{n} ({n // size}{unit})"
    return str(n)


def _size(lo: int, hi: int, per: str = "") -> Parser:
    """A size in bytes from ``lo`` to ``hi`` (``per="second"``: a rate, bytes a second)."""
    unit = f"bytes per {per}" if per else "bytes"

    def parse(value: object, path: str) -> int:
        expected = f'expected a size in {unit} (an integer or a string like "64KiB", "1MiB")'
        if isinstance(value, str):
            m = _SIZE.match(value)
            if not m:
                raise _Bad(f"{path}: {expected}, got {_show(value)}")
            n = int(m.group(1)) * _SIZE_UNIT[(m.group(2) or "b").lower()]
        elif isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            raise _Bad(f"{path}: {expected}, got {_show(value)}")
        if not lo <= n <= hi:
            raise _Bad(
                f"{path}: expected a size from {_bytes(lo)} to {_bytes(hi)} {unit}, "
                f"got {_show(value)}"
            )
        return n

    return parse


def _duration(value: object, path: str) -> int:
    try:
        return parse_duration(value, path)
    except InvalidArgument as e:
        raise _Bad(e.message) from None


def _choice(*options: str, aliases: Mapping[str, str] | None = None) -> Parser:
    def parse(value: object, path: str) -> str:
        if isinstance(value, str):
            v = value.strip().lower()
            v = (aliases or {}).get(v, v)
            if v in options:
                return v
        raise _Bad(f"{path}: expected one of {', '.join(options)}, got {_show(value)}")

    return parse


# --------------------------------------------------------------------------------------------
# the schema: one dataclass per section; each field says its TOML key, parser and env kind


@dataclass(frozen=True)
class _Spec:
    parse: Parser
    kind: str  # how a text value from env/flags is coerced: text | int | list | optional
    key: str | None = None  # TOML key when it differs from the attribute


def _f(default: Any, parse: Parser, kind: str = "text", key: str | None = None) -> Any:
    return field(default=default, metadata={"spec": _Spec(parse, kind, key)})


def _dur(default_ms: int) -> Any:
    return _f(default_ms, _duration)


def _duration_or_zero(value: object, path: str) -> int:
    try:
        return parse_duration(value, path, allow_zero=True)
    except InvalidArgument as e:
        raise _Bad(e.message) from None


@dataclass(frozen=True)
class ClusterConfig:
    #: how many Raft groups the cluster's jobs are spread over; fixed when the cluster is
    #: created (recorded in every node's data directory)
    shards: int = _f(1, _int(1, MAX_SHARDS), "int")


@dataclass(frozen=True)
class NodeConfig:
    id: str = _f("n1", _node_id)
    data_dir: str = _f("./.schedd", _path)
    #: move long-lived objects out of the garbage collector's reach this often (0s: never),
    #: and (not while leading) collect everything once this often; see schedd/gcpolicy.py
    gc_freeze_interval_ms: int = _f(10_000, _duration_or_zero, key="gc_freeze_interval")
    gc_thaw_interval_ms: int = _f(3_600_000, _duration_or_zero, key="gc_thaw_interval")


@dataclass(frozen=True)
class HttpConfig:
    listen: str = _f("127.0.0.1:7700", _hostport)
    #: the URL other nodes and workers use to reach this node's API; derived when None
    advertise: str | None = _f(None, _optional(_url), "optional")
    tls_cert: str | None = _f(None, _optional(_path), "optional")
    tls_key: str | None = _f(None, _optional(_path), "optional")
    #: CA certificate(s) trusted when this node calls another node's https API; None: the
    #: system's trusted CAs
    tls_ca: str | None = _f(None, _optional(_path), "optional")
    max_body: int = _f(MIB, _size(KIB, 1024 * MIB), "int")
    #: the changes of the latest entries each node keeps for clients following GET /events
    events_buffer: int = _f(10_000, _int(1_000, 10_000_000), "int")


@dataclass(frozen=True)
class RaftConfig:
    listen: str = _f("127.0.0.1:7701", _hostport)
    #: the OTHER nodes' Raft host:port
    peers: tuple[str, ...] = _f((), _list_of(_hostport), "list")
    secret_file: str | None = _f(None, _optional(_path), "optional")
    #: the other nodes' HTTP URLs, same order as peers; derived as host:(raft port - 1) if empty
    peer_http: tuple[str, ...] = _f((), _list_of(_url), "list")
    #: a new node started empty asks the cluster at these API URLs to add it
    join: tuple[str, ...] = _f((), _list_of(_url), "list")
    #: the id of the cluster this node is to join (schedctl node list shows it); "": any
    cluster_id: str = _f("", _cluster_id)
    append_entries_period_ms: int = _dur(20)
    auto_tick_period_ms: int = _dur(10)
    # chosen from the measured Raft gaps under load (docs/operations.md, Elections)
    raft_min_timeout_ms: int = _dur(1000)
    raft_max_timeout_ms: int = _dur(2000)
    leader_fallback_timeout_ms: int = _dur(2000)
    log_compaction_min_entries: int = _f(5000, _int(1, 1_000_000_000), "int")
    log_compaction_min_time_ms: int = _dur(10_000)
    #: where the Raft journal lives; None: <node.data_dir>/raft (see :attr:`Config.journal_path`)
    journal_dir: str | None = _f(None, _optional(_path), "optional")
    #: bytes a second a copy of the state is sent at (to a follower, or a backup)
    snapshot_rate: int = _f(32 * MIB, _size(MIB, 10 * GIB, per="second"), "int")
    #: the most bytes of entries the log keeps for a follower that is behind (or a copy in
    #: flight) before it is compacted anyway
    log_keep_max: int = _f(GIB, _size(MIB, 64 * GIB), "int")
    #: what runs the Raft ticks: "loop", the event loop (one thread for the node's Python
    #: work, no hand-over of the GIL on the commit path), or "thread", a thread of their own
    ticks: str = _f("loop", _choice("loop", "thread"))


@dataclass(frozen=True)
class AuthConfig:
    #: None means <node.data_dir>/tokens.toml (see :meth:`Config.tokens_path`)
    tokens_file: str | None = _f(None, _optional(_path), "optional")
    #: how long a dashboard session opened by ``schedctl ui`` lasts
    ui_session_ttl_ms: int = _dur(8 * 3_600_000)


@dataclass(frozen=True)
class SchedulerConfig:
    heartbeat_timeout_ms: int = _dur(60_000)
    heartbeat_interval_ms: int = _dur(5_000)
    max_payload: int = _f(64 * KIB, _size(1, 1024 * MIB), "int")
    default_max_attempts: int = _f(3, _int(1, 1000), "int")
    tick_ms: int = _dur(10)
    drain_time_ms: int = _dur(10_000)
    #: one-off runs (and recurring ones with overlap "allow") are fired and leased this long
    #: before they are due; the worker starts the handler at the due time (0: at the due time)
    dispatch_ahead_ms: int = _f(1_000, _duration_or_zero, key="dispatch_ahead")
    #: every node keeps the runs due within this window (and the live ones) decoded in memory;
    #: the leader's wheel holds them; later ones stay on disk
    hot_window_ms: int = _dur(HOT_WINDOW_MS)


@dataclass(frozen=True)
class LimitsConfig:
    max_batch: int = _f(10_000, _int(1, 1_000_000), "int")
    #: per namespace: the most runs leased at once (namespaces not listed: no cap)
    concurrency: tuple[tuple[str, int], ...] = _f((), _mapping_of(_int(0, 1_000_000)), "text")
    #: per namespace: jobs accepted per second on each node, or in the whole cluster (429
    #: with Retry-After beyond)
    submit_rate: tuple[tuple[str, float], ...] = _f((), _mapping_of(_rate), "text")
    #: where submit_rate holds: "node" (each node admits the rate), "cluster" (the nodes
    #: together: each admits an equal share, the rate divided by the cluster's nodes)
    submit_rate_scope: str = _f("node", _choice("node", "cluster"), "text")
    #: how many jobs a namespace may submit at once above its rate
    submit_burst: int = _f(100, _int(1, 1_000_000), "int")
    #: the most runs one POST /dlq/replay or /dlq/drop acts on (more matching: 400)
    max_bulk: int = _f(10_000, _int(1, 1_000_000), "int")


@dataclass(frozen=True)
class HistoryConfig:
    #: finished runs (and finished jobs left without runs) are forgotten this long after they
    #: last changed; runs in the dead-letter queue are kept
    retention_ms: int = _dur(7 * 86_400_000)
    #: the most finished runs kept per job (the oldest are forgotten as new ones finish)
    max_runs_per_job: int = _f(1_000, _int(1, 1_000_000), "int")


@dataclass(frozen=True)
class LogConfig:
    level: str = _f(
        "info",
        _choice("debug", "info", "warning", "error", "critical", aliases={"warn": "warning"}),
    )
    format: str = _f("auto", _choice("auto", "json", "text"))


_SECTIONS: Final[dict[str, type[Any]]] = {
    "cluster": ClusterConfig,
    "node": NodeConfig,
    "http": HttpConfig,
    "raft": RaftConfig,
    "auth": AuthConfig,
    "scheduler": SchedulerConfig,
    "limits": LimitsConfig,
    "history": HistoryConfig,
    "log": LogConfig,
}


@dataclass(frozen=True)
class _Key:
    section: str
    key: str
    attr: str
    spec: _Spec


def _keys(section: str) -> dict[str, _Key]:
    out: dict[str, _Key] = {}
    for f in fields(_SECTIONS[section]):
        spec: _Spec = f.metadata["spec"]
        key = spec.key or (f.name.removesuffix("_ms") if spec.parse is _duration else f.name)
        out[key] = _Key(section, key, f.name, spec)
    return out


_SCHEMA: Final = {name: _keys(name) for name in _SECTIONS}


def config_keys() -> dict[str, dict[str, str]]:
    """``{section: {toml key: dataclass attribute}}`` for every known key."""
    return {s: {k: v.attr for k, v in keys.items()} for s, keys in _SCHEMA.items()}


@dataclass(frozen=True)
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    raft: RaftConfig = field(default_factory=RaftConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @property
    def data_path(self) -> Path:
        return Path(self.node.data_dir)

    @property
    def journal_path(self) -> Path:
        """The directory of the Raft journal: ``raft.journal_dir``, or ``<node.data_dir>/raft``
        (beside the state) when unset."""
        if self.raft.journal_dir is not None:
            return Path(self.raft.journal_dir)
        return self.data_path / "raft"

    @property
    def tokens_path(self) -> Path:
        """``auth.tokens_file``, or ``<node.data_dir>/tokens.toml`` when unset."""
        if self.auth.tokens_file is not None:
            return Path(self.auth.tokens_file)
        return self.data_path / "tokens.toml"

    @property
    def is_single_node(self) -> bool:
        return not self.raft.peers and not self.raft.join

    @property
    def http_scheme(self) -> str:
        return "https" if self.http.tls_cert else "http"

    def advertise_url(self) -> str:
        """This node's API URL as others reach it: ``http.advertise``, else derived from
        ``http.listen`` (a wildcard host is replaced by the Raft host, or 127.0.0.1)."""
        if self.http.advertise:
            return self.http.advertise
        host, port = split_hostport(self.http.listen)
        if is_wildcard_host(host):
            raft_host, _ = split_hostport(self.raft.listen)
            host = "127.0.0.1" if is_wildcard_host(raft_host) else raft_host
        return f"{self.http_scheme}://{join_hostport(host, port)}"

    def node_submit_rates(self) -> tuple[tuple[str, float], ...]:
        """Each rate-limited namespace's submissions a second that this node admits: its
        whole ``limits.submit_rate`` (``submit_rate_scope = "node"``), or an equal share of
        it among the cluster's nodes (``"cluster"``: this node and ``raft.peers``)."""
        nodes = 1 if self.limits.submit_rate_scope == "node" else len(self.raft.peers) + 1
        return tuple((ns, rate / nodes) for ns, rate in self.limits.submit_rate)

    def peer_http_urls(self) -> tuple[str, ...]:
        """The other nodes' API URLs, in ``raft.peers`` order: ``raft.peer_http`` if set, else
        ``<scheme>://<peer host>:<peer raft port - 1>``."""
        if self.raft.peer_http:
            return self.raft.peer_http
        out = []
        for peer in self.raft.peers:
            host, port = split_hostport(peer)
            out.append(f"{self.http_scheme}://{join_hostport(host, max(port - 1, 1))}")
        return tuple(out)

    def peer_http_map(self) -> dict[str, str]:
        """``{peer raft host:port: peer API URL}`` (to redirect to a leader known by Raft addr)."""
        return dict(zip(self.raft.peers, self.peer_http_urls(), strict=True))

    def raft_http_map(self) -> dict[str, str]:
        """Like :meth:`peer_http_map` with this node's own Raft address and URL included."""
        return {self.raft.listen: self.advertise_url(), **self.peer_http_map()}

    def all_http_urls(self) -> tuple[str, ...]:
        """Every node's API URL: this node's first, then the peers'."""
        return (self.advertise_url(), *self.peer_http_urls())

    def raft_addresses(self) -> tuple[str, ...]:
        return (self.raft.listen, *self.raft.peers)

    def raft_is_loopback(self) -> bool:
        return all(is_loopback(split_hostport(a)[0]) for a in self.raft_addresses())


# --------------------------------------------------------------------------------------------
# loading

_Raw = dict[str, dict[str, tuple[object, str]]]  # section -> key -> (value, source note)


def _expected_keys(section: str) -> str:
    return ", ".join(_SCHEMA[section])


def _split_commas(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _from_text(text: str, kind: str) -> object:
    """A value from an env var or a flag, coerced to what the TOML would hold."""
    if kind == "list":
        return _split_commas(text)
    if kind == "optional":
        return text if text.strip() else None
    if kind == "int":
        try:
            return int(text.strip())
        except ValueError:
            return text  # the parser says what was expected
    return text


def _read_toml(path: Path, raw: _Raw, problems: list[str]) -> None:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        problems.append(f"{path}: config file not found")
        return
    except OSError as e:
        problems.append(f"{path}: cannot read the config file: {e.strerror or e}")
        return
    except tomllib.TOMLDecodeError as e:
        problems.append(f"{path}: not valid TOML: {e}")
        return
    for name, table in data.items():
        if name not in _SCHEMA:
            problems.append(f"{name}: unknown section (expected one of: {', '.join(_SCHEMA)})")
            continue
        if not isinstance(table, dict):
            problems.append(f"{name}: expected a table [{name}], got {_show(table)}")
            continue
        for key, value in table.items():
            if key not in _SCHEMA[name]:
                problems.append(
                    f"{name}.{key}: unknown key (expected one of: {_expected_keys(name)})"
                )
                continue
            raw[name][key] = (value, "")


def _apply_env(env: Mapping[str, str], raw: _Raw, problems: list[str]) -> None:
    for var in sorted(env):
        if not var.upper().startswith("SCHEDD_"):
            continue
        section, _, key = var[len("SCHEDD_") :].lower().partition("_")
        if section not in _SCHEMA:
            continue  # SCHEDD_SERVER, SCHEDD_TOKEN etc. belong to the clients
        spec = _SCHEMA[section].get(key)
        if spec is None:
            problems.append(
                f"{var}: unknown key {section}.{key} (expected one of: {_expected_keys(section)})"
            )
            continue
        raw[section][key] = (_from_text(env[var], spec.spec.kind), f" (from {var})")


def _apply_overrides(overrides: Mapping[str, object], raw: _Raw, problems: list[str]) -> None:
    for name, value in overrides.items():
        if value is None:
            continue
        section, _, key = name.partition(".")
        if section not in _SCHEMA:
            problems.append(f"{name}: unknown section (expected one of: {', '.join(_SCHEMA)})")
            continue
        spec = _SCHEMA[section].get(key)
        if spec is None:
            problems.append(f"{name}: unknown key (expected one of: {_expected_keys(section)})")
            continue
        if isinstance(value, str):
            value = _from_text(value, spec.spec.kind)
        raw[section][key] = (value, " (from the command line)")


def _build(raw: _Raw, problems: list[str], bad: set[str]) -> Config:
    sections: dict[str, Any] = {}
    for name, keys in _SCHEMA.items():
        kwargs: dict[str, Any] = {}
        for key, k in keys.items():
            if key not in raw[name]:
                continue
            value, source = raw[name][key]
            try:
                kwargs[k.attr] = k.spec.parse(value, f"{name}.{key}")
            except _Bad as e:
                problems.extend(p + source for p in e.problems)
                bad.add(f"{name}.{key}")
        sections[name] = _SECTIONS[name](**kwargs)
    return Config(**sections)


def _check_order(cfg: Config, ok: Callable[..., bool], problems: list[str]) -> None:
    r, s, h = cfg.raft, cfg.scheduler, cfg.http
    if ok("raft.raft_min_timeout", "raft.raft_max_timeout") and not (
        r.raft_min_timeout_ms < r.raft_max_timeout_ms
    ):
        problems.append(
            f"raft.raft_max_timeout: expected more than raft.raft_min_timeout "
            f"({format_duration(r.raft_min_timeout_ms)}), got {format_duration(r.raft_max_timeout_ms)}"
        )
    if ok("raft.append_entries_period", "raft.raft_min_timeout") and not (
        r.append_entries_period_ms < r.raft_min_timeout_ms
    ):
        problems.append(
            f"raft.append_entries_period: expected less than raft.raft_min_timeout "
            f"({format_duration(r.raft_min_timeout_ms)}), got {format_duration(r.append_entries_period_ms)}"
        )
    if ok("scheduler.heartbeat_interval", "scheduler.heartbeat_timeout") and not (
        s.heartbeat_interval_ms < s.heartbeat_timeout_ms
    ):
        problems.append(
            f"scheduler.heartbeat_interval: expected less than scheduler.heartbeat_timeout "
            f"({format_duration(s.heartbeat_timeout_ms)}), got {format_duration(s.heartbeat_interval_ms)}"
        )
    if ok("scheduler.dispatch_ahead") and s.dispatch_ahead_ms > FIRE_AHEAD_MAX_MS:
        problems.append(
            f"scheduler.dispatch_ahead: expected at most {format_duration(FIRE_AHEAD_MAX_MS)}, "
            f"got {format_duration(s.dispatch_ahead_ms)}"
        )
    if ok("scheduler.max_payload", "http.max_body") and s.max_payload > h.max_body:
        problems.append(
            f"scheduler.max_payload: expected at most http.max_body ({h.max_body} bytes), "
            f"got {s.max_payload}"
        )
    ttl = cfg.auth.ui_session_ttl_ms
    if ok("auth.ui_session_ttl") and not 60_000 <= ttl <= 7 * 86_400_000:
        problems.append(f"auth.ui_session_ttl: expected 1m to 7d, got {format_duration(ttl)}")
    if ok("http.tls_cert", "http.tls_key") and (h.tls_cert is None) != (h.tls_key is None):
        missing = "http.tls_key" if h.tls_key is None else "http.tls_cert"
        problems.append(f"{missing}: required when the other of http.tls_cert/http.tls_key is set")


def _check_cluster(cfg: Config, ok: Callable[..., bool], problems: list[str]) -> None:
    r = cfg.raft
    if ok("raft.peers", "raft.listen"):
        seen: dict[str, int] = {}
        for i, peer in enumerate(r.peers):
            if peer == r.listen:
                problems.append(
                    f"raft.peers[{i}]: {_show(peer)} is this node's own raft.listen; "
                    "list only the OTHER nodes"
                )
            elif peer in seen:
                problems.append(f"raft.peers[{i}]: duplicate of raft.peers[{seen[peer]}]")
            seen.setdefault(peer, i)
            host, port = split_hostport(peer)
            if is_wildcard_host(host):
                problems.append(
                    f"raft.peers[{i}]: expected an address other nodes can reach, "
                    f"got the wildcard {_show(peer)}"
                )
            elif not r.peer_http and port == 1 and ok("raft.peer_http"):
                problems.append(
                    f"raft.peer_http: cannot derive the HTTP URL of raft.peers[{i}] "
                    "(raft port 1); set raft.peer_http"
                )
        if r.peers and is_wildcard_host(split_hostport(r.listen)[0]):
            problems.append(
                f"raft.listen: a wildcard address ({_show(r.listen)}) cannot be used with "
                "raft.peers; use this node's address as the other nodes list it"
            )
    if ok("raft.peers", "raft.peer_http") and r.peer_http and len(r.peer_http) != len(r.peers):
        problems.append(
            f"raft.peer_http: expected {len(r.peers)} URL(s), one per raft.peers entry "
            f"in the same order, got {len(r.peer_http)}"
        )
    if ok("http.listen", "raft.listen") and cfg.http.listen == r.listen:
        problems.append(f"raft.listen: same address as http.listen ({_show(r.listen)})")


def _check_shards(cfg: Config, ok: Callable[..., bool], problems: list[str]) -> None:
    """Shard k of a node listens on the Raft port + k: every such port must exist and miss the
    node's HTTP port."""
    n = cfg.cluster.shards
    if not ok("cluster.shards") or n == 1:
        return
    if ok("raft.listen", "raft.peers"):
        peers = [(f"raft.peers[{i}]", p) for i, p in enumerate(cfg.raft.peers)]
        for key, address in [("raft.listen", cfg.raft.listen), *peers]:
            port = split_hostport(address)[1]
            if port + n - 1 > 65535:
                problems.append(
                    f"{key}: shard k listens on the Raft port + k, so with cluster.shards = {n} "
                    f"the port must be at most {65536 - n}, got {port}"
                )
    if ok("raft.listen", "http.listen"):
        host, port = split_hostport(cfg.raft.listen)
        http_host, http_port = split_hostport(cfg.http.listen)
        if port <= http_port < port + n and (
            host == http_host or is_wildcard_host(host) or is_wildcard_host(http_host)
        ):
            problems.append(
                f"http.listen: port {http_port} is shard {http_port - port}'s Raft port "
                f"(raft.listen port + shard, cluster.shards = {n}); choose another port"
            )


def _check_secret_rule(cfg: Config, ok: Callable[..., bool], problems: list[str]) -> None:
    if not ok("raft.secret_file") or cfg.raft.secret_file is not None:
        return
    addresses = []
    if ok("raft.listen"):
        addresses.append(cfg.raft.listen)
    if ok("raft.peers"):
        addresses.extend(cfg.raft.peers)
    if any(not is_loopback(split_hostport(a)[0]) for a in addresses):
        problems.append("raft.secret_file: required unless every raft address is loopback")


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Read ``path`` (TOML, optional), then ``SCHEDD_<SECTION>_<KEY>`` from ``env`` (default
    :data:`os.environ`; lists comma-separated), then ``overrides`` keyed ``"section.key"``
    (``None`` values are ignored).  Raises one :class:`ConfigError` listing every problem."""
    problems: list[str] = []
    raw: _Raw = {name: {} for name in _SCHEMA}
    if path is not None:
        _read_toml(Path(path), raw, problems)
    _apply_env(os.environ if env is None else env, raw, problems)
    _apply_overrides(overrides or {}, raw, problems)
    bad: set[str] = set()
    cfg = _build(raw, problems, bad)

    def ok(*paths: str) -> bool:
        return not bad.intersection(paths)

    _check_order(cfg, ok, problems)
    _check_cluster(cfg, ok, problems)
    _check_shards(cfg, ok, problems)
    _check_secret_rule(cfg, ok, problems)
    if problems:
        raise ConfigError(problems)
    return cfg


# --------------------------------------------------------------------------------------------
# files


def _read_secret(path: str) -> tuple[bytes | None, str | None]:
    where = f"raft.secret_file: {_show(path)}"
    try:
        data = Path(path).read_bytes().strip()
    except FileNotFoundError:
        return None, f"{where} not found"
    except IsADirectoryError:
        return None, f"{where} is a directory, expected a file"
    except OSError as e:
        return None, f"{where} cannot be read: {e.strerror or e}"
    if len(data) < MIN_SECRET_BYTES:
        return None, (
            f"{where} holds {len(data)} bytes, expected at least {MIN_SECRET_BYTES} "
            "(e.g. `openssl rand -hex 32 > FILE`)"
        )
    return data, None


def read_raft_secret(cfg: Config) -> bytes | None:
    """The shared Raft secret (surrounding whitespace stripped), or ``None`` without a
    ``raft.secret_file``.  Raises :class:`ConfigError` when the file is missing or too short."""
    if cfg.raft.secret_file is None:
        return None
    data, problem = _read_secret(cfg.raft.secret_file)
    if problem is not None:
        raise ConfigError([problem])
    return data


def check_files(cfg: Config) -> list[str]:
    """Problems with the files the config names (secret, TLS, data dir, tokens file)."""
    problems: list[str] = []
    if cfg.raft.secret_file is not None:
        _, problem = _read_secret(cfg.raft.secret_file)
        if problem is not None:
            problems.append(problem)
    problems.extend(_tls_problems(cfg))
    data = cfg.data_path
    if data.exists() and not data.is_dir():
        problems.append(f"node.data_dir: {_show(str(data))} exists and is not a directory")
    if cfg.raft.journal_dir is not None:
        problems.extend(_journal_dir_problems(cfg))
    tokens = cfg.tokens_path
    if tokens.exists() and not tokens.is_file():
        key = "auth.tokens_file" if cfg.auth.tokens_file is not None else "node.data_dir"
        problems.append(f"{key}: {_show(str(tokens))} exists and is not a file")
    return problems


#: the Raft journal's file in its directory (``schedd.raft.node``); its state file and
#: temporary files are named after it
JOURNAL_FILE: Final = "raft.journal"
#: the state database in ``<node.data_dir>/raft``: a node that has one has run before
STATE_FILE: Final = "state.db"


def _journal_dir_problems(cfg: Config) -> list[str]:
    """``raft.journal_dir`` is a directory (or can be one), and the node's journal is there:
    not left behind in ``<node.data_dir>/raft``, nor missing (an unmounted disk) from a node
    that has run before.  A node started without its journal has lost its log, its term and
    its vote (it could vote twice in one term)."""
    where, default = cfg.journal_path, cfg.data_path / "raft"
    if where.exists() and not where.is_dir():
        return [f"raft.journal_dir: {_show(str(where))} exists and is not a directory"]
    if where.resolve() == default.resolve():
        return []
    here, there = (where / JOURNAL_FILE).exists(), (default / JOURNAL_FILE).exists()
    if here and there:
        return [
            f"raft.journal_dir: both {_show(str(where))} and {_show(str(default))} hold a Raft "
            f"journal ({JOURNAL_FILE}); keep the one this node last ran with in raft.journal_dir "
            "and remove the other"
        ]
    if there:
        return [
            f"raft.journal_dir: the journal is still in {_show(str(default))}; with the node "
            f"stopped, move {JOURNAL_FILE} and {JOURNAL_FILE}.state from there to "
            f"{_show(str(where))} (or unset raft.journal_dir)"
        ]
    if not here and (default / STATE_FILE).exists():
        return [
            f"raft.journal_dir: {_show(str(where))} holds no journal ({JOURNAL_FILE}) but "
            f"{_show(str(default))} holds this node's state: is the journal's disk mounted? "
            "(a node whose journal is lost must start with an empty node.data_dir)"
        ]
    return []


# --------------------------------------------------------------------------------------------
# TLS

_PEM_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")
_PEM_ENCRYPTED = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: 4,ENCRYPTED")


def _read_pem(key: str, path: str) -> tuple[bytes | None, str | None]:
    where = f"{key}: {_show(path)}"
    try:
        return Path(path).read_bytes(), None
    except FileNotFoundError:
        return None, f"{key}: file {_show(path)} not found"
    except IsADirectoryError:
        return None, f"{where} is a directory, expected a PEM file"
    except OSError as e:
        return None, f"{where} cannot be read: {e.strerror or e}"


def _no_password() -> bytes:
    # never let OpenSSL prompt on the terminal for an encrypted key
    raise ValueError("encrypted")


def _server_context(cert: str, key: str) -> tuple[ssl.SSLContext | None, list[str]]:
    cert_pem, cert_problem = _read_pem("http.tls_cert", cert)
    key_pem, key_problem = _read_pem("http.tls_key", key)
    problems = [p for p in (cert_problem, key_problem) if p is not None]
    if cert_pem is not None and PEM_CERT not in cert_pem:
        problems.append(
            f"http.tls_cert: {_show(cert)} holds no PEM certificate "
            '(expected a "-----BEGIN CERTIFICATE-----" block)'
        )
    if key_pem is not None:
        if _PEM_ENCRYPTED.search(key_pem):
            problems.append(
                f"http.tls_key: {_show(key)} is encrypted; schedd needs an "
                "unencrypted key (keep the file mode 0600)"
            )
        elif not _PEM_KEY.search(key_pem):
            problems.append(
                f"http.tls_key: {_show(key)} holds no PEM private key "
                '(expected a "-----BEGIN PRIVATE KEY-----" block)'
            )
    if problems:
        return None, problems
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, ValueError) as e:
        if "KEY_VALUES_MISMATCH" in str(e):
            return None, [
                f"http.tls_key: {_show(key)} is not the private key of the "
                f"certificate in http.tls_cert ({_show(cert)})"
            ]
        return None, [
            f"http.tls_cert, http.tls_key: cannot load the certificate and key "
            f"({_show(cert)}, {_show(key)}): {e}"
        ]
    return ctx, []


def _ca_context(path: str) -> tuple[ssl.SSLContext | None, str | None]:
    try:
        return ca_context(path, show=_show), None
    except TrustError as e:
        return None, f"http.tls_ca: {e}"


def _tls_problems(cfg: Config) -> list[str]:
    h = cfg.http
    problems: list[str] = []
    if h.tls_cert is not None and h.tls_key is not None:
        problems.extend(_server_context(h.tls_cert, h.tls_key)[1])
    else:  # load_config already said that both are needed
        for key, value in (("http.tls_cert", h.tls_cert), ("http.tls_key", h.tls_key)):
            problem = None if value is None else _read_pem(key, value)[1]
            if problem is not None:
                problems.append(problem)
    if h.tls_ca is not None:
        problem = _ca_context(h.tls_ca)[1]
        if problem is not None:
            problems.append(problem)
    return problems


#: connections a node's listening sockets hold until it accepts them (aiohttp's default: 128):
#: thousands of workers connect at once after a node restarts, and with several shards each
#: opens a connection to every shard's leader through the front doors
LISTEN_BACKLOG = 1024


def server_ssl_context(cfg: Config) -> ssl.SSLContext | None:
    """The TLS context the API serves with (``http.tls_cert`` + ``http.tls_key``), or ``None``
    for plain http.  Raises :class:`ConfigError` naming the key when a file cannot be used."""
    h = cfg.http
    if h.tls_cert is None and h.tls_key is None:
        return None
    if h.tls_cert is None or h.tls_key is None:
        raise ConfigError(["http.tls_cert, http.tls_key: set both or neither"])
    ctx, problems = _server_context(h.tls_cert, h.tls_key)
    if ctx is None:
        raise ConfigError(problems)
    return ctx


def peer_ssl_context(cfg: Config) -> ssl.SSLContext | None:
    """The TLS context for this node's calls to another node's API: ``http.tls_ca`` as the only
    trusted CAs, or ``None`` for the system's trusted CAs.  Raises :class:`ConfigError`."""
    if cfg.http.tls_ca is None:
        return None
    ctx, problem = _ca_context(cfg.http.tls_ca)
    if ctx is None:
        raise ConfigError([problem or f"http.tls_ca: cannot load {_show(cfg.http.tls_ca)}"])
    return ctx
