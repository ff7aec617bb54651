"""Integration fixtures: the real default model (SmolLM2-135M) behind a live server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatbox.engine.registry import ModelRegistry
from tests.conftest import LiveServer, on_smollm2, test_settings


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data_dir: Path = tmp_path_factory.mktemp("real") / "data"
    settings = test_settings(data_dir, model="smollm2", max_tokens=48, disconnect_grace_s=1.0,
                             n_ctx_per_seq=2048, n_ctx=8192)
    settings = on_smollm2(settings)
    registry = ModelRegistry(settings.models_path)
    assert "smollm2" in [e.name for e in registry.list() if e.available]
    with LiveServer(settings, registry) as server:
        yield server
