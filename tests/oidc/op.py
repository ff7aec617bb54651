"""A real OpenID Provider for tests (node's oidc-provider, tests/oidc/provider.mjs), and a
person signing in through it with a plain HTTP client, as a browser would.

    with OpenIDProvider(tmp_path, redirect_uri=box.url + "/auth/callback") as op:
        op.person("ann", groups=["staff"])
        client = httpx.Client(); signed = sign_in(client, box.url, "ann")
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from html import unescape
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest

from tests.served import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = Path(__file__).resolve().parent / "provider.mjs"
CLIENT_ID = "chatbox"
CLIENT_SECRET = "chatbox-test-client-secret"


class OpenIDProvider:
    """The node provider on a free port; people's claims in a JSON file it reads per request."""

    def __init__(self, where: Path, redirect_uri: str, id_token_ttl_s: int = 3600) -> None:
        if shutil.which("node") is None or not (ROOT / "node_modules" / "oidc-provider").exists():
            pytest.skip("node and oidc-provider (npm install) are needed")
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.accounts = where / "op-accounts.json"
        self.accounts.write_text("{}")
        self.log_path = where / "op.log"
        self.env = {
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "OIDC_PORT": str(self.port),
            "OIDC_REDIRECT_URI": redirect_uri,
            "OIDC_ACCOUNTS": str(self.accounts),
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_ID_TOKEN_TTL": str(id_token_ttl_s),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def chatbox_env(self, name: str = "Test ID") -> dict[str, str]:
        """The settings that point chatbox at this provider."""
        return {
            "CHATBOX_OIDC_ISSUER": self.issuer,
            "CHATBOX_OIDC_CLIENT_ID": CLIENT_ID,
            "CHATBOX_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "CHATBOX_OIDC_PROVIDER_NAME": name,
        }

    def person(self, login: str, **claims: object) -> None:
        """Set what the provider says of `login` from the next request on (groups, email…)."""
        people = json.loads(self.accounts.read_text())
        people[login] = claims
        self.accounts.write_text(json.dumps(people))

    def __enter__(self) -> OpenIDProvider:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            ["node", str(SCRIPT)], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if "ready " in self.log_path.read_text(errors="replace"):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.__exit__(None, None, None)
        raise AssertionError(f"the provider did not start:\n{self.log_path.read_text()}")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _form(page: httpx.Response) -> str:
    found = re.search(r'<form[^>]*action="([^"]+)"', page.text)
    assert found, page.text[:2000]
    return urljoin(str(page.url), unescape(found.group(1)))


def to_callback(client: httpx.Client, box_url: str, login: str, next_path: str = "/") -> str:
    """Start a sign-in at chatbox and log in at the provider as `login`; the callback URL
    the provider sends the browser back to (not yet followed)."""
    location = str(
        client.get(f"{box_url}/login/oidc", params={"next": next_path}).headers["location"]
    )
    for _ in range(10):
        if location.startswith(box_url):
            return location
        page = client.get(location)
        if page.status_code in (302, 303):
            location = urljoin(str(page.url), page.headers["location"])
            continue
        assert page.status_code == 200, page.text[:2000]
        done = client.post(_form(page), data={"prompt": "login", "login": login, "password": "pw"})
        assert done.status_code in (302, 303), done.text[:2000]
        location = urljoin(str(done.url), done.headers["location"])
    raise AssertionError(f"never sent back to chatbox: {location}")


def sign_in(client: httpx.Client, box_url: str, login: str, next_path: str = "/") -> httpx.Response:
    """The whole sign-in: chatbox's answer to the callback (303 to `next` when it worked)."""
    return client.get(to_callback(client, box_url, login, next_path))


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
