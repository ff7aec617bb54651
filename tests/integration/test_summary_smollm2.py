"""The real default model (SmolLM2-135M) summarises a scripted conversation: the summary
names at least one of its key nouns (a tolerant check: a 135M model paraphrases freely)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.chat.summaries import Summariser
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.types import Engine
from chatbox.store import Store, TurnUsage
from tests.conftest import on_smollm2

pytestmark = pytest.mark.model

SCRIPT = (
    ("user", "I'm planning a trip from Lisbon to Porto by train with my dog Biscuit."),
    ("assistant", "Lovely. Dogs travel on Portuguese trains if they are small or muzzled."),
    ("user", "Biscuit is a small beagle. Which train is fastest from Lisbon to Porto?"),
    ("assistant", "The Alfa Pendular is the fastest train; it takes about three hours."),
    ("user", "Great. Can I bring Biscuit's crate on the Alfa Pendular train to Porto?"),
    ("assistant", "Yes, a small crate fits by your seat. Book the tickets a week ahead."),
    ("user", "In Porto I want to visit the Ribeira and eat a francesinha with Biscuit."),
    ("assistant", "Many cafés on the Ribeira welcome dogs on their terraces."),
    ("user", "Thanks. Remind me: the trip budget is 400 euros for three days."),
    ("assistant", "Noted: 400 euros for three days in Porto, with Biscuit, by train."),
)
KEY_NOUNS = ("lisbon", "porto", "biscuit", "dog", "beagle", "train", "trip", "alfa", "ribeira")


async def test_the_real_model_summary_names_the_conversation(tmp_path: Path) -> None:
    settings, registry = on_smollm2(
        tmp_path / "data", n_ctx_per_seq=320, n_ctx=640, max_tokens=64, summary_tokens=96
    )
    settings.ensure_dirs()
    store = await Store.open(settings.database)
    engine = LlamaEngine(registry.model_path("smollm2"), "smollm2", settings.engine)
    await engine.start()
    try:
        user = await store.users.create("ana")
        conv = await store.conversations.create(user.id, None, None, None)
        parent = None
        for role, text in SCRIPT:
            if role == "user":
                parent = (await store.turns.append_user(conv.id, parent, text)).id
            else:
                assert parent is not None
                draft = await store.turns.start_draft(conv.id, parent, "smollm2")
                turn = await store.turns.finish_draft(draft, "complete", text, TurnUsage())
                parent = turn.id
        assert parent is not None

        async def engine_for(name: str) -> Engine:
            return engine

        summary = await Summariser(store, engine_for, settings).summarise(
            user.id, conv.id, parent, "smollm2"
        )
        assert summary is not None, "the scripted conversation is past the trigger"
        text = summary.content.lower()
        assert any(noun in text for noun in KEY_NOUNS), summary.content
        assert summary.covered >= 2 and summary.covers_id != parent  # the recent part stays
    finally:
        await engine.stop()
        engine.close()
        await store.close()
