"""Security headers on every response, a UI that a strict CSP allows, and /metrics for admins."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway import Box, gateway_box

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "metrics-token-for-tests"


@pytest.fixture
def box(tmp_path: Path, tiny_gguf: Path) -> Iterator[Box]:
    with gateway_box(tmp_path, tiny_gguf, metrics_token=TOKEN) as b:
        yield b


def test_every_response_carries_the_security_headers(box: Box) -> None:
    c = box.client
    responses = [
        c.get("/login"),
        c.get("/healthz"),
        c.get("/static/app.js"),
        c.get("/nowhere"),
        c.get("/v1/conversations"),
        c.get("/", follow_redirects=False),
        c.post("/login", data={"csrf_token": "x"}),
        c.get("/", headers=box.h("ann")),
        c.get("/v1/models", headers=box.h("ann")),
    ]
    for r in responses:
        h = r.headers
        assert h["x-frame-options"] == "DENY", (r.url, r.status_code)
        assert h["x-content-type-options"] == "nosniff", r.url
        assert h["referrer-policy"] in ("same-origin", "no-referrer"), r.url
        csp = {d.split()[0]: d.split()[1:] for d in h["content-security-policy"].split("; ")}
        assert csp["default-src"] == ["'self'"], r.url
        assert csp["script-src"] == ["'self'"] and csp["style-src"] == ["'self'"]
        assert csp["frame-ancestors"] == ["'none'"] and csp["object-src"] == ["'none'"]
        assert csp["base-uri"] == ["'self'"] and csp["form-action"] == ["'self'"]
        assert "unsafe" not in h["content-security-policy"]


def test_templates_need_no_inline_script_or_style() -> None:
    """What a strict CSP refuses: inline scripts, on* handlers, style attributes, htmx eval."""
    refused = re.compile(
        r"<script(?![^>]*\bsrc=)|<style|\son[a-z]+\s*=|\sstyle\s*=|hx-on|"
        r"javascript:|js:|hx-vars",
        re.IGNORECASE,
    )
    for template in sorted((ROOT / "templates").glob("*.html")):
        found = refused.search(template.read_text())
        assert found is None, f"{template.name}: {found.group(0) if found else ''}"
    config = (ROOT / "templates" / "base.html").read_text()
    for setting in ('"includeIndicatorStyles":false', '"allowEval":false'):
        assert setting in config


def test_metrics_need_an_admin_or_the_metrics_token(box: Box) -> None:
    c = box.client
    assert c.get("/metrics").status_code == 401
    assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/metrics", headers=box.h("ann")).status_code == 403
    for headers in (box.h("admin"), {"Authorization": f"Bearer {TOKEN}"}):
        r = c.get("/metrics", headers=headers)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "# TYPE" in r.text
    box.login("admin")
    assert c.get("/metrics").status_code == 200  # an admin's browser session
