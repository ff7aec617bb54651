"""Caps on the work one request can ask for: streamed uploads with a hard cap, the lengths of
titles, system prompts, stop sequences, embedding inputs and memory facts, and a huge prompt
refused without stalling the event loop."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.engine.engine import LlamaEngine
from chatbox.settings import Settings
from tests.conftest import LiveServer, bearer, seed_user, test_settings

MiB = 1024 * 1024


@pytest.fixture
def capped(data_dir: Path) -> Settings:
    """Small caps, so each test's payloads stay small."""
    return test_settings(
        data_dir,
        max_title_chars=50,
        max_system_prompt_chars=300,
        max_stop_strings=2,
        max_stop_chars=8,
        max_embedding_input_chars=100,
        max_embedding_total_chars=150,
        max_memory_add=3,
        max_fact_chars=40,
        max_upload_bytes=64 * 1024,
    )


@pytest.fixture
def client(capped: Settings, registry: ModelRegistry) -> Iterator[TestClient]:
    key = seed_user(capped)
    with TestClient(create_app(capped, registry), timeout=60) as c:
        c.headers.update(bearer(key))
        yield c


def _error(r: httpx.Response, status: int, words: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"], error
    return error


# -- item 1: uploads stream with a hard cap ----------------------------------------------


def _chunked_upload(port: int, path: str, headers: dict[str, str], total: int) -> tuple[int, int]:
    """POST a multipart upload of `total` bytes with Transfer-Encoding: chunked (no
    Content-Length), stopping as soon as the server answers. Returns (status, bytes sent)."""
    boundary = "limitboundary"
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Transfer-Encoding: chunked",
        f"Content-Type: multipart/form-data; boundary={boundary}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="a.txt"\r\nContent-Type: text/plain\r\n\r\n'
        ).encode()
        piece = b"word " * (64 * 1024 // 5)
        sent, answer = 0, b""
        for body in (head, *([piece] * (total // len(piece)))):
            if select.select([sock], [], [], 0)[0]:  # the server has answered: stop
                break
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(body), body))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(body)
        else:
            tail = f"\r\n--{boundary}--\r\n".encode()
            sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        while b"\r\n" not in answer:
            more = sock.recv(4096)
            if not more:
                break
            answer += more
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
        return status, sent
    finally:
        sock.close()


def test_chunked_uploads_are_refused_while_reading(data_dir: Path, registry: ModelRegistry) -> None:
    """200 MiB chunked to every upload route: 413 after reading about the limit, not all."""
    settings = test_settings(data_dir, max_upload_bytes=256 * 1024)
    with LiveServer(settings, registry) as live:
        conv = httpx.post(
            f"{live.url}/v1/conversations", json={}, headers=live.headers, timeout=30
        ).json()
        for path in (
            "/v1/documents",
            f"/v1/conversations/{conv['id']}/documents",
            f"/ui/c/{conv['id']}/documents",
            "/ui/new/documents",
            "/ui/library/documents",
        ):
            status, sent = _chunked_upload(live.port, path, live.headers, 200 * MiB)
            assert status == 413, path
            # The server stopped reading near the cap; the rest is what the sockets' buffers
            # took in before the answer came back.
            assert sent < 40 * MiB, (path, sent)
        docs = httpx.get(f"{live.url}/v1/documents", headers=live.headers, timeout=30).json()
        assert docs["data"] == []
        convs = httpx.get(f"{live.url}/v1/conversations", headers=live.headers, timeout=30).json()
        assert [c["id"] for c in convs["data"]] == [conv["id"]]  # /ui/new left none behind


def test_a_declared_oversized_upload_is_refused_before_reading(client: TestClient) -> None:
    big = b"x" * (256 * 1024)  # the cap is 64 KiB (+ 64 KiB for the form)
    r = client.post("/ui/new/documents", files={"file": ("a.txt", big, "text/plain")})
    assert r.status_code == 413
    assert client.get("/v1/conversations").json()["data"] == []


def test_upload_without_a_file_part(client: TestClient) -> None:
    r = client.post("/v1/documents", content=b"hello", headers={"Content-Type": "text/plain"})
    _error(r, 422, "multipart/form-data")
    r = client.post("/v1/documents", data={"conversation_id": "x"}, files={"other": ("", b"")})
    _error(r, 422, "multipart/form-data")


# -- item 5: titles, system prompts, stops, embeddings, memory ---------------------------


def test_title_and_system_prompt_caps(client: TestClient) -> None:
    e = _error(
        client.post("/v1/conversations", json={"title": "t" * 51}),
        422,
        "title is 51 characters; the limit is 50",
    )
    assert e["param"] == "title"
    e = _error(
        client.post("/v1/conversations", json={"system_prompt": "s" * 301}),
        422,
        "system_prompt is 301 characters; the limit is 300",
    )
    assert e["param"] == "system_prompt"
    conv = client.post(
        "/v1/conversations", json={"title": "t" * 50, "system_prompt": "s" * 300}
    ).json()
    _error(
        client.patch(f"/v1/conversations/{conv['id']}", json={"title": "t" * 51}),
        422,
        "the limit is 50",
    )
    _error(
        client.patch(f"/v1/conversations/{conv['id']}", json={"system_prompt": "s" * 20_001}),
        422,
        "system_prompt is 20,001 characters; the limit is 300",
    )
    # The UI: the settings form and a new chat's system prompt.
    r = client.post(f"/ui/c/{conv['id']}/settings", data={"system_prompt": "s" * 301})
    assert r.status_code == 422 and "the limit is 300" in r.text
    r = client.post("/ui/new/send", data={"content": "hi", "system_prompt": "s" * 301})
    assert r.status_code == 422
    stored = client.get(f"/v1/conversations/{conv['id']}").json()
    assert stored["system_prompt"] == "s" * 300 and stored["title"] == "t" * 50
    assert len(client.get("/v1/conversations").json()["data"]) == 1


def test_stop_sequence_caps(client: TestClient) -> None:
    conv = client.post("/v1/conversations", json={}).json()
    turns = f"/v1/conversations/{conv['id']}/turns"
    e = _error(
        client.post(turns, json={"content": "hi", "stop": ["a", "b", "c"]}),
        422,
        "stop has 3 sequences; the limit is 2",
    )
    assert e["param"] == "stop"
    _error(
        client.post(turns, json={"content": "hi", "stop": ["123456789"]}),
        422,
        "stop[0] is 9 characters; the limit is 8",
    )
    assert client.get(f"/v1/conversations/{conv['id']}").json()["turns"] == []
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    e = _error(
        client.post("/v1/chat/completions", json={**chat, "stop": ["a", "b", "c"]}),
        400,
        "the limit is 2",
    )
    assert e == {
        "message": e["message"],
        "type": "invalid_request_error",
        "param": "stop",
        "code": None,
    }
    _error(
        client.post("/v1/chat/completions", json={**chat, "stop": "x" * 65}),
        400,
        "stop[0] is 65 characters; the limit is 8",
    )
    ok = client.post("/v1/chat/completions", json={**chat, "stop": ["12345678", "b"]})
    assert ok.status_code == 200, ok.text


def test_embedding_input_caps(client: TestClient) -> None:
    e = _error(
        client.post("/v1/embeddings", json={"input": "x" * 101}),
        400,
        "input[0] is 101 characters; the limit is 100",
    )
    assert e["param"] == "input"
    _error(
        client.post("/v1/embeddings", json={"input": ["x" * 100, "y" * 51]}),
        400,
        "input is 151 characters in all; the limit is 150",
    )


def test_memory_add_caps(client: TestClient) -> None:
    e = _error(
        client.patch("/v1/users/me/memory", json={"add": ["a fact"] * 4}),
        422,
        "add has 4 facts; the limit is 3",
    )
    assert e["param"] == "add"
    _error(
        client.patch("/v1/users/me/memory", json={"add": ["ok fact", "f" * 41]}),
        422,
        "add[1] is 41 characters; the limit is 40",
    )
    assert client.get("/v1/users/me/memory").json()["data"] == []


def test_default_limits() -> None:
    s = Settings()
    assert (s.max_title_chars, s.max_system_prompt_chars) == (500, 20_000)
    assert (s.max_stop_strings, s.max_stop_chars) == (4, 64)
    assert s.max_pdf_pages > 0 and s.max_documents_per_user > 0
    assert s.max_document_bytes_per_user >= s.max_upload_bytes


# -- a huge prompt is tokenized off the event loop ---------------------------------------


def test_huge_prompt_is_refused_without_stalling_others(
    data_dir: Path, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """150k characters to a 1024-token model: 413, and the server answers others meanwhile.

    Tokenizing is made slow (as it is for a real vocabulary and a long prompt); the other
    request must be served before that tokenizing ends, which it cannot be if the
    tokenizing holds the event loop."""
    inside, released = threading.Event(), []
    original = LlamaEngine.count_tokens

    def slow_count(self: LlamaEngine, messages: tuple) -> int:  # type: ignore[type-arg]
        if sum(len(m.content) for m in messages) > 100_000:
            inside.set()
            time.sleep(3.0)
            released.append(time.monotonic())
        return original(self, messages)

    monkeypatch.setattr(LlamaEngine, "count_tokens", slow_count)
    settings = test_settings(data_dir)
    with LiveServer(settings, registry) as live:
        conv = httpx.post(
            f"{live.url}/v1/conversations", json={}, headers=live.headers, timeout=30
        ).json()
        huge = "lorem ipsum " * 12_500  # 150,000 characters
        chat = {"messages": [{"role": "user", "content": huge}]}
        for url, body, status in (  # OpenAI's API answers 400 context_length_exceeded
            (f"{live.url}/v1/conversations/{conv['id']}/turns", {"content": huge}, 413),
            (f"{live.url}/v1/chat/completions", chat, 400),
        ):
            inside.clear()
            released.clear()
            result: list[httpx.Response] = []
            worker = threading.Thread(
                target=lambda u=url, b=body, out=result: out.append(
                    httpx.post(u, json=b, headers=live.headers, timeout=60)
                )
            )
            worker.start()
            assert inside.wait(30)
            other = httpx.get(f"{live.url}/v1/models", headers=live.headers, timeout=30)
            served = time.monotonic()
            worker.join(60)
            assert other.status_code == 200
            assert released and served < released[0], url  # served while tokenizing
            assert result and result[0].status_code == status, result[0].text
            message = result[0].json()["error"]["message"]
            assert "context window" in message or "maximum context length" in message


def test_a_message_too_long_is_refused_before_moderation_reads_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that cannot fit costs its tokenizing only: moderation (the encoder, on the
    same cores as every answer) never reads it, on the conversation API or OpenAI's."""
    from chatbox.moderation.checker import Moderator

    read: list[int] = []
    original = Moderator.check

    async def counting(self: Moderator, text: str, *args: object, **kw: object) -> object:
        read.append(len(text))
        return await original(self, text, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Moderator, "check", counting)
    huge = "lorem ipsum " * 2_000  # 24,000 characters: over 1,024 tokens
    conv = client.post("/v1/conversations", json={}).json()
    _error(
        client.post(f"/v1/conversations/{conv['id']}/turns", json={"content": huge}),
        413,
        "context window",
    )
    chat = {"model": "tiny", "messages": [{"role": "user", "content": huge}]}
    _error(client.post("/v1/chat/completions", json=chat), 400, "maximum context length")
    assert read == []
