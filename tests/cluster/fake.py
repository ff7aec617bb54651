"""A replica that passes health checks but hangs, sends garbage, or answers slowly.

"slow" speaks the replica protocol correctly, one token every `pace_s`, so an answer holds
its slot for as long as a test needs (the tiny model writes thousands of tokens a second).
"full" starts an answer and drops it after a few tokens, and refuses to continue one (413:
the answer so far would not fit its context). With `report_load` its health reports its
running and queued answers as a chatbox replica does; with `background_fast` it answers
requests of no conversation (summaries, memory extraction) at once. It notes each request's
cache key, and holds summary requests while `summaries_go` is cleared.
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


SUMMARY_ASK = "Summarise the conversation."  # how chatbox's summary requests begin


def health(slots: int, running: int | None = None) -> dict[str, Any]:
    stats = {}
    if running is not None:
        queued = max(0, running - slots)
        stats = {"tiny": {"running": running - queued, "queue_depth": queued, "slots_total": slots}}
    return {"models": {"tiny": {"n_ctx_per_seq": 4096}}, "stats": stats, "slots": slots}


class FakeReplica:
    def __init__(
        self,
        misbehaviour: str,
        slots: int = 4,
        pace_s: float = 0.05,
        report_load: bool = False,
        background_fast: bool = False,
    ) -> None:
        self.misbehaviour = misbehaviour
        self.slots = slots
        self.pace_s = pace_s
        self.report_load = report_load
        self.background_fast = background_fast  # requests of no conversation: at once
        self.generate_calls = 0
        self.cache_keys: list[str | None] = []  # each answer's, in order (summaries' are None)
        self.summaries = 0  # summary requests received
        self.summaries_go = threading.Event()  # cleared: summary requests wait for it
        self.summaries_go.set()
        self.running = 0  # answers being streamed now ("slow")
        self.lock = threading.Lock()
        self.closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                running = fake.running if fake.report_load else None
                self._send(json.dumps(health(fake.slots, running)).encode(), "application/json")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                if self.path.endswith("/tokenize"):
                    tokens = sum(len(m["content"]) // 3 + 8 for m in body["messages"])
                    self._send(json.dumps({"tokens": tokens}).encode(), "application/json")
                    return
                fake.generate_calls += 1
                fake.cache_keys.append(body.get("cache_key"))
                if str(body["messages"][0].get("content", "")).startswith(SUMMARY_ASK):
                    fake.summaries += 1
                    fake.summaries_go.wait(60)
                if fake.misbehaviour == "hang":  # headers, then silence
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.flush()
                    fake.closing.wait(60)
                    return
                if fake.misbehaviour == "slow":
                    fast = fake.background_fast and not body.get("cache_key")
                    max_tokens = int(body.get("sampling", {}).get("max_tokens", 16))
                    self._slowly(max_tokens, pace_s=0.0 if fast else fake.pace_s)
                    return
                if fake.misbehaviour == "full" and body.get("continue_text"):
                    refusal = {"error": "too long", "prompt_tokens": 4090, "limit": 4096}
                    self._send(json.dumps(refusal).encode(), "application/json", 413)
                    return
                if fake.misbehaviour == "full":  # a few tokens, then the connection drops
                    self._slowly(FULL_AFTER, done=False)
                    return
                self._send(b"<html>502 bad gateway</html>\nnot json at all\n", "text/html")

            def _slowly(self, max_tokens: int, done: bool = True, pace_s: float = -1) -> None:
                pace_s = fake.pace_s if pace_s < 0 else pace_s
                self.send_response(200)
                self.send_header("content-type", "application/x-ndjson")
                self.end_headers()
                with fake.lock:
                    fake.running += 1
                try:
                    self.wfile.write(line({"type": "start", "prompt_tokens": 10}))
                    for i in range(max_tokens):
                        if pace_s and fake.closing.wait(pace_s):
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
