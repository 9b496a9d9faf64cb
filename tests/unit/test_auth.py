"""schedd.auth: the tokens file, bearer authentication, roles, the embedded admin token."""

from __future__ import annotations

import logging
import os
import stat
import string
import threading
import time
from pathlib import Path

import pytest

from schedd.auth import (
    ACTIONS,
    SESSION_PREFIX,
    LoginCodes,
    Role,
    Token,
    TokenStore,
    ensure_admin_token,
    load_tokens,
    require,
)
from schedd.errors import ConfigError, PermissionDenied, Unauthenticated

SECRETS = {
    "ops": "ops-secret-0123456789",
    "ci": "ci-secret-0123456789",
    "viewer": "viewer-secret-0123456789",
    "pool": "pool-secret-0123456789",
}
URL_SAFE = set(string.ascii_letters + string.digits + "-_")
ROLES = {"ops": "admin", "ci": "submit", "viewer": "read", "pool": "worker"}


def tokens_file(tmp_path: Path, text: str | None = None) -> Path:
    if text is None:
        text = "".join(
            f'[[token]]\nname = "{n}"\nsecret = "{SECRETS[n]}"\nrole = "{ROLES[n]}"\n\n'
            for n in SECRETS
        )
    p = tmp_path / "tokens.toml"
    p.write_text(text)
    p.chmod(0o600)
    return p


def test_load_and_authenticate(tmp_path: Path) -> None:
    store = load_tokens(tokens_file(tmp_path))
    assert len(store) == 4
    assert store.tokens[0] == Token("ops", Role.ADMIN)
    for name, secret in SECRETS.items():
        token = store.authenticate(f"Bearer {secret}")
        assert token.name == name and token.role == ROLES[name]
    assert store.authenticate(f"bearer   {SECRETS['ci']}  ").name == "ci"
    assert "secret" not in repr(store) and SECRETS["ops"] not in repr(store)


MISSING = "missing Authorization header: send 'Authorization: Bearer <token>'"
MALFORMED = "malformed Authorization header: expected 'Authorization: Bearer <token>'"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, MISSING),
        ("", MISSING),
        ("  ", MISSING),
        ("Bearer", MALFORMED),
        ("Bearer ", MALFORMED),
        ("Basic b3BzOnNlY3JldA==", MALFORMED),
        ("ops-secret-0123456789", MALFORMED),
        ("Bearer ops-secret-012345678", "invalid token"),
        ("Bearer ops-secret-0123456789x", "invalid token"),
        ("Bearer OPS-SECRET-0123456789", "invalid token"),
    ],
)
def test_authenticate_refuses_with_a_401_that_says_what_to_send(
    tmp_path: Path, header: str | None, message: str
) -> None:
    store = load_tokens(tokens_file(tmp_path))
    with pytest.raises(Unauthenticated) as info:
        store.authenticate(header)
    assert info.value.message == message
    assert info.value.http_status == 401
    assert SECRETS["ops"] not in info.value.message


def test_empty_store_denies_everything() -> None:
    with pytest.raises(Unauthenticated):
        TokenStore().authenticate("Bearer anything-at-all-long")


def test_authenticate_compares_every_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import hmac

    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", spy)
    store = TokenStore([(Token(f"t{i}", Role.READ), f"secret-number-{i:04d}") for i in range(5)])
    assert store.authenticate("Bearer secret-number-0000").name == "t0"
    assert len(calls) == 5  # no early exit on the first match
    calls.clear()
    with pytest.raises(Unauthenticated):
        store.authenticate("Bearer x")
    assert calls == [(32, 32)] * 5  # sha256 on both sides: no length leak


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        ("admin", {"read", "submit", "admin", "worker"}),
        ("submit", {"read", "submit"}),
        ("read", {"read"}),
        ("worker", {"read", "worker"}),
    ],
)
def test_roles(role: str, allowed: set[str]) -> None:
    token = Token("t", Role(role))
    for action in ACTIONS:
        if action in allowed:
            require(token, action)
        else:
            with pytest.raises(PermissionDenied) as info:
                require(token, action)
            assert info.value.http_status == 403
            assert role in info.value.message and action in info.value.message


def test_permission_denied_names_the_token_its_role_and_the_roles_allowed() -> None:
    with pytest.raises(PermissionDenied) as info:
        require(Token("viewer", Role.READ), "submit")
    assert info.value.message == (
        "token 'viewer' has role 'read', which may not perform 'submit' (allowed: admin, submit)"
    )


