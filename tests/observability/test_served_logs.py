"""What `chatbox serve` writes, read line by line from the process a user starts: chatbox's
format in both --log-format modes, --log-level obeyed, one access line per request (chatbox's,
by route template, no query string), and no content or secret anywhere (share tokens, search
words, messages, API keys)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.served import ADMIN_PASSWORD, Served

pytestmark = pytest.mark.timeout(900)  # a served start and its first turn: minutes on 2 busy cores

SEARCH_WORD = "quokkazanzibar"  # searched for in a query string
MESSAGE = "my private note about the okapi hideout"  # a user's message: content
TITLE = "Secret project heron"  # a conversation title: content
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) "
    r"\[trace (-|[0-9a-f]{32})\] (.*)$"
)
ACCESS = re.compile(r"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) (\d{3}) \d+\.\d ms$")


@dataclass
class Run:
    """One served process's log, and what the requests made against it sent and got."""

    lines: list[str]
    secrets: list[str] = field(default_factory=list)
    conversation_id: str = ""
    # (method, route template, status, the trace id the response carried)
    requests: list[tuple[str, str, int, str]] = field(default_factory=list)


def exercise(box: Served) -> Run:
    """A user's session: a conversation, its share link seen anonymously, a search, a
    completion and a page that does not exist."""
    key = box.user("ann", tier="paid")
    auth = box.auth(key)
    run = Run(lines=[], secrets=[key, ADMIN_PASSWORD, SEARCH_WORD, MESSAGE, TITLE])
    with httpx.Client(base_url=box.url, timeout=600) as http:

        def call(method: str, route: str, url: str, status: int, **kw: object) -> httpx.Response:
            r = http.request(method, url, **kw)  # type: ignore[arg-type]
            assert r.status_code == status, (url, r.status_code, r.text[:500])
            run.requests.append((method, route, status, r.headers["x-trace-id"]))
            return r

        conv = call(
            "POST",
            "/v1/conversations",
            "/v1/conversations",
            201,
            headers=auth,
            json={"title": TITLE},
        ).json()["id"]
        run.conversation_id = conv
        call(
            "POST",
            "/v1/conversations/{conv_id}/turns",
            f"/v1/conversations/{conv}/turns",
            200,
            headers=auth,
            json={"content": MESSAGE, "max_tokens": 4},
        )
        share = call(
            "POST",
            "/v1/conversations/{conv_id}/shares",
            f"/v1/conversations/{conv}/shares",
            201,
            headers=auth,
        ).json()
        token = share["token"]
        run.secrets.append(token)
        assert share["url"].endswith(f"/s/{token}")
        call("GET", "/s/{token}", f"/s/{token}", 200)  # anonymous, as a link is opened
        call(
            "GET",
            "/v1/search",
            "/v1/search",
            200,
            headers=auth,
            params={"q": SEARCH_WORD, "mode": "words"},
        )
        call("GET", "/v1/conversations/{conv_id}", f"/v1/conversations/{conv}", 200, headers=auth)
        call("GET", "<unmatched>", f"/no/such/{SEARCH_WORD}", 404)
        call(
            "POST",
            "/v1/chat/completions",
            "/v1/chat/completions",
            200,
            headers=auth,
            json={
                "model": "tiny",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": MESSAGE}],
            },
        )
    return run


def serve_and_read(tmp_path: Path, tiny_gguf: Path, *args: str) -> Run:
    box = Served(tmp_path, model=tiny_gguf, args=args)
    with box:
        run = exercise(box)
    run.lines = box.log().splitlines()
    assert run.lines, "the server wrote nothing"
    return run


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Run:
    return serve_and_read(tmp_path_factory.mktemp("json"), tiny_gguf, "--log-format", "json")


