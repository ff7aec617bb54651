"""Model routing rules: pin, pick, auto, canary, tier default, the fallback, degrading."""

from __future__ import annotations

import random
from typing import Any

import pytest

from chatbox.chat.errors import UnknownModel
from chatbox.chat.policy import Policy
from chatbox.chat.routing import Route, Router
from chatbox.store import User

POLICY: dict[str, Any] = {
    "tiers": {
        "free": {"model": "small", "models": ["small", "tiny"]},
        "paid": {"model": "large"},
        "bare": {},
    },
    "routing": {
        "small": "small",
        "large": "large",
        "auto_long_chars": 40,
        "auto_code_markers": ["```"],
        "pins": {"pinned": "tiny"},
        "canary": [{"tier": "paid", "model": "next", "percent": 25, "arm": "exp"}],
    },
}
FREE = User("u1", "ann", "member", "free", False, 0.0)
PAID = User("u2", "bob", "member", "paid", False, 0.0)
BARE = User("u3", "cy", "member", "bare", False, 0.0)
PINNED = User("u4", "pinned", "member", "paid", False, 0.0)


class FixedRandom(random.Random):
    """random() always returns `value` (the canary draw, in [0, 1))."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def router(
    available: list[str] | None = None, draw: float = 0.99, policy: dict[str, Any] | None = None
) -> Router:
    names = ["small", "large", "tiny", "next"] if available is None else available
    return Router(
        Policy.from_dict(policy or POLICY), lambda: list(names), lambda: "small", FixedRandom(draw)
    )


def test_a_pin_wins_over_everything_while_its_model_is_installed() -> None:
    assert router().route(PINNED, "large", "```code```") == Route("tiny", "pin")
    assert router().expected(PINNED, "large") == "tiny"
    # Uninstalled, the pin is ignored: the user's pick stands.
    assert router(["small", "large"]).route(PINNED, "large") == Route("large", "picked")


def test_a_picked_model_is_used_when_the_tier_may_use_it() -> None:
    assert router().route(PAID, "tiny") == Route("tiny", "picked")
    assert router().route(FREE, "tiny") == Route("tiny", "picked")


def test_a_pick_outside_the_tiers_models_falls_back_to_the_tier_default() -> None:
    assert router().route(FREE, "large") == Route("small", "tier")
    assert router().expected(FREE, "large") == "small"


def test_picking_an_uninstalled_model_is_unknown_listing_the_installed_ones() -> None:
    with pytest.raises(UnknownModel) as err:
        router(["small", "large"]).route(PAID, "huge")
    assert err.value.name == "huge" and err.value.available == ["small", "large"]
    assert "small, large" in str(err.value)


def test_auto_sends_short_text_to_small_and_long_or_code_to_large() -> None:
    r = router()
    assert r.route(PAID, "auto", "hi") == Route("small", "auto-small")
    assert r.route(PAID, "auto", "x" * 40) == Route("large", "auto-large")
    assert r.route(PAID, "auto", "```py\n1\n```") == Route("large", "auto-large")
    assert r.expected(PAID, "auto") == "small"  # no text to judge: the small model


def test_auto_stays_within_the_tiers_models() -> None:
    # The free tier may not use "large": long text gets the small model.
    assert router().route(FREE, "auto", "x" * 100) == Route("small", "auto-small")


def test_auto_without_usable_rule_models_takes_the_tier_default() -> None:
    no_rules = {**POLICY, "routing": {}}
    assert router(policy=no_rules).route(PAID, "auto", "hi") == Route("large", "tier")


def test_a_canary_takes_its_share_of_a_tier_when_nothing_is_picked() -> None:
    assert router(draw=0.10).route(PAID, None) == Route("next", "canary", "exp")
    assert router(draw=0.30).route(PAID, None) == Route("large", "tier")
    assert router(draw=0.10).route(FREE, None) == Route("small", "tier")  # another tier
    assert router(draw=0.10).route(PAID, "large") == Route("large", "picked")  # a pick wins


def test_a_canary_whose_model_is_not_installed_is_skipped() -> None:
    assert router(["small", "large"], draw=0.0).route(PAID, None) == Route("large", "tier")


def test_without_a_tier_model_the_default_model_answers() -> None:
    assert router().route(BARE, None) == Route("small", "default")
    assert router(["large", "tiny"]).route(FREE, None) == Route("small", "default")
    assert router().expected(BARE, None) == "small"


def test_degrading_keeps_the_arm_and_names_the_model_it_replaced() -> None:
    route = Route("next", "canary", "exp").degrade("small")
    assert route == Route("small", "degraded", "exp", degraded_from="next")


def test_code_or_long_follows_the_policy() -> None:
    r = router()
    assert not r.is_code_or_long("short")
    assert r.is_code_or_long("y" * 40) and r.is_code_or_long("```")