def test_unknown_action_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match=r"^unknown action 'delete-everything'$"):
        require(Token("t", Role.ADMIN), "delete-everything")


def test_bad_entries_are_all_named(tmp_path: Path) -> None:
    p = tokens_file(
        tmp_path,
        """
extra = 1
[[token]]
name = "ok"
secret = "0123456789abcdef"
role = "admin"

[[token]]
name = ""
secret = "short"
role = "admin"

[[token]]
name = "c"
secret = "0123456789abcdefX"
role = "superuser"
colour = "red"

[[token]]
name = "ok"
secret = "0123456789abcdef"
role = "read"

[[token]]
name = "e"
secret = 12345678901234567890
""",
    )
    with pytest.raises(ConfigError) as info:
        load_tokens(p)
    got = [g.removeprefix(f"{p}: ") for g in info.value.problems]
    assert got == [
        "extra: unknown key (expected [[token]] entries)",
        "token[1].name: expected a non-empty string",
        "token[1].secret: expected a string of at least 16 characters, got 5 characters",
        "token[2].colour: unknown key (expected one of: name, secret, role)",
        'token[2].role: expected one of admin, submit, read, worker, got "superuser"',
        "token[3].name: duplicate of token[0]",
        "token[3].secret: same secret as token[0]",
        "token[4].secret: expected a string of at least 16 characters, got int",
        "token[4].role: expected one of admin, submit, read, worker, got nothing",
    ]
    assert "short" not in str(info.value)  # secrets never appear in messages


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        ("", ["token: expected at least one [[token]] entry"]),
        ("token = 3\n", ["token: expected [[token]] entries (an array of tables)"]),
        (
            'token = [1, "x"]\n',
            [
                "token[0]: expected a table with name, secret and role",
                "token[1]: expected a table with name, secret and role",
            ],
        ),
        (
            '[[token]]\nname = "a"\nrole = "read"\n',
            ["token[0].secret: expected a string of at least 16 characters, got nothing"],
        ),
    ],
)
def test_a_bad_file_is_refused_with_every_problem_named_after_the_file(
    tmp_path: Path, text: str, problems: list[str]
) -> None:
    p = tokens_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_tokens(p)
    assert info.value.problems == [f"{p}: {problem}" for problem in problems]


def test_a_file_that_is_not_toml_is_refused_naming_the_file_and_the_line(tmp_path: Path) -> None:
    p = tokens_file(tmp_path, '[[token]]\nname = "a"\nsecret = "s3cr3t-unterminated\n')
    with pytest.raises(ConfigError) as info:
        load_tokens(p)
    [problem] = info.value.problems
    assert problem.startswith(f"{p}: not valid TOML: ") and "line 3" in problem
    assert "s3cr3t" not in problem  # not even a broken secret is echoed


def test_an_unreadable_tokens_file_is_a_config_error_saying_why(tmp_path: Path) -> None:
    p = tmp_path / "tokens.toml"
    p.mkdir()
    with pytest.raises(ConfigError) as info:
        load_tokens(p)
    assert info.value.problems == [f"{p}: cannot read the tokens file: Is a directory"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokens file not found"):
        load_tokens(tmp_path / "nope.toml")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601])
def test_a_file_other_users_can_read_logs_a_warning_with_path_and_mode_not_the_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    p = tokens_file(tmp_path)
    p.chmod(mode)
    with caplog.at_level(logging.DEBUG, logger="schedd.auth"):
        load_tokens(p)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "tokens file is readable by other users"
    assert record.__dict__["fields"] == {"path": str(p), "mode": oct(mode)}
    assert all(s not in caplog.text for s in SECRETS.values())


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_file_only_its_owner_can_read_loads_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    p = tokens_file(tmp_path)
    p.chmod(mode)
    with caplog.at_level(logging.DEBUG, logger="schedd.auth"):
        assert len(load_tokens(p)) == 4
    assert caplog.records == []


def test_ensure_admin_token_creates_0600(tmp_path: Path) -> None:
    p = tmp_path / "data" / "tokens.toml"
    secret, created = ensure_admin_token(p)
    assert created and len(secret) >= 32
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) & 0o077 == 0
    store = load_tokens(p)
    assert store.tokens == (Token("admin", Role.ADMIN),)
    assert store.authenticate(f"Bearer {secret}").role is Role.ADMIN
    assert [f.name for f in p.parent.iterdir()] == ["tokens.toml"]  # no temp file left
    # a second call keeps the file and hands back the existing admin secret
    before = p.read_bytes()
    assert ensure_admin_token(p) == (secret, False)
    assert p.read_bytes() == before