@pytest.fixture(scope="module")
def text_debug_run(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Run:
    return serve_and_read(tmp_path_factory.mktemp("text"), tiny_gguf, "--log-level", "debug")


def records_of(run: Run) -> list[dict[str, object]]:
    """Every line as its JSON object (fails on the first line that is not one)."""
    records = []
    for line in run.lines:
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(record, dict), line
        assert {"time", "level", "logger", "message"} <= set(record), line
        records.append(record)
    return records


def assert_one_access_line_per_request(run: Run, access: list[tuple[str, str | None]]) -> None:
    """`access`: (message, trace id) of every chatbox.access line, in order."""
    mine = [(m, t) for m, t in access if not m.startswith("GET /readyz ")]  # start-up polls
    got = []
    for message, trace_id in mine:
        parsed = ACCESS.match(message)
        assert parsed, f"not an access line: {message!r}"
        got.append((parsed[1], parsed[2], int(parsed[3]), trace_id))
    assert got == run.requests
    for message, _ in access:
        assert "?" not in message and run.conversation_id not in message, message


def assert_no_secret(run: Run) -> None:
    for line in run.lines:
        for secret in run.secrets:
            assert secret not in line, f"{secret!r} in the log: {line!r}"


def test_json_mode_writes_only_json_lines_with_one_access_line_per_request(
    json_run: Run,
) -> None:
    records = records_of(json_run)
    assert {r["level"] for r in records} <= {"info", "warning"}, "default level is info"
    assert not [r for r in records if str(r["logger"]).startswith("uvicorn.access")]
    access = [
        (str(r["message"]), str(r.get("trace_id")))
        for r in records
        if r["logger"] == "chatbox.access"
    ]
    assert_one_access_line_per_request(json_run, access)
    assert any(r["logger"] == "uvicorn.error" for r in records)  # the server's own, as JSON


def test_json_mode_log_holds_no_content_or_secret(json_run: Run) -> None:
    assert_no_secret(json_run)


def test_text_mode_writes_chatbox_format_with_debug_lines(text_debug_run: Run) -> None:
    parsed = []
    for line in text_debug_run.lines:
        match = TEXT_LINE.match(line)
        assert match, f"not chatbox's text format: {line!r}"
        parsed.append(match)
    assert any(m[1] == "DEBUG" and m[2].startswith("chatbox.") for m in parsed)  # --log-level
    access = [(m[4], m[3]) for m in parsed if m[2] == "chatbox.access"]
    assert_one_access_line_per_request(text_debug_run, access)


def test_debug_level_log_holds_no_content_or_secret(text_debug_run: Run) -> None:
    assert_no_secret(text_debug_run)


def test_warning_level_hides_info_lines(tmp_path: Path, tiny_gguf: Path) -> None:
    box = Served(tmp_path, model=tiny_gguf, args=("--log-level", "warning", "--log-format", "json"))
    with box:
        assert httpx.get(box.url + "/no/such/page").status_code == 404
    records = [json.loads(line) for line in box.log().splitlines()]
    assert all(r["level"] in ("warning", "error", "critical") for r in records), records


def test_first_start_admin_notice_is_a_log_line_in_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server creates the first admin (tests/served.py's CLI calls do it before serving, so
    this runs the same code in-process under the server's logging)."""
    import asyncio
    import logging
    from dataclasses import replace

    from chatbox.accounts import ensure_admin
    from chatbox.observability.logs import configure_logging
    from chatbox.store import Store
    from tests.conftest import test_settings

    root, chatbox_logger = logging.getLogger(), logging.getLogger("chatbox")
    saved = (root.handlers[:], root.level, chatbox_logger.level)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)  # restored afterwards
    settings = replace(test_settings(tmp_path / "data"), admin_password=None)

    async def first_start() -> None:
        settings.ensure_dirs()
        store = await Store.open(settings.database)
        try:
            await ensure_admin(store, settings)
        finally:
            await store.close()

    configure_logging("info", "json")
    try:
        asyncio.run(first_start())
    finally:
        root.handlers[:], _, _ = saved
        root.setLevel(saved[1])
        chatbox_logger.setLevel(saved[2])
        logging.captureWarnings(False)
    lines = capsys.readouterr().err.splitlines()
    records = [json.loads(line) for line in lines]  # fails on a line that is not JSON
    notice = [r for r in records if "admin account" in r["message"]]
    assert len(notice) == 1 and notice[0]["logger"] == "chatbox.accounts", lines
    password = (settings.data_dir / "admin-password.txt").read_text().strip()
    assert password not in "\n".join(lines)
