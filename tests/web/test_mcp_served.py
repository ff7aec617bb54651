"""MCP servers as an admin manages them: `chatbox tools add | list | remove` (the console
script) beside a running `chatbox serve`, and the console's Tools page of that process; a real
MCP server (tests/chat/mcp_server.py) is started by both. Secrets are never shown back."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest

from tests.chat.test_mcp import serve_http
from tests.served import ADMIN_PASSWORD, CHATBOX, Served

SERVER = Path(__file__).parent.parent / "chat" / "mcp_server.py"
COMMAND = f"{sys.executable} {SERVER}"
SECRET = "hush-env-value-1"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("mcp"), model=tiny_gguf) as served:
        yield served


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The test server over streamable HTTP."""
    with serve_http() as url:
        yield url


def login(box: Served, name: str, password: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=box.url, timeout=60)
    page = client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token, page.text
    r = client.post(
        "/login",
        data={"name": name, "password": password, "csrf_token": token.group(1), "next": "/"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    csrf = re.search(r'"x-csrf-token": "([^"]+)"', client.get("/").text)
    assert csrf
    return client, csrf.group(1)


def post(client: httpx.Client, path: str, csrf: str, /, **form: str) -> httpx.Response:
    return client.post(path, data=form, headers={"x-csrf-token": csrf, "HX-Request": "true"})


def row(page: str, name: str) -> str:
    found = re.search(rf'<tr data-server="{name}">(.*?)</tr>', page, re.S)
    assert found, page
    return found.group(1)


def test_the_cli_adds_lists_and_removes_servers_and_refuses_bad_ones(box: Served) -> None:
    added = box.cli("tools", "add", "calc", "--command", COMMAND, "--env", f"TEST_TOKEN={SECRET}")
    assert "added MCP server calc (stdio)" in added
    assert "tools: add, echo, sleep, crash, fail, pid" in added  # it was started once to list them

    table = box.cli("tools", "list", "--check")
    assert "calc" in table and "env TEST_TOKEN" in table and "connected" in table
    assert SECRET not in table and SECRET not in box.cli("tools", "list", "--json")

    bad = subprocess.run(
        [CHATBOX, "--data-dir", str(box.data_dir), "tools", "add", "x", "--url", "ftp://h/"],
        env=box.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "http:// or https://" in bad.stderr
    assert "removed MCP server calc" in box.cli("tools", "remove", "calc")
    assert "no MCP servers" in box.cli("tools", "list")
    audit = box.cli("audit", "list")
    assert "mcp.add" in audit and "mcp.remove" in audit


def test_the_console_lists_adds_checks_and_removes_servers(box: Served, http_server: str) -> None:
    box.cli("tools", "add", "fromcli", "--command", COMMAND, "--env", f"TEST_TOKEN={SECRET}")
    admin, csrf = login(box, "admin", ADMIN_PASSWORD)
    page = admin.get("/console/tools")
    assert page.status_code == 200
    listed = row(page.text, "fromcli")  # added by the CLI under the running server
    assert "TEST_TOKEN" in listed and SECRET not in page.text

    r = post(
        admin,
        "/console/tools",
        csrf,
        name="paidcalc",
        url=http_server,
        tiers="paid",
        headers="Authorization: Bearer hush-header-value",
    )
    assert r.status_code == 200, r.text
    assert "Added paidcalc: add, echo, sleep, crash, fail, pid." in r.text
    added = row(r.text, "paidcalc")
    assert "connected" in added and "paid" in added and "Authorization" in added
    assert "hush-header-value" not in r.text

    # A command runs as the server's own OS user: only the operator's CLI adds one.
    r = post(admin, "/console/tools", csrf, name="shell", command="sh -c id")
    assert r.status_code == 422 and "chatbox tools add" in r.text

    r = post(admin, "/console/tools/fromcli/check", csrf)
    assert "connected" in row(r.text, "fromcli") and "<code" in row(r.text, "fromcli")

    r = post(admin, "/console/tools", csrf, name="Bad Name", url=http_server)
    assert r.status_code == 422 and "name is 1-32" in r.text
    r = post(admin, "/console/tools", csrf, name="nowhere", url=http_server, tiers="gold")
    assert r.status_code == 422 and "gold" in r.text
    assert post(admin, "/console/tools/ghost/remove", csrf).status_code == 404

    r = post(admin, "/console/tools/paidcalc/remove", csrf)
    assert r.status_code == 200 and 'data-server="paidcalc"' not in r.text
    box.cli("tools", "remove", "fromcli")
    assert 'data-server="fromcli"' not in admin.get("/console/tools").text

    box.user("mia")
    member, member_csrf = login(box, "mia", "mia" * 2)
    assert member.get("/console/tools", follow_redirects=False).status_code in (303, 403)
    r = post(member, "/console/tools", member_csrf, name="evil", url=http_server)
    assert r.status_code == 403
    assert "evil" not in box.cli("tools", "list")


@contextlib.contextmanager
def json_endpoint(body: dict[str, object]) -> Iterator[str]:
    """An HTTP endpoint that answers every request with `body` as JSON (not MCP)."""
    data = json.dumps(body).encode()

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/mcp"
    finally:
        server.shutdown()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_url_secrets_and_a_foreign_answer_never_reach_the_log_or_the_page(
    tmp_path: Path, tiny_gguf: Path, http_server: str, log_format: str
) -> None:
    """A server's URL may carry a password and a ?token=: the HTTP library's own request
    lines and every other line show neither; a URL that answers JSON that is not MCP is
    said to be so, without its body, on the page, in the CLI and in the log."""
    password, token, body_secret = "pw-in-url-7731", "tok-in-query-5519", "body-secret-2284"
    url = http_server.replace("http://", f"http://bob:{password}@") + f"?token={token}"
    with (
        json_endpoint({"detail": f"no MCP here {body_secret}"}) as foreign,
        Served(tmp_path, model=tiny_gguf, args=("--log-format", log_format)) as box,
    ):
        admin, csrf = login(box, "admin", ADMIN_PASSWORD)
        r = post(admin, "/console/tools", csrf, name="secretive", url=url)
        assert r.status_code == 200, r.text
        assert "connected" in row(r.text, "secretive")  # the secrets reached the server
        r = post(admin, "/console/tools/secretive/check", csrf)
        assert "connected" in row(r.text, "secretive")

        r = post(admin, "/console/tools", csrf, name="notmcp", url=foreign)
        assert "not an MCP message" in row(r.text, "notmcp")
        cli = subprocess.run(
            [CHATBOX, "--data-dir", str(box.data_dir), "tools", "add", "notmcp2", "--url", foreign],
            env=box.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "not an MCP message" in cli.stdout, cli.stdout + cli.stderr
        shown = r.text + admin.get("/console/tools").text + box.cli("tools", "list", "--json")
        shown += cli.stdout + cli.stderr
        box.stop()
        log = box.log()
    assert "HTTP Request: POST http://***@127.0.0.1" in log  # the library's line, cleaned
    for secret in (password, token, body_secret):
        assert secret not in log, secret
        assert secret not in shown, secret
