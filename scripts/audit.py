"""Dependency audit: every distribution installed in the running interpreter's environment
(run by scripts/audit as .venv/bin/python, so the runtime and test dependencies) is checked
against the vulnerability records the package index publishes.

Why not pip-audit: on this project's machines the only reachable vulnerability data is the
index's per-project JSON document (``/pypi/<name>/json``). Its ``vulnerabilities`` list covers
the project's *latest* release only; the per-release documents (``/pypi/<name>/<version>/json``,
which pip-audit's PyPI service reads) answer 404 and the OSV service does not resolve, so
pip-audit skips every package and still prints "No known vulnerabilities found" with exit 0.

So this audit judges an installed version only when it *is* the latest release (the index
has matched the records to exactly that release). It fails closed:

* VULNERABLE  a non-withdrawn record applies to the installed version and is not allowlisted;
* UNVERIFIED  the installed version is not the latest release, so no record covers it;
* ERROR       the document could not be fetched (after retries), is not on the index, or is
              malformed; or the distribution was installed from a local path / URL.

UNVERIFIED and ERROR pass only with an ``[[unaudited]]`` entry (package + exact version +
reason) in the allowlist; VULNERABLE passes only with a ``[[vulnerability]]`` entry (id or alias
+ reason). Exit status: 0 clean, 1 findings or errors, 2 bad usage or allowlist.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import sysconfig
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.client import HTTPException
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ALLOWLIST = ROOT / "config" / "audit-allowlist.toml"
DEFAULT_INDEX = "https://pypi.org/pypi"
RETRYABLE_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})

OK = "ok"
ACCEPTED = "accepted"
UNAUDITED_OK = "unaudited (allowlisted)"
SKIPPED = "skipped (this project)"
VULNERABLE = "VULNERABLE"
UNVERIFIED = "UNVERIFIED"
ERROR = "ERROR"
FAILING = (VULNERABLE, UNVERIFIED, ERROR)


class AllowlistError(Exception):
    pass


class FetchError(Exception):
    pass


@dataclass(frozen=True)
class Installed:
    name: str  # canonical (PEP 503) name
    version: str
    local_url: str | None = None  # set when installed from a path or URL, not from the index


@dataclass(frozen=True)
class Vuln:
    id: str
    aliases: tuple[str, ...] = ()
    fixed_in: tuple[str, ...] = ()
    summary: str = ""
    link: str = ""

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


@dataclass(frozen=True)
class IndexData:
    latest: str
    vulns: tuple[Vuln, ...]
    yanked_reason: str | None = None  # not None: the installed release is yanked


@dataclass(frozen=True)
class VulnAllow:
    id: str
    reason: str
    package: str | None = None


@dataclass(frozen=True)
class UnauditedAllow:
    package: str
    version: str
    reason: str


@dataclass
class Allowlist:
    vulns: list[VulnAllow] = field(default_factory=list)
    unaudited: list[UnauditedAllow] = field(default_factory=list)

    def vuln_entry(self, package: str, vuln: Vuln) -> VulnAllow | None:
        for entry in self.vulns:
            if entry.id in vuln.ids and entry.package in (None, package):
                return entry
        return None

    def unaudited_entry(self, package: str, version: str) -> UnauditedAllow | None:
        for entry in self.unaudited:
            if entry.package == package and same_version(entry.version, version):
                return entry
        return None


@dataclass(frozen=True)
class Result:
    name: str
    version: str
    latest: str
    status: str
    detail: str
    ids: tuple[str, ...] = ()
    allowed_by: tuple[VulnAllow | UnauditedAllow, ...] = ()


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.strip().lower() == b.strip().lower()


def _str_list(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is not a list of strings")
    return tuple(value)


def parse_project_json(doc: Any, installed_version: str) -> IndexData:
    """The parts of a ``/pypi/<name>/json`` document the audit needs; ValueError if malformed.

    A missing ``vulnerabilities`` key is malformed, not "no vulnerabilities" (fail closed)."""
    if not isinstance(doc, Mapping):
        raise ValueError("document is not a JSON object")
    info = doc.get("info")
    if not isinstance(info, Mapping) or not isinstance(info.get("version"), str):
        raise ValueError("no info.version")
    records = doc.get("vulnerabilities")
    if not isinstance(records, list):
        raise ValueError("no 'vulnerabilities' list")
    vulns: list[Vuln] = []
    for rec in records:
        if not isinstance(rec, Mapping) or not isinstance(rec.get("id"), str):
            raise ValueError("vulnerability record without an id")
        if rec.get("withdrawn"):
            continue
        vulns.append(
            Vuln(
                id=rec["id"],
                aliases=_str_list(rec.get("aliases"), f"{rec['id']}.aliases"),
                fixed_in=_str_list(rec.get("fixed_in"), f"{rec['id']}.fixed_in"),
                summary=str(rec.get("summary") or rec.get("details") or "").strip(),
                link=str(rec.get("link") or ""),
            )
        )
    yanked_reason: str | None = None
    releases = doc.get("releases")
    if isinstance(releases, Mapping):
        for version, files in releases.items():
            if isinstance(files, list) and files and same_version(version, installed_version):
                if all(isinstance(f, Mapping) and f.get("yanked") for f in files):
                    yanked_reason = str(files[0].get("yanked_reason") or "no reason given")
    return IndexData(latest=info["version"], vulns=tuple(vulns), yanked_reason=yanked_reason)


def _describe(vulns: Sequence[Vuln]) -> str:
    parts = []
    for v in vulns:
        fixed = f" (fixed in {', '.join(v.fixed_in)})" if v.fixed_in else " (no fix released)"
        parts.append(f"{'/'.join(v.ids)}{fixed}")
    return "; ".join(parts)


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "… (see allowlist)"


def assess(inst: Installed, data: IndexData | FetchError, allow: Allowlist) -> Result:
    """The verdict for one installed distribution (pure: no I/O)."""
    if isinstance(data, FetchError) or inst.local_url is not None:
        why = str(data) if isinstance(data, FetchError) else f"installed from {inst.local_url}"
        latest = "?"
        status, detail = ERROR, why
    elif not same_version(inst.version, data.latest):
        latest = data.latest
        status = UNVERIFIED
        detail = (
            f"not the latest release ({data.latest}): the index publishes vulnerability "
            "records for the latest release only"
        )
        if data.vulns:
            detail += f"; the latest has {_describe(data.vulns)}"
    else:
        latest = data.latest
        if not data.vulns:
            note = (
                f"installed release is yanked: {data.yanked_reason}" if data.yanked_reason else ""
            )
            return Result(inst.name, inst.version, latest, OK, note)
        ids = tuple(v.id for v in data.vulns)
        entries = [allow.vuln_entry(inst.name, v) for v in data.vulns]
        open_vulns = [v for v, e in zip(data.vulns, entries, strict=True) if e is None]
        used = tuple(e for e in entries if e is not None)
        if open_vulns:
            return Result(
                inst.name, inst.version, latest, VULNERABLE, _describe(open_vulns), ids, used
            )
        return Result(inst.name, inst.version, latest, ACCEPTED, _describe(data.vulns), ids, used)
    entry = allow.unaudited_entry(inst.name, inst.version)
    if entry is not None:
        return Result(
            inst.name,
            inst.version,
            latest,
            UNAUDITED_OK,
            f"{detail}; allowed: {_short(entry.reason)}",
            allowed_by=(entry,),
        )
    return Result(inst.name, inst.version, latest, status, detail)


def load_allowlist(path: Path) -> Allowlist:
    if not path.exists():
        return Allowlist()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise AllowlistError(f"{path}: {e}") from e
    unknown = set(doc) - {"vulnerability", "unaudited"}
    if unknown:
        raise AllowlistError(f"{path}: unknown tables {sorted(unknown)}")
    allow = Allowlist()
    for i, entry in enumerate(doc.get("vulnerability", [])):
        where = f"{path}: [[vulnerability]] #{i + 1}"
        _check_entry(entry, where, required=("id", "reason"), optional=("package",))
        pkg = entry.get("package")
        allow.vulns.append(
            VulnAllow(entry["id"], entry["reason"], canonicalize_name(pkg) if pkg else None)
        )
    for i, entry in enumerate(doc.get("unaudited", [])):
        where = f"{path}: [[unaudited]] #{i + 1}"
        _check_entry(entry, where, required=("package", "version", "reason"), optional=())
        allow.unaudited.append(
            UnauditedAllow(canonicalize_name(entry["package"]), entry["version"], entry["reason"])
        )
    return allow


def _check_entry(entry: Any, where: str, required: Sequence[str], optional: Sequence[str]) -> None:
    if not isinstance(entry, dict):
        raise AllowlistError(f"{where}: not a table")
    extra = set(entry) - set(required) - set(optional)
    if extra:
        raise AllowlistError(f"{where}: unknown keys {sorted(extra)}")
    for key in (*required, *optional):
        if key in entry and not (isinstance(entry[key], str) and entry[key].strip()):
            raise AllowlistError(f"{where}: '{key}' must be a non-empty string")
    missing = [k for k in required if k not in entry]
    if missing:
        raise AllowlistError(f"{where}: missing {missing} (every entry needs a reason)")


def installed_distributions(project: str | None) -> tuple[list[Installed], list[Installed]]:
    """(to audit, skipped): every distribution in this environment's site-packages. Only the
    project itself, installed from a local path, is skipped; anything else from a path or URL
    is kept (and so reported as an ERROR unless allowlisted)."""
    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    seen: dict[str, Installed] = {}
    skipped: list[Installed] = []
    for dist in metadata.distributions(path=paths):
        raw_name = dist.metadata["Name"]
        if not raw_name:
            continue
        name = canonicalize_name(raw_name)
        if name in seen:
            continue
        local_url: str | None = None
        direct = dist.read_text("direct_url.json")
        if direct:
            try:
                local_url = str(json.loads(direct).get("url") or "unknown location")
            except (ValueError, AttributeError):
                local_url = "unknown location"
        inst = Installed(name, dist.version, local_url)
        if project and name == project and local_url and local_url.startswith("file:"):
            skipped.append(inst)
            continue
        seen[name] = inst
    return sorted(seen.values(), key=lambda i: i.name), skipped


def fetch_json(url: str, *, timeout: float, attempts: int, deadline: float) -> Any:
    """GET url as JSON: a bounded timeout per attempt, retrying transient failures (network,
    408/429/5xx, truncated or garbled body) with a short backoff; FetchError at the end."""
    ctx = ssl.create_default_context()
    last = "no attempt made"
    for attempt in range(attempts):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchError(f"audit deadline reached before fetching ({last})")
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=min(timeout, remaining), context=ctx) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise FetchError("not found on the index (404)") from e
            last = f"HTTP {e.code}"
            if e.code not in RETRYABLE_HTTP:
                break
        except (urllib.error.URLError, TimeoutError, OSError, HTTPException, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            last = f"{type(e).__name__}: {reason}"
        if attempt + 1 < attempts:
            time.sleep(min(1.0 * (attempt + 1), max(0.0, deadline - time.monotonic())))
    raise FetchError(f"unreachable after {attempts} attempt(s): {last}")


def project_name() -> str | None:
    try:
        doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    name = doc.get("project", {}).get("name")
    return canonicalize_name(name) if isinstance(name, str) else None


def print_table(results: Sequence[Result]) -> None:
    headers = ("package", "installed", "latest", "status", "detail")
    rows = [(r.name, r.version, r.latest, r.status, r.detail) for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers[:4])]
    for row in (headers, *rows):
        cells = [c.ljust(w) for c, w in zip(row[:4], widths, strict=False)]
        print("  ".join([*cells, row[4]]).rstrip())


def stale_entries(allow: Allowlist, results: Sequence[Result]) -> list[str]:
    used = {id(e) for r in results for e in r.allowed_by}
    out = [f"[[vulnerability]] {e.id}" for e in allow.vulns if id(e) not in used]
    out += [f"[[unaudited]] {e.package} {e.version}" for e in allow.unaudited if id(e) not in used]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--allowlist", type=Path, default=DEFAULT_ALLOWLIST)
    ap.add_argument("--index", default=DEFAULT_INDEX, help="JSON API base (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per request attempt")
    ap.add_argument("--attempts", type=int, default=3, help="tries per package (1 + retries)")
    ap.add_argument("--budget", type=float, default=50.0, help="seconds for all fetches")
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        allow = load_allowlist(args.allowlist)
    except AllowlistError as e:
        print(f"audit: bad allowlist: {e}", file=sys.stderr)
        return 2

    to_audit, skipped = installed_distributions(project_name())
    print(f"audit: {len(to_audit)} distributions installed in {sys.prefix}")
    for s in skipped:
        print(f"audit: not audited: {s.name} {s.version} (this project, from {s.local_url})")
    if not to_audit:
        print("audit: FAILED: found no installed distributions")
        return 1

    started = time.monotonic()
    deadline = started + args.budget

    def fetch(inst: Installed) -> IndexData | FetchError:
        if inst.local_url is not None:
            return FetchError(f"installed from {inst.local_url}")
        url = f"{args.index.rstrip('/')}/{inst.name}/json"
        try:
            doc = fetch_json(url, timeout=args.timeout, attempts=args.attempts, deadline=deadline)
            return parse_project_json(doc, inst.version)
        except FetchError as e:
            return e
        except ValueError as e:
            return FetchError(f"malformed index document: {e}")

    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        fetched = list(pool.map(fetch, to_audit))
    results = [assess(i, d, allow) for i, d in zip(to_audit, fetched, strict=True)]

    print_table(results)
    for entry in stale_entries(allow, results):
        print(f"audit: warning: allowlist entry matches nothing installed: {entry}")
    counts = {
        s: sum(r.status == s for r in results) for s in (OK, ACCEPTED, UNAUDITED_OK, *FAILING)
    }
    summary = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
    print(f"audit: {len(results)} distributions in {time.monotonic() - started:.1f}s: {summary}")
    failing = [r for r in results if r.status in FAILING]
    if failing:
        print(
            f"audit: FAILED: {len(failing)} distribution(s) vulnerable or not verifiable: "
            + ", ".join(f"{r.name} {r.version} [{r.status}]" for r in failing)
            + f". Upgrade, or accept with a reasoned entry in {args.allowlist}."
        )
        return 1
    print("audit: no known vulnerability in any installed version")
    return 0


if __name__ == "__main__":
    sys.exit(main())
