"""Unit tests of the dependency audit's verdicts (scripts/audit.py), on fixed data: no network."""

from __future__ import annotations

import importlib.util
import io
import sys
import urllib.error
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("schedd_audit_script", ROOT / "scripts/audit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


audit = _load()


def doc(latest: str, vulns: list[dict[str, Any]], releases: dict[str, Any] | None = None) -> Any:
    return {"info": {"version": latest}, "releases": releases or {}, "vulnerabilities": vulns}


VULN = {"id": "GHSA-aaaa", "aliases": ["CVE-2099-1", "PYSEC-2099-1"], "fixed_in": ["3.1"]}


def verdict(version: str, data: Any, allow: Any = None, local: str | None = None) -> Any:
    inst = audit.Installed("pkg", version, local)
    if isinstance(data, dict):
        data = audit.parse_project_json(data, version)
    return audit.assess(inst, data, allow or audit.Allowlist())


def test_latest_release_without_records_is_ok() -> None:
    r = verdict("3.0", doc("3.0", []))
    assert (r.status, r.latest) == (audit.OK, "3.0")


def test_version_equality_is_normalised() -> None:
    assert verdict("3.0.0", doc("3.0", [])).status == audit.OK


def test_a_record_on_the_installed_latest_release_fails() -> None:
    r = verdict("3.0", doc("3.0", [VULN]))
    assert r.status == audit.VULNERABLE and r.status in audit.FAILING
    assert r.ids == ("GHSA-aaaa",)
    assert "CVE-2099-1" in r.detail and "fixed in 3.1" in r.detail


def test_withdrawn_records_are_ignored() -> None:
    assert verdict("3.0", doc("3.0", [{**VULN, "withdrawn": "2099-01-02"}])).status == audit.OK


@pytest.mark.parametrize("ident", ["GHSA-aaaa", "CVE-2099-1", "PYSEC-2099-1"])
def test_allowlisting_by_id_or_alias_accepts(ident: str) -> None:
    allow = audit.Allowlist(vulns=[audit.VulnAllow(ident, "not reachable here")])
    r = verdict("3.0", doc("3.0", [VULN]), allow)
    assert r.status == audit.ACCEPTED and r.status not in audit.FAILING
    assert audit.stale_entries(allow, [r]) == []


def test_allowlist_entry_for_another_package_does_not_accept() -> None:
    allow = audit.Allowlist(vulns=[audit.VulnAllow("GHSA-aaaa", "r", package="other")])
    r = verdict("3.0", doc("3.0", [VULN]), allow)
    assert r.status == audit.VULNERABLE
    assert audit.stale_entries(allow, [r]) == ["[[vulnerability]] GHSA-aaaa"]


def test_one_unaccepted_record_among_accepted_still_fails() -> None:
    other = {"id": "GHSA-bbbb", "aliases": [], "fixed_in": []}
    allow = audit.Allowlist(vulns=[audit.VulnAllow("GHSA-aaaa", "r")])
    r = verdict("3.0", doc("3.0", [VULN, other]), allow)
    assert r.status == audit.VULNERABLE
    assert "GHSA-bbbb" in r.detail and "GHSA-aaaa" not in r.detail


def test_an_older_release_is_unverified_even_without_records_on_the_latest() -> None:
    # The index's records describe the latest release only: silence about it says nothing
    # about the installed one.
    r = verdict("2.0", doc("3.0", []))
    assert r.status == audit.UNVERIFIED and "latest" in r.detail


def test_an_older_release_shows_the_latest_records_as_a_hint() -> None:
    r = verdict("2.0", doc("3.0", [{**VULN, "fixed_in": []}]))
    assert r.status == audit.UNVERIFIED and "GHSA-aaaa" in r.detail


def test_unaudited_entry_must_name_the_exact_version() -> None:
    allow = audit.Allowlist(unaudited=[audit.UnauditedAllow("pkg", "2.0", "seeded by venv")])
    assert verdict("2.0", doc("3.0", []), allow).status == audit.UNAUDITED_OK
    r = verdict("2.1", doc("3.0", []), allow)
    assert r.status == audit.UNVERIFIED
    assert audit.stale_entries(allow, [r]) == ["[[unaudited]] pkg 2.0"]


def test_fetch_failures_and_local_installs_are_errors() -> None:
    assert verdict("1.0", audit.FetchError("unreachable")).status == audit.ERROR
    r = verdict("1.0", doc("1.0", []), local="file:///src/pkg")
    assert r.status == audit.ERROR and "file:///src/pkg" in r.detail
    allow = audit.Allowlist(unaudited=[audit.UnauditedAllow("pkg", "1.0", "vendored")])
    assert verdict("1.0", audit.FetchError("x"), allow).status == audit.UNAUDITED_OK


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"info": {"version": "1.0"}, "releases": {}},  # no vulnerabilities key: not "none"
        {"info": {}, "vulnerabilities": []},
        {"info": {"version": "1.0"}, "vulnerabilities": [{"aliases": []}]},
        {"info": {"version": "1.0"}, "vulnerabilities": [{"id": "X", "aliases": "CVE-1"}]},
    ],
)
def test_malformed_documents_are_rejected(bad: Any) -> None:
    with pytest.raises(ValueError):
        audit.parse_project_json(bad, "1.0")


