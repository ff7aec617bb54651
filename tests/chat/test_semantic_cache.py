"""The semantic cache's own rules: the guard beside similarity, the threshold, partitions,
lifetime, erasure and the policy section."""

from __future__ import annotations

import numpy as np
import pytest

from chatbox.chat.caches.semantic_cache import SemanticCache, same_specifics
from chatbox.chat.policy import Policy, SemanticCachePolicy
from chatbox.engine.types import Usage


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("What is the capital of France?", "What is the capital of Spain?"),
        ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
        ("Is coffee bad for your heart?", "Is coffee good for your heart?"),
        ("What is 15% of 80?", "What is 15% of 90?"),
        ("What is 7 times 8?", "What is 7 plus 8?"),
        ('Translate "good morning" into French.', 'Translate "good night" into French.'),
        ("When did World War II end?", "When did World War II start?"),
    ],
)
def test_the_guard_tells_near_misses_apart(first: str, second: str) -> None:
    assert not same_specifics(first, second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("What is the capital of France?", "What's France's capital city?"),
        ("what is the capital of italy", "What's the capital of Italy?"),
        ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
        ("How do I boil an egg?", "What's the way to boil an egg?"),
    ],
)
def test_the_guard_lets_paraphrases_through(first: str, second: str) -> None:
    assert same_specifics(first, second)


def unit(*values: float) -> np.ndarray:
    v = np.zeros(384, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


def test_a_hit_needs_the_threshold_the_partition_and_the_lifetime() -> None:
    now = [0.0]
    cache = SemanticCache(
        SemanticCachePolicy(tiers=("free",), threshold=0.9, ttl_s=60), clock=lambda: now[0]
    )
    q = "How do I boil an egg?"
    cache.put("p", "ann", "c1", q, unit(1, 0), "Ten minutes.", Usage(5, 3))
    hit = cache.get("p", "How can I boil an egg?", unit(1, 0.2))
    assert hit is not None and hit.entry.answer == "Ten minutes." and hit.similarity > 0.9
    assert cache.get("p", "How can I boil an egg?", unit(1, 1)) is None  # 0.71: too far
    assert cache.get("other", q, unit(1, 0)) is None  # another partition
    now[0] = 61.0
    assert cache.get("p", q, unit(1, 0)) is None and len(cache) == 0  # too old
    assert (cache.hits, cache.misses) == (1, 3)


def test_erasure_drops_by_account_and_by_conversation() -> None:
    cache = SemanticCache(SemanticCachePolicy(tiers=("free",)))
    for owner, conv, i in (("ann", "c1", 1), ("ann", "c2", 2), ("bob", "c3", 3)):
        cache.put("p", owner, conv, f"q{i}", unit(1, i), "a", Usage())
    assert cache.forget(conversations=["c2"]) == 1
    assert cache.forget(owner="ann") == 1
    assert len(cache) == 1 and cache.size > 0
    cache.clear()
    assert len(cache) == 0 and cache.size == 0


def test_it_is_opt_in_per_tier_and_its_policy_is_checked() -> None:
    assert not Policy.from_dict({}).semantic_cache.tiers
    policy = Policy.from_dict({"semantic_cache": {"tiers": ["paid"], "threshold": 0.95}})
    cache = SemanticCache(policy.semantic_cache)
    assert cache.enabled_for("paid") and not cache.enabled_for("free")
    with pytest.raises(ValueError, match="threshold"):
        Policy.from_dict({"semantic_cache": {"threshold": 1.5}})
    with pytest.raises(ValueError, match="unknown keys"):
        Policy.from_dict({"semantic_cache": {"treshold": 0.9}})
