"""An OpenAI-compatible server as llama-server speaks it, small enough to script: one token a
chunk, usage in the last chunk, `/apply-template` (so the front continues answers here), and
"dies" `die_after` tokens into an answer (the connection drops, as at a kill -9) unless `died`,
an event servers may share, is set: so of two, whichever answers first dies, once."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def count_tokens(text: str) -> int:
    """This server's tokenizer: a token per word."""
    return len(text.split())


def render(messages: list[dict[str, str]]) -> str:
    """This server's chat template."""
    return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant> "


class FakeOpenAI:
    def __init__(
        self,
        model: str = "remote",
        die_after: int | None = None,
        died: threading.Event | None = None,
        pace_s: float = 0.002,
    ) -> None:
        self.model = model
        self.pace_s = pace_s  # between tokens
        self.die_after = die_after
        self.died = died or threading.Event()
        self.bodies: list[dict[str, Any]] = []  # every completion request, in order
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._json({"object": "list", "data": [{"id": fake.model, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                if self.path == "/apply-template":
                    self._json({"prompt": render(body["messages"])})
                    return
                fake.bodies.append(body)
                prompt = render(body["messages"]) if "messages" in body else body["prompt"]
                self._stream(count_tokens(prompt), int(body["max_tokens"]), "prompt" in body)

            def _stream(self, prompt_tokens: int, max_tokens: int, completion: bool) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for i in range(max_tokens):
                    if i == fake.die_after and not fake.died.is_set():
                        fake.died.set()
                        self.wfile.flush()
                        self.connection.shutdown(2)  # gone mid-answer
                        return
                    choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                    if completion:
                        choice["text"] = " w"
                    else:
                        choice["delta"] = {"content": " w"}
                    if i == max_tokens - 1:
                        choice["finish_reason"] = "length"
                    self._event({"choices": [choice]})
                    time.sleep(fake.pace_s)
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}
                self._event({"choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _event(self, data: dict[str, Any]) -> None:
                self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())

            def _json(self, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
