"""Settings from the environment: optional engine choices may be left to the engine."""

from __future__ import annotations

from chatbox.settings import settings_from_env


def test_flash_attention_is_left_to_the_engine_unless_set() -> None:
    assert settings_from_env({}).engine.flash_attn is None
    assert settings_from_env({"CHATBOX_FLASH_ATTN": "auto"}).engine.flash_attn is None
    assert settings_from_env({"CHATBOX_FLASH_ATTN": "1"}).engine.flash_attn is True
    assert settings_from_env({"CHATBOX_FLASH_ATTN": "off"}).engine.flash_attn is False
    assert settings_from_env({"CHATBOX_N_UBATCH": "128"}).engine.n_ubatch == 128