def test_a_created_tokens_file_explains_itself(tmp_path: Path) -> None:
    p = tmp_path / "tokens.toml"
    secret, created = ensure_admin_token(p)
    assert created
    assert p.read_text() == (
        "# schedd API tokens (reloaded on SIGHUP). Roles: admin | submit | read | worker.\n"
        "# Clients send 'Authorization: Bearer <secret>'.\n"
        "[[token]]\n"
        'name = "admin"\n'
        f'secret = "{secret}"\n'
        'role = "admin"\n'
    )


def test_ensure_admin_token_creates_missing_parent_directories(tmp_path: Path) -> None:
    p = tmp_path / "var" / "lib" / "schedd" / "tokens.toml"
    secret, created = ensure_admin_token(p)
    assert created and load_tokens(p).authenticate(f"Bearer {secret}").role is Role.ADMIN
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o700


def test_the_new_secret_is_written_only_next_to_the_tokens_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # never through the shared temporary directory: it may be another file system (os.link
    # across devices fails) and other users' ground; here it does not even exist
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))
    p = tmp_path / "etc" / "tokens.toml"
    secret, created = ensure_admin_token(p)
    assert created and load_tokens(p).authenticate(f"Bearer {secret}").name == "admin"
    assert not (tmp_path / "no-such-tmpdir").exists()
    assert [f.name for f in p.parent.iterdir()] == ["tokens.toml"]


def test_ensure_admin_token_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        _, created = ensure_admin_token(tmp_path / "tokens.toml")
    finally:
        os.umask(old)
    assert created and stat.S_IMODE((tmp_path / "tokens.toml").stat().st_mode) == 0o600


def test_ensure_admin_token_keeps_an_existing_file(tmp_path: Path) -> None:
    p = tokens_file(tmp_path)
    assert ensure_admin_token(p) == (SECRETS["ops"], False)
    p.write_text('[[token]]\nname = "w"\nsecret = "worker-secret-123456"\nrole = "worker"\n')
    assert ensure_admin_token(p) == ("", False)


def test_ensure_admin_token_races_create_one_file(tmp_path: Path) -> None:
    p = tmp_path / "shared" / "tokens.toml"
    results: list[tuple[str, bool]] = []
    barrier = threading.Barrier(8)

    def go() -> None:
        barrier.wait()
        results.append(ensure_admin_token(p))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(created for _, created in results) == 1
    assert len({secret for secret, _ in results}) == 1  # everyone sees the same, full file


def test_new_secrets_never_start_with_a_dash() -> None:
    from schedd.auth import new_secret

    secrets_ = [new_secret() for _ in range(2000)]
    assert not any(s.startswith("-") for s in secrets_)
    # 256 bits, as 43 URL-safe characters
    assert len(set(secrets_)) == len(secrets_) and all(len(s) == 43 for s in secrets_)
    assert all(set(s) <= URL_SAFE for s in secrets_)


@pytest.mark.parametrize(
    ("role", "got"),
    [('["admin"]', "list"), ('{ name = "admin" }', "dict"), ("7", "int"), ("true", "bool")],
)
def test_a_role_of_the_wrong_type_is_a_config_error_naming_the_entry(
    tmp_path: Path, role: str, got: str
) -> None:
    # a list or a table once reached `role in {...}` and crashed with TypeError (unhashable)
    p = tokens_file(
        tmp_path, f'[[token]]\nname = "a"\nsecret = "0123456789abcdefgh"\nrole = {role}\n'
    )
    with pytest.raises(ConfigError) as info:
        load_tokens(p)
    assert info.value.problems == [
        f"{p}: token[0].role: expected one of admin, submit, read, worker, got {got}"
    ]


@pytest.mark.parametrize("secret", [" 0123456789abcdefgh", "0123456789abcdefgh\t", " " * 20])
def test_a_secret_no_client_can_present_is_refused(tmp_path: Path, secret: str) -> None:
    # the Authorization header is stripped, so leading or trailing whitespace can never match
    p = tokens_file(tmp_path, f'[[token]]\nname = "a"\nsecret = "{secret}"\nrole = "read"\n')
    with pytest.raises(ConfigError) as info:
        load_tokens(p)
    assert info.value.problems == [
        f"{p}: token[0].secret: starts or ends with whitespace, which a client cannot send"
    ]
    assert "0123456789" not in str(info.value)  # never the secret itself