def test_yanked_installed_release_is_noted() -> None:
    files = [{"yanked": True, "yanked_reason": "broken wheel"}]
    r = verdict("3.0", doc("3.0", [], {"3.0": files}))
    assert r.status == audit.OK and "broken wheel" in r.detail


def test_the_repository_allowlist_parses() -> None:
    allow = audit.load_allowlist(ROOT / "config/audit-allowlist.toml")
    assert all(e.reason.strip() for e in [*allow.vulns, *allow.unaudited])


@pytest.mark.parametrize(
    "text",
    [
        '[[vulnerability]]\nid = "GHSA-x"\n',  # no reason
        '[[vulnerability]]\nid = "GHSA-x"\nreason = "  "\n',
        '[[unaudited]]\npackage = "p"\nreason = "r"\n',  # no version
        '[[vulnerability]]\nid = "GHSA-x"\nreason = "r"\nexpires = "soon"\n',
        '[[ignore]]\nid = "x"\n',
    ],
)
def test_allowlist_entries_need_their_fields_and_a_reason(tmp_path: Path, text: str) -> None:
    path = tmp_path / "allow.toml"
    path.write_text(text)
    with pytest.raises(audit.AllowlistError):
        audit.load_allowlist(path)


class _Response(io.BytesIO):
    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_fetch_retries_a_transient_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def urlopen(req: Any, timeout: float, context: Any) -> _Response:
        calls.append(req.full_url)
        if len(calls) == 1:
            raise urllib.error.URLError("temporary failure in name resolution")
        return _Response(b'{"ok": true}')

    monkeypatch.setattr(audit.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(audit.time, "sleep", lambda s: None)
    deadline = audit.time.monotonic() + 30
    assert audit.fetch_json("https://x/p/json", timeout=5, attempts=3, deadline=deadline) == {
        "ok": True
    }
    assert len(calls) == 2


@pytest.mark.parametrize("code,tries", [(404, 1), (403, 1), (503, 3)])
def test_fetch_gives_up_with_an_error(
    monkeypatch: pytest.MonkeyPatch, code: int, tries: int
) -> None:
    calls: list[int] = []

    def urlopen(req: Any, timeout: float, context: Any) -> _Response:
        calls.append(1)
        raise urllib.error.HTTPError(req.full_url, code, "nope", {}, None)

    monkeypatch.setattr(audit.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(audit.time, "sleep", lambda s: None)
    deadline = audit.time.monotonic() + 30
    with pytest.raises(audit.FetchError):
        audit.fetch_json("https://x/p/json", timeout=5, attempts=3, deadline=deadline)
    assert len(calls) == tries


def test_fetch_respects_the_overall_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit.urllib.request, "urlopen", lambda *a, **k: pytest.fail("fetched"))
    with pytest.raises(audit.FetchError, match="deadline"):
        audit.fetch_json("https://x/p/json", timeout=5, attempts=3, deadline=0.0)
