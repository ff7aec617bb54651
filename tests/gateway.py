"""A chatbox with two users on two tiers and two models, for the gateway's HTTP tests."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.chat import ChatService
from chatbox.engine.types import EngineStats
from tests.conftest import ADMIN_PASSWORD, bearer, seed_user, test_settings

POLICY = """
[tiers.free]
rpm = {free_rpm}
tpm = {free_tpm}
daily_tokens = {free_daily}
max_streams = 1
model = "tiny"
overload = "shed"

[tiers.paid]
rpm = 1000
tpm = 1000000
max_streams = 2
model = "big"
fallback = "tiny"
overload = "degrade"

[tiers.team]
model = "big"
overload = "queue"

[overload]
high_water = 2
degrade_factor = 2.0
retry_after_s = 7

[routing]
small = "tiny"
large = "big"
auto_long_chars = 300

[routing.pins]
carol = "tiny"
{extra}
"""


@dataclass
class Box:
    client: TestClient
    keys: dict[str, str]  # user name -> API key
    passwords: dict[str, str]

    def h(self, name: str, **extra: str) -> dict[str, str]:
        return {**bearer(self.keys[name]), **extra}

    @property
    def chat(self) -> ChatService:
        chat: ChatService = self.client.app.state.services.chat
        return chat

    def saturate(self, depth: dict[str, int] | int) -> None:
        """Pretend the engines hold `depth` requests, all waiting (per model or all)."""

        def stats(model: str) -> EngineStats:
            d = depth if isinstance(depth, int) else depth.get(model, 0)
            return EngineStats(queue_depth=d, running=0, slots_total=4)

        self.chat.gate.stats = stats

    def login(self, name: str) -> str:
        """Log in through the form; the client keeps the cookie. Returns the CSRF token."""
        page = self.client.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token, page.text
        response = self.client.post(
            "/login",
            data={
                "name": name,
                "password": self.passwords[name],
                "csrf_token": token.group(1),
                "next": "/",
            },
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text
        home = self.client.get("/")
        csrf = re.search(r'"x-csrf-token": "([^"]+)"', home.text)
        assert csrf, home.text
        return csrf.group(1)

    def new_conversation(self, name: str, **body: Any) -> str:
        response = self.client.post("/v1/conversations", json=body, headers=self.h(name))
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def complete(self, name: str, text: str = "Hi", **body: Any) -> Any:
        return self.client.post(
            "/v1/chat/completions",
            headers=self.h(name),
            json={"messages": [{"role": "user", "content": text}], "max_tokens": 8, **body},
        )


@contextmanager
def gateway_box(
    tmp_path: Path,
    tiny_gguf: Path,
    free_rpm: int = 1000,
    free_tpm: int = 1000000,
    free_daily: int = 0,
    extra: str = "",
    **settings: Any,
) -> Iterator[Box]:
    data_dir = tmp_path / "data"
    policy = tmp_path / "policy.toml"
    policy.write_text(
        POLICY.format(free_rpm=free_rpm, free_tpm=free_tpm, free_daily=free_daily, extra=extra)
    )
    config = test_settings(data_dir, policy_path=policy, **settings)
    registry = ModelRegistry(config.models_path)
    registry.add(tiny_gguf, name="tiny", make_default=True, copy=False)
    registry.add(tiny_gguf, name="big", copy=False)
    passwords = {
        "admin": ADMIN_PASSWORD,
        "ann": "ann-password",
        "bob": "bob-password",
        "carol": "carol-password",
    }
    keys = {"admin": seed_user(config)}
    for name, tier in (("ann", "free"), ("bob", "paid"), ("carol", "team")):
        keys[name] = seed_user(config, name, "member", tier, passwords[name])
    with TestClient(create_app(config, registry), timeout=60) as client:
        deadline = time.monotonic() + 60  # the tiers' default models load in the background
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.02)
        yield Box(client, keys, passwords)


def run(coro: Any) -> Any:
    return asyncio.run(coro)
