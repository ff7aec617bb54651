"""Integration fixtures: the real default model (SmolLM2-135M) behind a live server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, on_smollm2


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data_dir: Path = tmp_path_factory.mktemp("real") / "data"
    settings, registry = on_smollm2(data_dir, max_tokens=48, disconnect_grace_s=1.0)
    with LiveServer(settings, registry) as server:
        yield server
