"""An existing OpenAI-compatible server (llama-cpp-python's own) as a replica of the front."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import free_port, front
from tests.cluster.fake_openai import FakeOpenAI, count_tokens, render
from tests.cluster.test_router import ask, fleet, new_conversation, stored_assistant_turns
from tests.conftest import as_stored

pytest.importorskip("sse_starlette", reason="llama-cpp-python's server extra is not installed")


@pytest.fixture
def llama_server(tiny_gguf: Path) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(tiny_gguf)]
    args += ["--model_alias", "tiny-remote", "--port", str(port), "--n_ctx", "2048"]
    # By default it cuts a streaming answer short whenever another request (even a health
    # check's GET /v1/models) arrives; a replica must not.
    args += ["--interrupt_requests", "false"]
    proc = subprocess.Popen(args, env=dict(os.environ), stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v1/models").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "no llama_cpp.server"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_an_openai_server_answers_through_the_front(data_dir: Path, llama_server: str) -> None:
    spec = f"openai+{llama_server}#slots=1&models=tiny=tiny-remote"
    with front(data_dir, [spec]) as server:
        [view] = fleet(server.url, server.headers).values()
        assert view["kind"] == "openai" and view["state"] == "healthy"
        assert view["models"] == ["tiny"]
        conv = new_conversation(server.url, server.headers)
        out = ask(server.url, server.headers, conv, "hello", max_tokens=40)
        assert out["kind"] == "done" and out["status"] == "complete", out
        assert out["text"], repr(out)
        # This server reports no usage while streaming: counted as one token a chunk (its
        # chunks carry a token each, give or take the template's special tokens).
        assert 40 <= out["usage"]["completion_tokens"] <= 44
        assert out["usage"]["prompt_tokens"] > 0
        [turn] = stored_assistant_turns(server.url, server.headers, conv)
        assert turn["content"] == as_stored(out["text"])
        # Deleting it calls nothing there (the server's prompt cache is its own).
        resp = httpx.delete(f"{server.url}/v1/conversations/{conv}", headers=server.headers)
        assert resp.status_code == 204, resp.text


def test_an_answer_continued_after_a_failover_is_charged_once_within_its_limit(
    data_dir: Path,
) -> None:
    died = threading.Event()  # whichever takes the answer first dies 40 tokens in
    with FakeOpenAI(die_after=40, died=died) as a, FakeOpenAI(die_after=40, died=died) as b:
        specs = [f"openai+{r.url}#slots=1&models=tiny=remote" for r in (a, b)]
        with front(data_dir, specs) as server:
            conv = new_conversation(server.url, server.headers)
            out = ask(server.url, server.headers, conv, "one two three four", max_tokens=100)
            assert out["kind"] == "done" and out["status"] == "complete", out
            bodies = a.bodies + b.bodies
            [first] = [body for body in bodies if "messages" in body]
            [second] = [body for body in bodies if "prompt" in body]
            # Charged as without the failover: the prompt once, the answer's 100 tokens.
            prompt = out["usage"]["prompt_tokens"]
            assert prompt == count_tokens(render(first["messages"]))
            assert out["usage"]["completion_tokens"] == 100
            assert second["max_tokens"] == 60
            assert len(out["text"].split()) == 100


def test_a_replica_serving_none_of_its_mapped_models_says_so(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from click.testing import CliRunner

    from chatbox.cli import main

    with FakeOpenAI(model="something-else") as other:
        spec = f"openai+{other.url}#slots=1&models=tiny=remote"
        with front(data_dir, [spec]) as server:
            deadline = time.monotonic() + 10
            while fleet(server.url, server.headers)[other.url]["state"] != "down":
                assert time.monotonic() < deadline, "never checked"
                time.sleep(0.1)
            key = server.headers["Authorization"].split()[1]
            listed = CliRunner().invoke(
                main, ["replicas", "--front", server.url, "--key", key, "list"]
            )
            assert listed.exit_code == 0, listed.output
    row = next(r for r in listed.output.splitlines() if other.url in r)
    assert "down" in row and "serves none of tiny=remote (it serves something-else)" in row
    assert f"replica {other.url} is down: serves none of tiny=remote" in caplog.text
