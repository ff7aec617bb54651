"""Ready means ready: `/readyz` says so only once start-up work has ended, so the first
requests of a box just started do not share its cores with loading and training."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.served import Served


def test_ready_comes_after_moderation_and_the_encoders_have_loaded(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    with Served(tmp_path, model=tiny_gguf) as box:  # the shipped policy: moderation on
        ready = httpx.get(box.url + "/readyz", timeout=10).json()
        log = box.log()
    assert ready["status"] == "ready" and ready["warmed_up"] is True
    # what the first message's moderation needs was loaded before ready, not after it
    assert "embedding model (urgent lane" in log, log[-3000:]
