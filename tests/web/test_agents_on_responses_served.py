"""Agent frameworks that default to OpenAI's Responses API, with their default settings, on
`chatbox serve`: openai-agents' Runner runs a function tool to a final output, and
pydantic-ai's OpenAIResponsesModel answers in text and, asked for a structured output, calls
its output tool. They need openai 3, so they run from their
own environment (scripts/setup.sh --test makes .venv-agents from requirements-agents.lock)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.served import Served

AGENTS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-agents" / "bin" / "python"
SCRIPT = Path(__file__).resolve().parents[1] / "clients" / "agents_run.py"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("agents"), model=tiny_gguf) as served:
        yield served


def run(box: Served, framework: str, name: str) -> dict[str, Any]:
    assert AGENTS_PYTHON.exists(), "run scripts/setup.sh --test (it makes .venv-agents)"
    key = box.user(name, tier="paid")
    done = subprocess.run(
        [str(AGENTS_PYTHON), str(SCRIPT), framework, box.url + "/v1", key, "tiny"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def test_openai_agents_runner_calls_the_tool_and_ends_with_a_final_output(box: Served) -> None:
    got = run(box, "openai-agents", "ada")
    assert got["calls"] and set(got["calls"]) <= {"Oslo", "Rome"}
    assert got["items"] == ["tool_call_item", "tool_call_output_item"]
    assert got["output"] == f"Sunny in {got['calls'][0]}."


def test_pydantic_ai_responses_model_answers_in_text(box: Served) -> None:
    got = run(box, "pydantic-ai", "pit")
    assert isinstance(got["output"], str) and got["output"]


def test_pydantic_ai_agent_calls_its_output_tool_for_a_structured_output(box: Served) -> None:
    got = run(box, "pydantic-ai-tools", "pia")
    assert got["output"]["city"] in ("Oslo", "Rome") and got["output"]["sky"] in ("sunny", "rainy")
    assert got["requests"] == 1  # the call's arguments validated the first time
