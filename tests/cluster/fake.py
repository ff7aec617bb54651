"""A replica that passes health checks but hangs or sends garbage when asked to answer."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HEALTH = {"models": {"tiny": {"n_ctx_per_seq": 4096}}, "stats": {}, "slots": 4}


class FakeReplica:
    def __init__(self, misbehaviour: str) -> None:
        self.misbehaviour = misbehaviour
        self.generate_calls = 0
        self.closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(json.dumps(HEALTH).encode(), "application/json")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                fake.generate_calls += 1
                if fake.misbehaviour == "hang":  # headers, then silence
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.flush()
                    fake.closing.wait(60)
                    return
                self._send(b"<html>502 bad gateway</html>\nnot json at all\n", "text/html")

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeReplica:
        self.thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
