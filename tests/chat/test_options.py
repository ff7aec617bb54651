"""Per-request options become the engine's sampling parameters."""

from __future__ import annotations

from chatbox.chat.options import TurnOptions
from chatbox.engine.types import SamplingParams


def test_unset_options_take_the_engine_defaults_and_the_callers_max() -> None:
    params = TurnOptions().sampling(default_max=256)
    base = SamplingParams()
    assert params == SamplingParams(max_tokens=256)
    assert (params.temperature, params.top_p, params.seed, params.stop) == (
        base.temperature,
        base.top_p,
        None,
        (),
    )


def test_set_options_override_the_defaults() -> None:
    options = TurnOptions(
        model="tiny", temperature=0.2, top_p=0.5, max_tokens=7, seed=3, stop=("END",)
    )
    params = options.sampling(default_max=256)
    assert (params.temperature, params.top_p, params.max_tokens, params.seed, params.stop) == (
        0.2,
        0.5,
        7,
        3,
        ("END",),
    )


def test_zero_is_a_choice_not_a_missing_value() -> None:
    params = TurnOptions(temperature=0.0, top_p=0.0, max_tokens=0).sampling(default_max=256)
    assert (params.temperature, params.top_p, params.max_tokens) == (0.0, 0.0, 0)


def test_options_the_request_cannot_set_keep_the_engine_defaults() -> None:
    base = SamplingParams()
    params = TurnOptions(temperature=1.5).sampling(default_max=10)
    assert (params.top_k, params.min_p, params.repeat_penalty) == (
        base.top_k,
        base.min_p,
        base.repeat_penalty,
    )
