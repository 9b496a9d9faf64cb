"""The dashboard's files (``schedd/ui``): served with the right types and the security headers,
the page reachable without a token, no inline script or style, no markup built from data, and
every API path its JavaScript calls declared in the OpenAPI document."""

from __future__ import annotations

import re
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schedd.api.openapi import spec
from schedd.ui import CSP, TYPES, load_assets, mount

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "schedd" / "ui" / "static"
SOURCES = sorted(STATIC.rglob("*.js"))


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async def api(request: web.Request) -> web.Response:
        return web.json_response({"api": True}, status=401)

    app = web.Application()
    mount(app)
    app.router.add_get("/api/v1/jobs", api)
    async with TestClient(TestServer(app)) as c:
        yield c


def assert_secure(headers: object) -> None:
    assert isinstance(headers, dict) or hasattr(headers, "get")
    get = headers.get  # type: ignore[attr-defined]
    assert get("Content-Security-Policy") == CSP
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ):
        assert directive in CSP
    assert "unsafe" not in CSP
    assert get("X-Content-Type-Options") == "nosniff"
    assert get("Referrer-Policy") == "no-referrer"


def test_every_shipped_file_is_loaded_with_its_type() -> None:
    assets = load_assets()
    on_disk = {p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.is_file()}
    assert set(assets) == on_disk, "a file of schedd/ui/static has a type the server does not serve"
    assert {"index.html", "app.js", "app.css", "fmt.js", "screens/jobs.js"} <= set(assets)
    assert assets["app.js"].content_type == "text/javascript; charset=utf-8"
    assert assets["app.css"].content_type == "text/css; charset=utf-8"


async def test_each_file_is_served_with_its_type_and_the_security_headers(
    client: TestClient[web.Request, web.Application],
) -> None:
    for name, asset in load_assets().items():
        r = await client.get(f"/ui/static/{name}")
        assert r.status == 200, name
        assert r.headers["Content-Type"] == asset.content_type
        assert (
            r.headers["Content-Type"].split(";")[0]
            == TYPES["." + name.rpartition(".")[2]].split(";")[0]
        )
        assert await r.read() == asset.body
        assert_secure(r.headers)
        again = await client.get(f"/ui/static/{name}", headers={"If-None-Match": r.headers["ETag"]})
        assert again.status == 304
        assert_secure(again.headers)


async def test_the_page_answers_every_screen_address_without_a_token(
    client: TestClient[web.Request, web.Application],
) -> None:
    page = (STATIC / "index.html").read_bytes()
    for path in ("/ui/", "/ui/jobs", "/ui/jobs/01ABC", "/ui/runs/01ABC@17", "/ui/dlq?task=x"):
        r = await client.get(path)
        assert r.status == 200, path
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert await r.read() == page
        assert_secure(r.headers)


async def test_root_and_ui_redirect_to_the_dashboard(
    client: TestClient[web.Request, web.Application],
) -> None:
    for path in ("/", "/ui"):
        r = await client.get(path, allow_redirects=False)
        assert r.status == 302
        assert r.headers["Location"] == "/ui/"
        assert_secure(r.headers)


async def test_unknown_files_and_other_methods_are_refused_with_the_headers(
    client: TestClient[web.Request, web.Application],
) -> None:
    for path in ("/ui/static/nope.js", "/ui/static/screens", "/ui/static/app.py"):
        r = await client.get(path)
        assert r.status == 404, path
        assert_secure(r.headers)
    r = await client.get("/ui/static/../__init__.py")  # the page, never the module
    assert r.headers["Content-Type"].startswith("text/html")
    r = await client.post("/ui/jobs", data=b"x")
    assert r.status == 405
    assert r.headers["Allow"] == "GET, HEAD"
    assert_secure(r.headers)
    r = await client.head("/ui/static/app.js")
    assert r.status == 200


async def test_other_paths_go_to_the_api(client: TestClient[web.Request, web.Application]) -> None:
    r = await client.get("/api/v1/jobs")
    assert r.status == 401
    assert await r.json() == {"api": True}
    assert "Content-Security-Policy" not in r.headers


# -- what the files may contain ---------------------------------------------------------------


