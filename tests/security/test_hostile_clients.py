"""Hostile clients against the live server: 50 slow uploads and 50 SSE clients that never
read, all at once. The process' memory stays within 100 MB of idle, and another user's
answer still streams to its end. Loopback only; every socket is closed."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from tests.conftest import LiveServer, bearer, seed_user
from tests.security.conftest import roomy
from tests.sse import parse_sse

pytestmark = pytest.mark.timeout(240)

N = 50
TRICKLE_S = 6.0
BOUNDARY = "hostileboundary"


def rss_mb() -> float:
    """This process' resident memory (the server runs in a thread of it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server(
    settings: Settings, registry: ModelRegistry, embedder: Any
) -> Iterator[tuple[LiveServer, dict[str, str], dict[str, str]]]:
    settings = roomy(settings)
    bob = bearer(seed_user(settings, "bob", role="member", tier="paid"))
    mallory = bearer(seed_user(settings, "mallory", role="member", tier="paid"))
    with LiveServer(settings, registry) as live:
        yield live, bob, mallory


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return s


def _slow_upload(port: int, key: str, i: int) -> socket.socket:
    """A multipart upload that declares nothing (chunked) and sends a few bytes at a time."""
    s = _connect(port)
    head = (
        f"POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    part = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="slow{i}.txt"\r\nContent-Type: text/plain\r\n\r\n'
    )
    s.sendall(head.encode() + f"{len(part):x}\r\n{part}\r\n".encode())
    return s


def _slow_declared(port: int, key: str, i: int) -> socket.socket:
    """A multipart upload declaring a large Content-Length, then trickling."""
    s = _connect(port)
    head = (
        f"POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {5 * 1024 * 1024}\r\n\r\n"
    )
    part = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="slowd{i}.txt"\r\nContent-Type: text/plain\r\n\r\n'
    )
    s.sendall(head.encode() + part.encode())
    return s


def _silent_sse(port: int, key: str, conv_id: str) -> socket.socket:
    """Start a long streaming answer and never read a byte of it."""
    s = _connect(port)
    body = json.dumps({"content": "Tell me a very long story. " * 5, "max_tokens": 512}).encode()
    s.sendall(
        (
            f"POST /v1/conversations/{conv_id}/turns HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: {key}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    return s


def test_slow_uploads_and_silent_sse_clients_do_not_starve_others(server) -> None:  # type: ignore[no-untyped-def]
    live, bob, mallory = server
    key = mallory["Authorization"]
    with httpx.Client(base_url=live.url, timeout=60) as http:
        # Warm up: one answer, so lazy allocations are in the idle figure.
        conv = http.post("/v1/conversations", json={}, headers=bob).json()["id"]
        with http.stream(
            "POST",
            f"/v1/conversations/{conv}/turns",
            headers=bob,
            json={"content": "hello", "max_tokens": 4},
        ) as r:
            r.read()
        convs = [
            http.post("/v1/conversations", json={}, headers=mallory).json()["id"] for _ in range(N)
        ]
    idle = rss_mb()
    peak = idle
    sockets: list[socket.socket] = []
    try:
        for i in range(N):
            maker = _slow_upload if i % 2 else _slow_declared
            sockets.append(maker(live.port, key, i))
        for conv_id in convs:
            sockets.append(_silent_sse(live.port, key, conv_id))

        # Trickle a few bytes on every upload while bob asks his question.
        deadline = time.monotonic() + TRICKLE_S
        while time.monotonic() < deadline:
            for i, s in enumerate(sockets[:N]):
                chunk = b"slow bytes "
                with contextlib.suppress(OSError):  # the server may close a hostile upload
                    s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if i % 2 else chunk)
            peak = max(peak, rss_mb())
            time.sleep(0.25)

        started = time.monotonic()
        with (
            httpx.Client(base_url=live.url, timeout=60) as http,
            http.stream(
                "POST",
                f"/v1/conversations/{conv}/turns",
                headers=bob,
                json={"content": "Are you still there?", "max_tokens": 8},
            ) as r,
        ):
            assert r.status_code == 200, r.read()
            kinds = [e.event for e in parse_sse(r.iter_lines())]
        took = time.monotonic() - started
        peak = max(peak, rss_mb())
        assert kinds and kinds[0] == "start" and kinds[-1] == "done", kinds
        assert took < 60, f"bob's answer took {took:.1f} s behind the hostile clients"
        assert peak - idle < 100, f"RSS grew {peak - idle:.0f} MB over idle ({idle:.0f} MB)"
    finally:
        for s in sockets:
            with contextlib.suppress(OSError):
                s.close()
