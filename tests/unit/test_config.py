"""schedd.config: TOML + env + overrides, every problem at once, the secret rule, the example."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from schedd import preflight
from schedd.config import (
    Config,
    HttpConfig,
    NodeConfig,
    RaftConfig,
    SchedulerConfig,
    check_files,
    config_keys,
    load_config,
    read_raft_secret,
    split_hostport,
)
from schedd.errors import ConfigError
from schedd.net import is_loopback

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "schedd.example.toml"
CLUSTER = ROOT / "config" / "cluster"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "schedd.toml"
    p.write_text(text)
    return p


def problems(
    path: Path | None = None, env: dict[str, str] | None = None, **kw: object
) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {}, overrides=kw.get("overrides"))  # type: ignore[arg-type]
    return info.value.problems


# -- defaults and the embedded single-node config ---------------------------------------------


def test_no_config_is_the_embedded_default() -> None:
    cfg = load_config(None, env={})
    assert cfg == Config()
    assert cfg.node == NodeConfig(id="n1", data_dir="./.schedd")
    assert cfg.http.listen == "127.0.0.1:7700" and cfg.raft.listen == "127.0.0.1:7701"
    assert cfg.http.max_body == 1024 * 1024
    assert cfg.scheduler == SchedulerConfig(
        heartbeat_timeout_ms=60_000,
        heartbeat_interval_ms=5_000,
        max_payload=65_536,
        default_max_attempts=3,
        tick_ms=10,
        drain_time_ms=10_000,
    )
    assert cfg.is_single_node and cfg.raft_is_loopback()
    assert cfg.advertise_url() == "http://127.0.0.1:7700"
    assert cfg.tokens_path == Path(".schedd") / "tokens.toml"
    assert cfg.peer_http_urls() == ()
    assert read_raft_secret(cfg) is None


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDD_NODE_ID", "from-env")
    assert load_config(None).node.id == "from-env"


def test_full_file(tmp_path: Path) -> None:
    (tmp_path / "raft.key").write_text("k" * 64 + "\n")
    p = write(
        tmp_path,
        f"""
[node]
id = "n2"
data_dir = "{tmp_path}/data"
[http]
listen = "0.0.0.0:7710"
max_body = "2MiB"
[raft]
listen = "10.0.0.2:7711"
peers = ["10.0.0.1:7701", "[fd00::3]:7721"]
secret_file = "{tmp_path}/raft.key"
raft_min_timeout = 0.5
[auth]
tokens_file = "/etc/schedd/tokens.toml"
[scheduler]
heartbeat_timeout = "1m30s"
max_payload = "128KiB"
[limits]
max_batch = 50
[log]
level = "WARN"
format = "json"
""",
    )
    cfg = load_config(p, env={})
    assert cfg.node.id == "n2"
    assert cfg.http.max_body == 2 * 1024 * 1024
    assert cfg.raft.peers == ("10.0.0.1:7701", "[fd00::3]:7721")
    assert cfg.raft.raft_min_timeout_ms == 500
    assert cfg.scheduler.heartbeat_timeout_ms == 90_000
    assert cfg.scheduler.max_payload == 128 * 1024
    assert cfg.limits.max_batch == 50
    assert cfg.log.level == "warning" and cfg.log.format == "json"
    assert cfg.tokens_path == Path("/etc/schedd/tokens.toml")
    # a wildcard HTTP host is advertised with the raft host
    assert cfg.advertise_url() == "http://10.0.0.2:7710"
    assert cfg.peer_http_urls() == ("http://10.0.0.1:7700", "http://[fd00::3]:7720")
    assert cfg.all_http_urls()[0] == "http://10.0.0.2:7710"
    assert cfg.raft_http_map() == {
        "10.0.0.2:7711": "http://10.0.0.2:7710",
        "10.0.0.1:7701": "http://10.0.0.1:7700",
        "[fd00::3]:7721": "http://[fd00::3]:7720",
    }
    assert not cfg.raft_is_loopback()
    assert check_files(cfg) == []
    assert read_raft_secret(cfg) == b"k" * 64


# -- every problem at once --------------------------------------------------------------------


def test_every_problem_is_reported_at_once_with_key_paths(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
colour = "blue"
[node]
id = ""
colour = "red"
[http]
listen = "localhost"
advertise = "ftp://x"
max_body = -1
[raft]
peers = ["127.0.0.1:7711", "x", "127.0.0.1:99999"]
raft_min_timeout = "soon"
log_compaction_min_entries = "many"
[scheduler]
heartbeat_timeout = "sixty"
default_max_attempts = true
[limits]
max_batch = 0
[log]
level = "loud"
format = "xml"
[extras]
a = 1
""",
    )
    got = problems(p)
    expect = [
        r"^colour: unknown section \(expected one of: cluster, node, http, raft, auth, scheduler, limits, history, log\)$",
        r"^extras: unknown section",
        r"^node\.colour: unknown key \(expected one of: id, data_dir, gc_freeze_interval, gc_thaw_interval\)$",
        r'^node\.id: expected 1 to 63 letters.*got ""$',
        r'^http\.listen: expected host:port, got "localhost"$',
        r'^http\.advertise: expected an http\(s\) URL.*got "ftp://x"$',
        r"^http\.max_body: expected a size from",
        r'^raft\.peers\[1\]: expected host:port, got "x"$',
        r'^raft\.peers\[2\]: expected host:port with a port from 1 to 65535, got "127\.0\.0\.1:99999"$',
        r"^raft\.raft_min_timeout: expected a duration",
        r'^raft\.log_compaction_min_entries: expected an integer, got "many"$',
        r"^scheduler\.heartbeat_timeout: expected a duration",
        r"^scheduler\.default_max_attempts: expected an integer, got true$",
        r"^limits\.max_batch: expected an integer from 1 to",
        r'^log\.level: expected one of debug, info, warning, error, critical, got "loud"$',
        r'^log\.format: expected one of auto, json, text, got "xml"$',
    ]
    for pattern in expect:
        assert any(re.search(pattern, g) for g in got), (pattern, got)
    assert len(got) == len(expect), got