# -- dashboard sessions (schedctl ui) ---------------------------------------------------------


def test_a_session_is_its_tokens_role_on_every_node_that_has_the_token(tmp_path: Path) -> None:
    path = tokens_file(tmp_path)
    here, there = load_tokens(path), load_tokens(path)  # two nodes, the same tokens file
    ops = here.authenticate(f"Bearer {SECRETS['ops']}")
    session = here.session(ops, int(time.time()) + 60)
    assert session.startswith(SESSION_PREFIX) and SECRETS["ops"] not in session
    assert there.authenticate(f"Bearer {session}") == Token("ops", Role.ADMIN)
    read_only = here.session(ops, int(time.time()) + 60, read_only=True)
    assert there.authenticate(f"Bearer {read_only}") == Token("ops", Role.READ)


@pytest.mark.parametrize(
    "change",
    [
        "expired",
        "forged",
        "role raised",
        "token removed",
        "secret changed",
        "role changed",
        "garbled",
        "name not base64",
    ],
)
def test_a_session_ends_with_its_time_and_with_its_token(tmp_path: Path, change: str) -> None:
    path = tokens_file(tmp_path)
    store = load_tokens(path)
    ci = store.authenticate(f"Bearer {SECRETS['ci']}")
    expires = int(time.time()) + 60
    session = store.session(ci, expires)
    assert store.authenticate(f"Bearer {session}") == ci
    name, role, at, mac = session.removeprefix(SESSION_PREFIX).split(".")
    text = path.read_text()
    if change == "expired":
        session = store.session(ci, int(time.time()) - 1)
    elif change == "forged":
        session = SESSION_PREFIX + ".".join((name, role, str(expires + 3600), mac))
    elif change == "role raised":
        session = SESSION_PREFIX + ".".join((name, "admin", at, mac))
    elif change == "garbled":
        session = SESSION_PREFIX + "not.a.session"
    elif change == "name not base64":
        session = SESSION_PREFIX + ".".join(("c!", role, at, mac))
    else:
        if change == "token removed":
            text = text.replace('name = "ci"', 'name = "ci-2"')
        elif change == "secret changed":
            text = text.replace(SECRETS["ci"], "another-secret-0123456789")
        else:
            text = text.replace('role = "submit"', 'role = "read"')
        path.write_text(text)
        store = load_tokens(path)  # a reload (SIGHUP)
    with pytest.raises(Unauthenticated) as exc:
        store.authenticate(f"Bearer {session}")
    if change in ("garbled", "name not base64"):
        assert str(exc.value) == "invalid token"


def test_a_session_is_not_minted_for_a_token_the_store_no_longer_has(tmp_path: Path) -> None:
    store = load_tokens(tokens_file(tmp_path))
    with pytest.raises(Unauthenticated, match="changed or removed"):
        store.session(Token("ci", Role.ADMIN), int(time.time()) + 60)  # ci is submit


def test_a_tokens_file_secret_cannot_look_like_a_session(tmp_path: Path) -> None:
    path = tokens_file(
        tmp_path,
        f'[[token]]\nname = "x"\nsecret = "{SESSION_PREFIX}0123456789abcdef"\nrole = "read"\n',
    )
    with pytest.raises(ConfigError, match=r"token\[0\]\.secret: starts with 'ui1\.'"):
        load_tokens(path)


def test_a_login_code_is_good_once_and_for_its_time_only() -> None:
    now = [100.0]
    codes = LoginCodes(ttl_s=60, cap=3, clock=lambda: now[0])
    viewer = Token("viewer", Role.READ)
    code = codes.issue(viewer)
    assert len(code) >= 40 and codes.take(code) == (viewer, False)
    with pytest.raises(Unauthenticated, match="unknown, used or expired"):
        codes.take(code)  # used
    late = codes.issue(viewer, read_only=True)
    now[0] += 60
    with pytest.raises(Unauthenticated):
        codes.take(late)  # expired
    kept = [codes.issue(viewer) for _ in range(4)]  # at most 3: the oldest goes
    with pytest.raises(Unauthenticated):
        codes.take(kept[0])
    assert [codes.take(c) for c in kept[1:]] == [(viewer, False)] * 3
    with pytest.raises(Unauthenticated):
        codes.take("")
