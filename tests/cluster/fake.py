"""A replica that passes health checks but hangs, sends garbage, or answers slowly.

"slow" speaks the replica protocol correctly, one token every `pace_s`, so an answer holds
its slot for as long as a test needs (the tiny model writes thousands of tokens a second).
"full" starts an answer and drops it after a few tokens, and refuses to continue one (413:
the answer so far would not fit its context).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from chatbox.cluster.protocol import event_to_json, line
from chatbox.engine.types import DoneEvent, TokenEvent, Usage

FULL_AFTER = 5  # tokens a "full" replica writes before it drops the answer


def health(slots: int) -> dict[str, Any]:
    return {"models": {"tiny": {"n_ctx_per_seq": 4096}}, "stats": {}, "slots": slots}


class FakeReplica:
    def __init__(self, misbehaviour: str, slots: int = 4, pace_s: float = 0.05) -> None:
        self.misbehaviour = misbehaviour
        self.slots = slots
        self.pace_s = pace_s
        self.generate_calls = 0
        self.running = 0  # answers being streamed now ("slow")
        self.lock = threading.Lock()
        self.closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(json.dumps(health(fake.slots)).encode(), "application/json")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                if self.path.endswith("/tokenize"):
                    tokens = sum(len(m["content"]) // 3 + 8 for m in body["messages"])
                    self._send(json.dumps({"tokens": tokens}).encode(), "application/json")
                    return
                fake.generate_calls += 1
                if fake.misbehaviour == "hang":  # headers, then silence
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.flush()
                    fake.closing.wait(60)
                    return
                if fake.misbehaviour == "slow":
                    self._slowly(int(body.get("sampling", {}).get("max_tokens", 16)))
                    return
                if fake.misbehaviour == "full" and body.get("continue_text"):
                    refusal = {"error": "too long", "prompt_tokens": 4090, "limit": 4096}
                    self._send(json.dumps(refusal).encode(), "application/json", 413)
                    return
                if fake.misbehaviour == "full":  # a few tokens, then the connection drops
                    self._slowly(FULL_AFTER, done=False)
                    return
                self._send(b"<html>502 bad gateway</html>\nnot json at all\n", "text/html")

            def _slowly(self, max_tokens: int, done: bool = True) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/x-ndjson")
                self.end_headers()
                with fake.lock:
                    fake.running += 1
                try:
                    self.wfile.write(line({"type": "start", "prompt_tokens": 10}))
                    for i in range(max_tokens):
                        if fake.closing.wait(fake.pace_s):
                            return
                        self.wfile.write(line(event_to_json(TokenEvent("word "), i + 1)))
                        self.wfile.flush()
                    if done:
                        end = DoneEvent("length", Usage(10, max_tokens, 0))
                        self.wfile.write(line(event_to_json(end)))
                except OSError:  # the front closed the stream: the cancel
                    pass
                finally:
                    with fake.lock:
                        fake.running -= 1

            def _send(self, body: bytes, kind: str, status: int = 200) -> None:
                self.send_response(status)
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

    def stop(self) -> None:
        """Gone: it answers nothing any more (health checks fail)."""
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def __exit__(self, *exc: object) -> None:
        if not self.closing.is_set():
            self.stop()
