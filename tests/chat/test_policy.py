"""The gateway policy file: tiers, routing rules, the overload order, and bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.chat.policy import Canary, Policy, PolicyError, TierPolicy

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


CANARY = '[tiers.free]\n\n[[routing.canary]]\ntier = "free"\nmodel = "next"\npercent = 10\n'


@pytest.mark.parametrize(
    ("mistake", "named"),
    [
        ('tier = "fre"', r"number 1.*tier 'fre' is not a tier of this policy \(tiers: free\)"),
        ("percent = 150", r"number 1.*percent must be a number from 0 to 100, not 150"),
        ("percent = -1", r"percent must be a number from 0 to 100"),
        ('percent = "10"', r"percent must be a number"),
        ("eval_percent = 101", r"eval_percent must be a number from 0 to 100"),
        ("precent = 10", r"number 1.*unknown keys \['precent'\]"),
        (
            'arm = "x"\nauto_rollbak = false',
            r"number 1 \(arm 'x'\).*unknown keys \['auto_rollbak'\]",
        ),
        ('auto_rollback = "no"', r"auto_rollback must be true or false"),
    ],
)
def test_a_bad_canary_entry_is_an_error_naming_the_file_the_entry_and_the_problem(
    tmp_path: Path, mistake: str, named: str
) -> None:
    entry = {"tier": '"free"', "model": '"next"', "percent": "10"}
    entry.update(line.split(" = ") for line in mistake.splitlines())
    body = "".join(f"{k} = {v}\n" for k, v in entry.items())
    path = write(tmp_path, "[tiers.free]\n\n[[routing.canary]]\n" + body)
    with pytest.raises(PolicyError, match=named) as caught:
        Policy.load(path)
    assert str(caught.value).startswith(f"policy file {path}: [[routing.canary]]")


def test_a_canary_needs_a_tier_and_a_model_and_arms_must_differ(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="model must be given"):
        Policy.load(write(tmp_path, '[[routing.canary]]\ntier = "free"\npercent = 5\n'))
    two = CANARY + 'arm = "a"\n' + CANARY.split("\n\n", 1)[1] + 'arm = "a"\n'
    with pytest.raises(PolicyError, match=r"arm names must differ; repeated: \['a'\]"):
        Policy.load(write(tmp_path, two))


def test_a_good_canary_entry_is_read(tmp_path: Path) -> None:
    text = CANARY + 'judge = "big"\neval_percent = 5\nauto_rollback = false\n'
    (canary,) = Policy.load(write(tmp_path, text)).routing.canaries
    assert canary == Canary("free", "next", 10.0, "canary-next", "big", 5.0, False)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[overload]\nhigh_watermark = 3\n", r"\[overload\]: unknown keys \['high_watermark'\]"),
        ("[routing]\nsmal = 'x'\n", r"\[routing\]: unknown keys \['smal'\]"),
        ("[tier.free]\nrpm = 5\n", r"the policy file: unknown keys \['tier'\]"),
        ("[answer_cache]\nsize = 1\n", r"answer_cache: unknown keys \['size'\]"),
        ("routing = 5\n", r"\[routing\] must be a table"),
    ],
)
def test_unknown_keys_in_any_table_are_an_error(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(PolicyError, match=named):
        Policy.load(write(tmp_path, text))


def test_the_shipped_policy_is_valid() -> None:
    assert Policy.load().tiers
