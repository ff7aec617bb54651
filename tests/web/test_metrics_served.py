"""/metrics as a Prometheus server scrapes it from a served box: a Content-Type that a strict
MIME parser takes (Prometheus 3 refuses a parameter given twice) and a body the Prometheus
text parser reads."""

from __future__ import annotations

from email.message import Message
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.served import Served


def strict_params(content_type: str) -> tuple[str, dict[str, str]]:
    """The media type and its parameters; a parameter given twice is an error, as in Go's
    mime.ParseMediaType."""
    message = Message()
    message["content-type"] = content_type
    media, *params = message.get_params() or [("", "")]
    names = [name.lower() for name, _ in params]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    assert not duplicated, f"{content_type!r} repeats {duplicated}"
    return media[0].lower(), {name.lower(): value for name, value in params}


def test_the_strict_check_refuses_a_repeated_parameter() -> None:
    try:
        strict_params("text/plain; version=1.0.0; charset=utf-8; charset=utf-8")
    except AssertionError as exc:
        assert "charset" in str(exc)
    else:
        raise AssertionError("a repeated charset passed")


def test_a_scrape_gets_one_charset_and_a_body_prometheus_parses(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    with Served(tmp_path, model=tiny_gguf) as box:
        resp = httpx.get(box.url + "/metrics", headers=box.admin, timeout=60)
    assert resp.status_code == 200, resp.text
    media, params = strict_params(resp.headers["content-type"])
    assert media == "text/plain"
    assert params["charset"].lower() == "utf-8" and params["version"]
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    assert "chatbox_http_requests" in families, sorted(families)[:20]
