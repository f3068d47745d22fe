"""/docs works offline: the Swagger UI page loads only what this server serves (the
files of the installed swagger-ui-py package), and names no other host."""

from __future__ import annotations

import re

import httpx
from helios_serve.http.openapi import ASSETS


def test_docs_page_loads_only_local_assets(scripted):
    page = httpx.get(scripted.url + "/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assert not re.search(r"https?://", page.text)  # no CDN, no remote favicon
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(urls) == ["/docs-assets/swagger-ui-bundle.js",
                            "/docs-assets/swagger-ui-standalone-preset.js",
                            "/docs-assets/swagger-ui.css"]
    for url in urls:
        r = httpx.get(scripted.url + url)
        assert r.status_code == 200
        assert r.content == (ASSETS / url.rsplit("/", 1)[1]).read_bytes()
        assert r.headers["content-type"].startswith(
            "text/css" if url.endswith(".css") else "text/javascript")
    # (Swagger UI 5, which the package ships, reads the OpenAPI 3.1 document written here.)
    assert httpx.get(scripted.url + "/openapi.json").json()["openapi"].startswith("3.1")


def test_only_the_three_assets_are_served(scripted):
    for name in ("index.css", "LICENSE", "..%2Fcore.py", "swagger-editor.js"):
        r = httpx.get(scripted.url + "/docs-assets/" + name)
        assert r.status_code == 404, name