def test_config_error_message_lists_each_problem(tmp_path: Path) -> None:
    p = write(tmp_path, '[node]\nid = "bad id"\n[log]\nlevel = 3\n')
    with pytest.raises(ConfigError) as info:
        load_config(p, env={})
    assert len(info.value.problems) == 2
    assert "node.id" in str(info.value) and "log.level" in str(info.value)


def test_sections_must_be_tables(tmp_path: Path) -> None:
    assert problems(write(tmp_path, 'node = "n1"\n')) == ['node: expected a table [node], got "n1"']


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    got = problems(tmp_path / "nope.toml")
    assert len(got) == 1 and "config file not found" in got[0]
    got = problems(write(tmp_path, "[node\n"))
    assert len(got) == 1 and "not valid TOML" in got[0]
    # env problems are still collected alongside a missing file
    got = problems(tmp_path / "nope.toml", env={"SCHEDD_NODE_ID": "!"})
    assert len(got) == 2


def test_cross_field_checks(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
[http]
listen = "127.0.0.1:7701"
max_body = 2048
tls_cert = "/c.pem"
[raft]
peers = ["127.0.0.1:7701", "127.0.0.1:7711", "127.0.0.1:7711"]
peer_http = ["http://127.0.0.1:7700"]
raft_min_timeout = "2s"
raft_max_timeout = "1s"
append_entries_period = "3s"
[scheduler]
heartbeat_interval = "2m"
max_payload = 4096
""",
    )
    got = problems(p)
    for needle in (
        "raft.raft_max_timeout: expected more than raft.raft_min_timeout (2s), got 1s",
        "raft.append_entries_period: expected less than raft.raft_min_timeout",
        "scheduler.heartbeat_interval: expected less than scheduler.heartbeat_timeout",
        "scheduler.max_payload: expected at most http.max_body (2048 bytes), got 4096",
        "http.tls_key: required when",
        'raft.peers[0]: "127.0.0.1:7701" is this node\'s own raft.listen',
        "raft.peers[2]: duplicate of raft.peers[1]",
        "raft.peer_http: expected 3 URL(s)",
        "raft.listen: same address as http.listen",
    ):
        assert any(needle in g for g in got), (needle, got)
    assert len(got) == 9, got


def test_wildcard_raft_listen_with_peers_is_refused() -> None:
    got = problems(
        overrides={
            "raft.listen": "0.0.0.0:7701",
            "raft.peers": ["10.0.0.2:7701"],
            "raft.secret_file": "/k",
        }
    )
    assert got == [
        'raft.listen: a wildcard address ("0.0.0.0:7701") cannot be used with raft.peers; '
        "use this node's address as the other nodes list it"
    ]


# -- addresses --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7701", ("127.0.0.1", 7701)),
        ("[::1]:7701", ("::1", 7701)),
        ("node-1.example.com:1", ("node-1.example.com", 1)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_split_hostport(text: str, expected: tuple[str, int]) -> None:
    assert split_hostport(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "x",
        ":7700",
        "host:",
        "host:0",
        "host:65536",
        "::1:7701",
        "[::1]7701",
        "[nope]:1",
        "10.0.0.300:1",
        "bad_host:1",
        "host:７７",  # noqa: RUF001 - fullwidth digits: not a port
    ],
)
def test_split_hostport_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        split_hostport(text)


def test_loopback_hosts() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "localhost", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "10.0.0.1", "::", "example.com"]))


# -- env and overrides ------------------------------------------------------------------------


def test_env_overrides_file_and_flags_override_env(tmp_path: Path) -> None:
    p = write(tmp_path, '[node]\nid = "file"\n[scheduler]\nheartbeat_timeout = "10s"\n')
    env = {
        "SCHEDD_NODE_ID": "env",
        "SCHEDD_HTTP_LISTEN": "127.0.0.1:8000",
        "SCHEDD_RAFT_PEERS": "127.0.0.1:8011, 127.0.0.1:8021",
        "SCHEDD_SCHEDULER_HEARTBEAT_TIMEOUT": "30s",
        "SCHEDD_SCHEDULER_DEFAULT_MAX_ATTEMPTS": "7",
        "SCHEDD_HTTP_MAX_BODY": "2MiB",
        "SCHEDD_AUTH_TOKENS_FILE": "",  # empty: unset
        "SCHEDD_LOG_LEVEL": "debug",
        "SCHEDD_SERVER": "http://x",  # the CLI's, not a config section: ignored
        "SCHEDD_TOKEN": "whatever",
        "OTHER": "1",
    }
    cfg = load_config(p, env=env)
    assert cfg.node.id == "env"
    assert cfg.http.listen == "127.0.0.1:8000"
    assert cfg.raft.peers == ("127.0.0.1:8011", "127.0.0.1:8021")
    assert cfg.scheduler.heartbeat_timeout_ms == 30_000
    assert cfg.scheduler.default_max_attempts == 7
    assert cfg.http.max_body == 2 * 1024 * 1024
    assert cfg.auth.tokens_file is None
    assert cfg.log.level == "debug"
    cfg = load_config(
        p,
        env=env,
        overrides={"node.id": "flag", "raft.peers": ["127.0.0.1:9011"], "node.data_dir": None},
    )
    assert cfg.node.id == "flag"
    assert cfg.raft.peers == ("127.0.0.1:9011",)
    assert cfg.node.data_dir == "./.schedd"
    # overrides given as text (from a flag) are coerced like env values
    cfg = load_config(None, env={}, overrides={"raft.peers": "127.0.0.1:9011,127.0.0.1:9021"})
    assert cfg.raft.peers == ("127.0.0.1:9011", "127.0.0.1:9021")


def test_a_bad_file_value_fixed_by_env_is_not_a_problem(tmp_path: Path) -> None:
    p = write(tmp_path, '[node]\nid = "bad id"\n')
    assert load_config(p, env={"SCHEDD_NODE_ID": "ok"}).node.id == "ok"


def test_env_and_override_problems_name_key_and_source() -> None:
    got = problems(
        env={
            "SCHEDD_RAFT_PEERS": "127.0.0.1:7711,x",
            "SCHEDD_SCHEDULER_HEARTBEAT_TIMEOUT": "soon",
            "SCHEDD_SCHEDULER_MAX_PAYLOAD": "lots",
            "SCHEDD_NODE_COLOUR": "red",
        },
        overrides={"http.listen": "nope", "node.colour": "x", "bogus.key": 1},
    )
    assert 'raft.peers[1]: expected host:port, got "x" (from SCHEDD_RAFT_PEERS)' in got
    assert any(
        g.startswith("scheduler.heartbeat_timeout: expected a duration")
        and g.endswith("(from SCHEDD_SCHEDULER_HEARTBEAT_TIMEOUT)")
        for g in got
    )
    assert any(g.startswith("scheduler.max_payload: expected a size") for g in got)
    assert (
        "SCHEDD_NODE_COLOUR: unknown key node.colour (expected one of: id, data_dir, gc_freeze_interval, gc_thaw_interval)"
        in got
    )
    assert 'http.listen: expected host:port, got "nope" (from the command line)' in got
    assert (
        "node.colour: unknown key (expected one of: id, data_dir, gc_freeze_interval, gc_thaw_interval)"
        in got
    )
    assert any(g.startswith("bogus.key: unknown section") for g in got)
    assert len(got) == 7, got


# -- the raft secret rule ---------------------------------------------------------------------


RULE = "raft.secret_file: required unless every raft address is loopback"


@pytest.mark.parametrize(
    "overrides",
    [
        {"raft.listen": "10.0.0.1:7701"},
        {"raft.listen": "0.0.0.0:7701"},
        {"raft.peers": ["10.0.0.2:7701"]},
        {"raft.peers": ["127.0.0.1:7711", "node3.internal:7721"]},
    ],
)
def test_non_loopback_raft_needs_a_secret(overrides: dict[str, object]) -> None:
    assert RULE in problems(overrides=overrides)
    with_secret = {**overrides, "raft.secret_file": "/etc/schedd/raft.key"}
    cfg = load_config(None, env={}, overrides=with_secret)
    assert cfg.raft.secret_file == "/etc/schedd/raft.key"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"raft.listen": "[::1]:7701", "raft.peers": ["localhost:7711", "127.0.0.2:7721"]},
        {"http.listen": "0.0.0.0:7700"},  # the HTTP side is not part of the rule
    ],
)
def test_loopback_raft_needs_no_secret(overrides: dict[str, object]) -> None:
    assert load_config(None, env={}, overrides=overrides).raft.secret_file is None


def test_secret_file_checks(tmp_path: Path) -> None:
    key = tmp_path / "raft.key"
    cfg = load_config(
        None, env={}, overrides={"raft.listen": "10.0.0.1:7701", "raft.secret_file": str(key)}
    )
    assert check_files(cfg) == [f'raft.secret_file: "{key}" not found']
    with pytest.raises(ConfigError, match="not found"):
        read_raft_secret(cfg)
    key.write_text("short\n")
    assert check_files(cfg) == [
        f'raft.secret_file: "{key}" holds 5 bytes, expected at least 32 '
        "(e.g. `openssl rand -hex 32 > FILE`)"
    ]
    with pytest.raises(ConfigError, match="holds 5 bytes"):
        read_raft_secret(cfg)
    key.write_bytes(b"\x00" * 32)
    assert check_files(cfg) == []
    assert read_raft_secret(cfg) == b"\x00" * 32


def test_check_files_tls_and_dirs(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cfg = load_config(
        None,
        env={},
        overrides={
            "http.tls_cert": str(tmp_path / "cert.pem"),
            "http.tls_key": str(tmp_path / "key.pem"),
            "node.data_dir": str(tmp_path / "file"),
            "auth.tokens_file": str(tmp_path),
        },
    )
    assert cfg.advertise_url() == "https://127.0.0.1:7700"
    got = check_files(cfg)
    assert [g.split(":")[0] for g in got] == [
        "http.tls_cert",
        "http.tls_key",
        "node.data_dir",
        "auth.tokens_file",
    ]


def test_peer_http_explicit() -> None:
    cfg = load_config(
        None,
        env={},
        overrides={
            "raft.peers": ["127.0.0.1:7711"],
            "raft.peer_http": ["https://n2.example.com/"],
            "http.advertise": "https://n1.example.com",
        },
    )
    assert cfg.peer_http_urls() == ("https://n2.example.com",)
    assert cfg.all_http_urls() == ("https://n1.example.com", "https://n2.example.com")


# -- the example and the cluster files --------------------------------------------------------


def _example_sections() -> dict[str, str]:
    """Section name → the example's text of that section (to find commented-out keys)."""
    out: dict[str, str] = {}
    current = ""
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^\[(\w+)\]\s*$", line)
        if m:
            current = m.group(1)
            out[current] = ""
        elif current:
            out[current] += line + "\n"
    return out


def test_example_parses_to_exactly_the_defaults() -> None:
    assert load_config(EXAMPLE, env={}) == Config()


def test_example_documents_every_key_with_its_default() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    texts = _example_sections()
    defaults = Config()
    assert list(data) == list(config_keys())  # every section, in order
    for section, keys in config_keys().items():
        section_defaults = getattr(defaults, section)
        assert set(data[section]) <= set(keys), section
        for key, attr in keys.items():
            default = getattr(section_defaults, attr)
            if default is None:
                # documented commented out, never set
                assert key not in data[section], f"{section}.{key}"
                assert re.search(rf"^# {key} = ", texts[section], re.M), f"{section}.{key}"
                continue
            assert key in data[section], f"{section}.{key} is missing from the example"
            # the example value, parsed alone, equals the dataclass default
            one = load_config(None, env={}, overrides={f"{section}.{key}": data[section][key]})
            assert getattr(getattr(one, section), attr) == default, f"{section}.{key}"
            # and every key has a comment right above it (or above its group)
            lines = texts[section].splitlines()
            at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{key} ="))
            assert any(ln.startswith("#") for ln in lines[max(0, at - 3) : at]), key


def test_schema_matches_dataclasses() -> None:
    for section, keys in config_keys().items():
        cls = type(getattr(Config(), section))
        assert sorted(keys.values()) == sorted(f.name for f in dataclasses.fields(cls))
        for key, attr in keys.items():
            assert attr in (key, f"{key}_ms")
    assert {f.name for f in dataclasses.fields(RaftConfig)} >= {
        "append_entries_period_ms",
        "auto_tick_period_ms",
        "raft_min_timeout_ms",
        "raft_max_timeout_ms",
        "leader_fallback_timeout_ms",
        "log_compaction_min_entries",
        "log_compaction_min_time_ms",
    }
    assert HttpConfig().advertise is None


def test_local_cluster_files_form_one_cluster() -> None:
    cfgs = [load_config(CLUSTER / f"n{i}.toml", env={}) for i in (1, 2, 3)]
    assert [c.node.id for c in cfgs] == ["n1", "n2", "n3"]
    assert [c.http.listen for c in cfgs] == [f"127.0.0.1:77{p}" for p in ("00", "10", "20")]
    assert [c.raft.listen for c in cfgs] == [f"127.0.0.1:77{p}" for p in ("01", "11", "21")]
    assert [c.node.data_dir for c in cfgs] == [".cluster/n1", ".cluster/n2", ".cluster/n3"]
    assert {c.tokens_path for c in cfgs} == {Path(".cluster/tokens.toml")}
    everyone = {c.raft.listen for c in cfgs}
    urls = {c.raft.listen: c.advertise_url() for c in cfgs}
    for c in cfgs:
        assert set(c.raft.peers) == everyone - {c.raft.listen}
        assert c.raft_is_loopback() and c.raft.secret_file is None
        assert c.peer_http_map() == {p: urls[p] for p in c.raft.peers}


def test_namespace_limits_from_toml_env_and_errors() -> None:
    cfg = load_config(
        None,
        env={"SCHEDD_LIMITS_CONCURRENCY": "reports=2,billing=1"},
        overrides={"limits.submit_rate": {"reports": 50}},
    )
    assert cfg.limits.concurrency == (("billing", 1), ("reports", 2))
    assert cfg.limits.submit_rate == (("reports", 50.0),)
    with pytest.raises(ConfigError) as exc:
        load_config(
            None,
            env={},
            overrides={"limits.concurrency": {"Bad!": 1, "ok": -1}, "limits.submit_rate": {"x": 0}},
        )
    problems = exc.value.problems
    assert any(p.startswith("limits.concurrency.Bad!: expected a namespace name") for p in problems)
    assert any(p.startswith("limits.concurrency.ok: expected an integer") for p in problems)
    assert any(p.startswith("limits.submit_rate.x: expected a positive number") for p in problems)


def test_dispatch_ahead_is_bounded_and_may_be_zero() -> None:
    assert load_config(None, env={}).scheduler.dispatch_ahead_ms == 1000
    zero = load_config(None, env={}, overrides={"scheduler.dispatch_ahead": "0s"})
    assert zero.scheduler.dispatch_ahead_ms == 0
    with pytest.raises(
        ConfigError, match=r"scheduler\.dispatch_ahead: expected at most 2s, got 3s"
    ):
        load_config(None, env={}, overrides={"scheduler.dispatch_ahead": "3s"})


# -- the Raft journal's directory, the copy rate, the log's keep cap --------------------------


def test_journal_dir_copy_rate_and_keep_cap_defaults(tmp_path: Path) -> None:
    cfg = load_config(None, env={}, overrides={"node.data_dir": str(tmp_path / "data")})
    r = cfg.raft
    assert r.journal_dir is None and cfg.journal_path == tmp_path / "data" / "raft"
    assert r.snapshot_rate == 32 * 1024 * 1024
    assert r.log_keep_max == 1024 * 1024 * 1024
    assert r.log_compaction_min_time_ms == 10_000 and r.log_compaction_min_entries == 5000


def test_journal_dir_copy_rate_and_keep_cap_from_toml_and_env(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
[raft]
journal_dir = "~/journal"
snapshot_rate = 1048576
log_keep_max = "1GiB"
""",
    )
    cfg = load_config(p, env={})
    assert cfg.journal_path == Path.home() / "journal"
    assert cfg.raft.snapshot_rate == 1024 * 1024 and cfg.raft.log_keep_max == 1024**3
    env = {
        "SCHEDD_RAFT_JOURNAL_DIR": "/srv/journal",
        "SCHEDD_RAFT_SNAPSHOT_RATE": "100MB",
        "SCHEDD_RAFT_LOG_KEEP_MAX": "16777216",
    }
    cfg = load_config(p, env=env)
    assert cfg.journal_path == Path("/srv/journal")
    assert cfg.raft.snapshot_rate == 100_000_000 and cfg.raft.log_keep_max == 16 * 1024 * 1024
    # an empty variable unsets the optional key: back to the default place
    assert load_config(p, env={"SCHEDD_RAFT_JOURNAL_DIR": ""}).raft.journal_dir is None


def test_journal_dir_copy_rate_and_keep_cap_errors(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
[raft]
journal_dir = " "
snapshot_rate = "512KiB"
log_keep_max = "fast"
""",
    )
    assert problems(p) == [
        'raft.journal_dir: expected a non-empty path, got " "',
        "raft.snapshot_rate: expected a size from 1048576 (1MiB) to 10737418240 (10GiB) bytes "
        'per second, got "512KiB"',
        'raft.log_keep_max: expected a size in bytes (an integer or a string like "64KiB", '
        '"1MiB"), got "fast"',
    ]
    assert problems(
        env={"SCHEDD_RAFT_SNAPSHOT_RATE": "quick", "SCHEDD_RAFT_LOG_KEEP_MAX": "65GiB"}
    ) == [
        "raft.snapshot_rate: expected a size in bytes per second (an integer or a string like "
        '"64KiB", "1MiB"), got "quick" (from SCHEDD_RAFT_SNAPSHOT_RATE)',
        "raft.log_keep_max: expected a size from 1048576 (1MiB) to 68719476736 (64GiB) bytes, "
        'got "65GiB" (from SCHEDD_RAFT_LOG_KEEP_MAX)',
    ]


def test_check_files_journal_dir(tmp_path: Path) -> None:
    data, elsewhere = tmp_path / "data", tmp_path / "journal"

    def check(journal_dir: Path) -> list[str]:
        cfg = load_config(
            None,
            env={},
            overrides={"node.data_dir": str(data), "raft.journal_dir": str(journal_dir)},
        )
        return check_files(cfg)

    assert check(elsewhere) == []  # a fresh node: neither exists yet
    (tmp_path / "file").write_text("x")
    assert check(tmp_path / "file") == [
        f'raft.journal_dir: "{tmp_path / "file"}" exists and is not a directory'
    ]
    (data / "raft").mkdir(parents=True)
    (data / "raft" / "raft.journal").write_bytes(b"journal")
    # left behind: the node would start without its log, term and vote
    assert check(elsewhere) == [
        f'raft.journal_dir: the journal is still in "{data / "raft"}"; with the node stopped, '
        f'move raft.journal and raft.journal.state from there to "{elsewhere}" '
        "(or unset raft.journal_dir)"
    ]
    assert check(data / "raft") == []  # the default place, named: the same journal
    elsewhere.mkdir()
    (elsewhere / "raft.journal").write_bytes(b"journal")
    assert check(elsewhere) == [
        f'raft.journal_dir: both "{elsewhere}" and "{data / "raft"}" hold a Raft journal '
        "(raft.journal); keep the one this node last ran with in raft.journal_dir and remove "
        "the other"
    ]
    (data / "raft" / "raft.journal").unlink()  # moved
    assert check(elsewhere) == []
    (data / "raft" / "state.db").write_bytes(b"state")  # the node has run
    assert check(elsewhere) == []
    (elsewhere / "raft.journal").unlink()  # its disk is not mounted, say
    assert check(elsewhere) == [
        f'raft.journal_dir: "{elsewhere}" holds no journal (raft.journal) but "{data / "raft"}" '
        "holds this node's state: is the journal's disk mounted? (a node whose journal is lost "
        "must start with an empty node.data_dir)"
    ]


def test_preflight_creates_and_checks_the_journal_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")

    def check_dirs(journal_dir: Path) -> list[str]:
        cfg = load_config(
            None,
            env={},
            overrides={
                "node.data_dir": str(tmp_path / "data"),
                "raft.journal_dir": str(journal_dir),
            },
        )
        return preflight.check_data_dir(cfg)

    assert check_dirs(tmp_path / "disk2" / "journal") == []
    assert (tmp_path / "disk2" / "journal").is_dir() and (tmp_path / "data" / "raft").is_dir()
    got = check_dirs(tmp_path / "file" / "journal")
    assert len(got) == 1 and got[0].startswith(
        f'raft.journal_dir: cannot create "{tmp_path / "file" / "journal"}": '
    )
    assert "give raft.journal_dir to that user (chown -R)" in got[0]


def test_shards_are_counted_from_one_to_the_ids_limit() -> None:
    assert load_config(None, env={}).cluster.shards == 1
    assert load_config(None, env={}, overrides={"cluster.shards": 32}).cluster.shards == 32
    for bad in (0, 33):
        (problem,) = problems(overrides={"cluster.shards": bad})
        assert problem.startswith("cluster.shards: expected an integer from 1 to 32"), problem


def test_each_shards_raft_port_must_exist_and_miss_the_http_port() -> None:
    (problem,) = problems(
        overrides={
            "cluster.shards": 4,
            "raft.listen": "127.0.0.1:65534",
            "http.listen": "127.0.0.1:7700",
        }
    )
    assert problem == (
        "raft.listen: shard k listens on the Raft port + k, so with cluster.shards = 4 the "
        "port must be at most 65532, got 65534"
    )
    (problem,) = problems(
        overrides={
            "cluster.shards": 3,
            "raft.listen": "127.0.0.1:7700",
            "http.listen": "127.0.0.1:7702",
        }
    )
    assert problem.startswith("http.listen: port 7702 is shard 2's Raft port"), problem
    ok = load_config(
        None,
        env={},
        overrides={
            "cluster.shards": 3,
            "raft.listen": "127.0.0.1:7701",
            "http.listen": "127.0.0.1:7700",
        },
    )
    assert ok.cluster.shards == 3


def test_the_submission_rate_holds_on_each_node_or_for_the_cluster() -> None:
    peers = {"raft.peers": ["127.0.0.2:7701", "127.0.0.3:7701"], "limits.submit_rate": {"r": 6}}
    node = load_config(None, env={}, overrides=peers)
    assert node.limits.submit_rate_scope == "node"  # today's meaning, the default
    assert node.node_submit_rates() == (("r", 6.0),)
    cluster = load_config(None, env={"SCHEDD_LIMITS_SUBMIT_RATE_SCOPE": "cluster"}, overrides=peers)
    assert cluster.node_submit_rates() == (("r", 2.0),)  # a third on each of three nodes
    alone = load_config(
        None,
        env={},
        overrides={"limits.submit_rate": {"r": 6}, "limits.submit_rate_scope": "cluster"},
    )
    assert alone.node_submit_rates() == (("r", 6.0),)  # a cluster of one node
    with pytest.raises(ConfigError) as exc:
        load_config(None, env={}, overrides={"limits.submit_rate_scope": "shard"})
    [problem] = exc.value.problems
    assert problem.startswith(
        'limits.submit_rate_scope: expected one of node, cluster, got "shard"'
    )
