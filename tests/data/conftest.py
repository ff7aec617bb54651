"""Data-handling fixtures: the app with two users and the real embedding model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.knowledge.embedder import Embedder
from chatbox.services.server import Services
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.sse import parse_sse


@dataclass
class App:
    client: TestClient
    admin: dict[str, str]  # headers
    bob: dict[str, str]
    settings: Settings

    @property
    def services(self) -> Services:
        services: Services = self.client.app.state.services
        return services

    def call(self, fn, *args):  # type: ignore[no-untyped-def]
        """Run an async function of the app on its event loop."""
        return self.client.blocking_portal.call(fn, *args)

    def say(self, conv_id: str, text: str, headers: dict[str, str]) -> list[str]:
        """Send a message; the SSE event kinds that came back."""
        r = self.client.post(
            f"/v1/conversations/{conv_id}/turns", json={"content": text}, headers=headers
        )
        assert r.status_code == 200, r.text
        return [e.event for e in parse_sse(iter(r.text.split("\n")))]


def files_holding(data_dir: Path, needle: bytes) -> list[str]:
    """Every file under the data directory (the database, its -wal and -shm included)
    whose bytes contain `needle`, in any case."""
    found = []
    for path in sorted(data_dir.rglob("*")):
        if path.is_file() and path.suffix != ".gguf":
            raw = path.read_bytes().lower()
            if needle.lower() in raw:
                found.append(path.name)
    return found


def holding(app: App, needle: str) -> list[str]:
    """Files under the data directory holding `needle` (any case), and on PostgreSQL the
    tables with a live row whose text (every column, tsvector lexemes included) holds it."""
    found = files_holding(app.settings.data_dir, needle.encode())
    db = app.services.store.db
    if db.dialect == "postgresql":
        for table in app.call(db.tables):
            sql = f"SELECT count(*) FROM {table} AS t WHERE t::text ILIKE ?"
            if app.call(db.fetchone, sql, (f"%{needle}%",))[0]:
                found.append(table)
    return found


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    """The real all-MiniLM-L6-v2 (no network), loaded once per session."""
    emb = Embedder()
    asyncio.run(emb.load())
    yield emb
    emb.close()


@pytest.fixture
def app(
    settings: Settings, registry: ModelRegistry, embedder: Embedder, database: Path | str
) -> Iterator[App]:
    """The app on SQLite, then on PostgreSQL (the `database` fixture's two stores)."""
    url = database if isinstance(database, str) else None
    settings = settings.with_overrides(memory_idle_s=3600.0, database_url=url)
    admin = bearer(seed_user(settings))
    bob = bearer(seed_user(settings, "bob", role="member", tier="free", password="bob-pw-123456"))
    with TestClient(create_app(settings, registry), timeout=120) as client:
        yield App(client, admin, bob, settings)