def test_the_page_has_no_inline_script_or_style() -> None:
    for path in STATIC.rglob("*.html"):
        text = path.read_text()
        for script in re.findall(r"<script\b[^>]*>", text, re.IGNORECASE):
            assert re.search(r"\bsrc=", script), f"{path.name}: inline script {script}"
        assert not re.search(r"<style\b", text, re.IGNORECASE), f"{path.name}: a <style> element"
        assert not re.search(r"\sstyle\s*=", text, re.IGNORECASE), f"{path.name}: a style attribute"
        assert not re.search(r"\son\w+\s*=", text, re.IGNORECASE), f"{path.name}: an on… handler"
        assert not re.search(r"javascript:", text, re.IGNORECASE)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(STATIC).as_posix())
def test_scripts_never_build_markup_from_text(path: Path) -> None:
    """Data goes into the page as text nodes only: no innerHTML and friends, no eval, no
    inline style (the policy refuses it anyway), no third-party code."""
    text = path.read_text()
    for banned in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        'setAttribute("style"',
        ".cssText",
        "http://",
        "https://",
    ):
        allowed = banned == "http://" and "http://www.w3.org/2000/svg" in text
        if banned in text and not allowed:
            raise AssertionError(f"{path.name} uses {banned}")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(STATIC).as_posix())
def test_every_module_import_names_a_shipped_file(path: Path) -> None:
    for spec_ in re.findall(r"^import .*? from \"([^\"]+)\";", path.read_text(), re.MULTILINE):
        target = (path.parent / spec_).resolve()
        assert spec_.startswith("."), f"{path.name}: {spec_} is not one of the dashboard's files"
        assert target.is_file(), f"{path.name} imports {spec_}, which does not exist"


# -- the API the scripts call ------------------------------------------------------------------

#: a path as the scripts write it: "/api/v1/jobs", `${API}/jobs/${enc(id)}/runs`
_CALLED = re.compile(r"(?:\$\{API\}|/api/v1)(/[^`\"' ]*)")


def called_paths() -> dict[str, set[str]]:
    """Each API path the scripts name (path parameters as ``{}``), with the files naming it."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for raw in _CALLED.findall(path.read_text()):
            normal = re.sub(r"\$\{[^}]*\}|\{[a-z_]+\}", "{}", raw).rstrip("/")
            normal = normal.rstrip(".")
            found.setdefault("/api/v1" + normal, set()).add(path.name)
    return found


def optional_paths() -> set[str]:
    """The endpoints api.js uses only when the node's API document has them."""
    text = (STATIC / "api.js").read_text()
    block = text.split("export const OPTIONAL = {", 1)[1].split("};", 1)[0]
    return {
        "/api/v1" + re.sub(r"\{[a-z_]+\}", "{}", p) for p in re.findall(r"\$\{API\}([^`]+)`", block)
    }


def test_every_api_path_the_scripts_call_is_in_the_openapi_document() -> None:
    documented = {re.sub(r"\{[a-z_]+\}", "{}", p) for p in spec()["paths"]}
    called = called_paths()
    assert {"/api/v1/jobs", "/api/v1/cluster", "/api/v1/jobs/{}/runs", "/api/v1/dlq"} <= set(called)
    optional = optional_paths()
    missing = {p: sorted(files) for p, files in called.items() if p not in documented}
    unexplained = {p: files for p, files in missing.items() if p not in optional}
    assert not unexplained, f"the scripts call paths the API does not have: {unexplained}"
    # an optional endpoint is named in api.js's table only, and used through it (has())
    for p in missing:
        assert called[p] == {"api.js"}, f"{p} is not in the API yet: use it through api.js has()"


def test_the_wheel_ships_every_file() -> None:
    """setuptools' package data covers every file under schedd/ui/static (else the installed
    daemon serves a page without its scripts)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package = ROOT / "schedd" / "ui"
    patterns = config["tool"]["setuptools"]["package-data"]["schedd.ui"]
    shipped = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    missing = {p.relative_to(package).as_posix() for p in STATIC.rglob("*") if p.is_file()}
    missing -= {p.relative_to(package).as_posix() for p in shipped}
    assert not missing, f"not package data: {sorted(missing)}"
