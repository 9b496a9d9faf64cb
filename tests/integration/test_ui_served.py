"""A real node serves the dashboard: the page and its files without a token, with the security
headers, ``/`` redirecting to it, and the API behind it still asking for a token."""

from __future__ import annotations

import aiohttp

from schedd.ui import CSP
from tests.conftest import Node


async def test_a_node_serves_the_dashboard_and_still_guards_the_api(
    node: Node, http: aiohttp.ClientSession
) -> None:
    async with http.get(node.url + "/", allow_redirects=False) as r:
        assert r.status == 302
        assert r.headers["Location"] == "/ui/"
    async with http.get(node.url + "/") as r:  # followed: the page, no token needed
        assert r.status == 200
        assert str(r.url).endswith("/ui/")
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert r.headers["Content-Security-Policy"] == CSP
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Referrer-Policy"] == "no-referrer"
        assert '<script type="module" src="/ui/static/app.js">' in await r.text()
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        async with http.get(f"{node.url}/ui/static/{name}") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].split(";")[0] == kind
            assert r.headers["Content-Security-Policy"] == CSP
    async with http.get(node.url + "/api/v1/jobs") as r:
        assert r.status == 401
    async with http.get(node.url + "/api/v1/jobs", headers=node.headers()) as r:
        assert r.status == 200
        assert "Content-Security-Policy" not in r.headers
    async with http.get(node.url + "/nothing-here", headers=node.headers()) as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "not_found"


def test_the_page_may_connect_to_the_clusters_other_nodes_only() -> None:
    from schedd.ui import CSP, page_csp

    assert page_csp([]) == CSP
    csp = page_csp(["http://10.0.0.2:7700/", "https://n3.example:7700", "javascript:alert(1)", "x"])
    assert csp.endswith("; connect-src 'self' http://10.0.0.2:7700 https://n3.example:7700")
    assert "javascript" not in csp and csp.startswith(CSP)
