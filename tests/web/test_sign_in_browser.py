"""Signing in through the identity provider in headless Chromium: chatbox's login page, the
provider's own login form (node's oidc-provider), and back into the chat as a new account.

Run: pytest -m browser tests/web/test_sign_in_browser.py
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.oidc.op import OpenIDProvider
from tests.served import Served
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS
from tests.web.test_sign_in_served import policy_with_rules

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.skip("no chromium to drive")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_a_person_signs_in_through_the_providers_login_form(
    tmp_path: Path, tiny_gguf: Path, browser: Any
) -> None:
    box = Served(tmp_path, model=tiny_gguf, policy=policy_with_rules(tmp_path))
    with OpenIDProvider(tmp_path, box.url + "/auth/callback") as op:
        op.person("hana", groups=["staff"], email="hana@example.com", name="Hana")
        box.env.update(op.chatbox_env("Example ID"))
        with box:
            context = browser.new_context()
            try:
                page = context.new_page()
                page.goto(box.url + "/library")
                assert "/login" in page.url
                page.get_by_role("link", name="Sign in with Example ID").click()
                page.wait_for_url(op.issuer + "/**")
                page.fill("input[name=login]", "hana")
                page.fill("input[name=password]", "any password")
                page.locator("button[type=submit]").click()
                page.wait_for_url(box.url + "/library", timeout=30_000)
                assert page.locator("body").inner_text()  # the library page, signed in
                cookies = {c["name"] for c in context.cookies(box.url)}
                assert "chatbox_session" in cookies
            finally:
                context.close()
            users = json.loads(box.cli("users", "list", "--json"))
            hana = next(u for u in users if u["name"] == "hana")
            assert (hana["role"], hana["tier"]) == ("member", "free")
