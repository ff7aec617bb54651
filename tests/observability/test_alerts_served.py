"""`chatbox serve` in router mode raises an alert when its replica goes down and resolves it
when the replica is back: the change is in the log, posted to the webhook in Alertmanager's
shape, and shown on the console's live page."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.fake import health
from tests.served import Served, free_port

pytestmark = pytest.mark.timeout(300)


class Listener:
    """A loopback HTTP server on a fixed port: a replica's health, or a webhook's inbox."""

    def __init__(self, port: int, on_post: Callable[[bytes], None] | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # a replica's health check
                self._send(json.dumps(health(2)).encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if on_post is not None:
                    on_post(body)
                self._send(b"{}")

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait(what: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)


def mine(posted: list[dict[str, Any]], status: str) -> list[dict[str, Any]]:
    """The replica-down alerts posted with `status` (a box with a nearly full disk may fire
    its own disk alert beside them)."""
    return [
        a
        for p in posted
        for a in p["alerts"]
        if a["status"] == status and a["labels"]["alertname"] == "ChatboxReplicaDown"
    ]


def test_a_replica_down_fires_and_resolves_end_to_end(tmp_path: Path, tiny_gguf: Path) -> None:
    posted: list[dict[str, Any]] = []
    hook = Listener(free_port(), lambda body: posted.append(json.loads(body)))
    port = free_port()
    replica = Listener(port)
    env = {
        "CHATBOX_REPLICAS": f"http://127.0.0.1:{port}",
        "CHATBOX_REPLICA_TOKEN": "t" * 32,
        "CHATBOX_REPLICA_HEALTH_S": "0.3",
        "CHATBOX_CONSOLE_SAMPLE_S": "0.5",
        "CHATBOX_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{hook.server.server_address[1]}/hook",
    }
    box = Served(tmp_path, model=tiny_gguf, env=env)
    try:
        with box:
            time.sleep(2)  # a few samples with the replica up
            assert mine(posted, "firing") == []
            replica.close()

            _wait(lambda: bool(mine(posted, "firing")))
            alert = mine(posted, "firing")[0]
            assert alert["labels"]["alertname"] == "ChatboxReplicaDown"
            assert alert["labels"]["replica"] == f"http://127.0.0.1:{port}"
            live = httpx.get(box.url + "/console/live", headers=box.admin, timeout=30).text
            assert 'data-alert="ChatboxReplicaDown"' in live.split('id="alerts-firing"')[1]
            # the table scrolls sideways on a phone: it must take keyboard focus (axe)
            assert re.search(r'<table tabindex="0"[^>]*id="alerts-firing"', live)

            replica = Listener(port)  # back
            _wait(lambda: bool(mine(posted, "resolved")))
            done = mine(posted, "resolved")[0]
            assert done["labels"]["alertname"] == "ChatboxReplicaDown"
            assert done["endsAt"] > done["startsAt"]
            log = box.log()
            assert "alert firing: replica" in log and "alert resolved: replica" in log
    finally:
        replica.close()
        hook.close()
