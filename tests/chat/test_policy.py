"""The gateway policy file: tiers, routing rules, the overload order, and bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.chat.policy import Canary, Policy, TierPolicy

POLICY_TOML = """
[tiers.free]
rpm = 10
tpm = 500
max_streams = 1
model = "small"
models = ["small"]
overload = "shed"
priority = 2

[tiers.paid]
rpm = 100
monthly_tokens = 1000000
model = "large"
fallback = "small"
overload = "degrade"

[overload]
high_water = 6
degrade_factor = 1.5
retry_after_s = 9
unknown_knob = 1

[routing]
small = "small"
large = "large"
auto_long_chars = 300
auto_code_markers = ["```", "SELECT "]

[routing.pins]
ann = "large"

[[routing.canary]]
tier = "paid"
model = "next"
percent = 10

[[routing.canary]]
tier = "free"
model = "tiny"
percent = 2.5
arm = "exp-1"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_a_policy_file_is_read_into_tiers_routing_and_overload(tmp_path: Path) -> None:
    policy = Policy.load(write(tmp_path, POLICY_TOML))
    assert policy.tiers["free"] == TierPolicy(
        "free",
        rpm=10,
        tpm=500,
        max_streams=1,
        model="small",
        models=("small",),
        overload="shed",
        priority=2,
    )
    paid = policy.tier("paid")
    assert (paid.rpm, paid.monthly_tokens, paid.fallback, paid.overload) == (
        100,
        1_000_000,
        "small",
        "degrade",
    )
    assert paid.tpm == TierPolicy("x").tpm  # unset keys keep the built-in defaults
    rules = policy.routing
    assert (rules.small, rules.large, rules.auto_long_chars) == ("small", "large", 300)
    assert rules.auto_code_markers == ("```", "SELECT ")
    assert rules.pins == {"ann": "large"}
    assert rules.canaries == (
        Canary("paid", "next", 10.0, "canary-next"),
        Canary("free", "tiny", 2.5, "exp-1"),
    )
    over = policy.overload
    assert (over.high_water, over.degrade_factor, over.retry_after_s) == (6, 1.5, 9)


def test_an_undefined_tier_gets_the_free_tiers_limits() -> None:
    policy = Policy.from_dict({"tiers": {"free": {"rpm": 7}, "gold": {"rpm": 900}}})
    assert policy.tier("gold").rpm == 900
    assert policy.tier("bronze").rpm == 7 and policy.tier("bronze").name == "free"


def test_without_a_free_tier_an_undefined_tier_gets_built_in_limits() -> None:
    policy = Policy.from_dict({"tiers": {"gold": {"rpm": 900}}})
    assert policy.tier("bronze") == TierPolicy("bronze")


def test_a_missing_file_gives_the_built_in_policy(tmp_path: Path) -> None:
    policy = Policy.load(tmp_path / "absent.toml")
    assert set(policy.tiers) == {"free", "paid"}
    assert policy.tier("free").overload == "shed" and policy.tier("paid").overload == "queue"
    assert policy.routing.pins == {} and policy.routing.canaries == ()


def test_an_unknown_tier_key_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "[tiers.free]\nrpm = 5\nrequests_per_minute = 5\n")
    with pytest.raises(ValueError, match=r"'free'.*requests_per_minute"):
        Policy.load(path)


def test_an_unknown_overload_mode_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overload must be one of"):
        Policy.load(write(tmp_path, '[tiers.paid]\noverload = "drop"\n'))


def test_a_file_that_is_not_toml_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):  # tomllib.TOMLDecodeError is a ValueError
        Policy.load(write(tmp_path, "[tiers.free\nrpm = 5\n"))
