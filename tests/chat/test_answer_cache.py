"""The answer cache's store: bounded by bytes (least recently used out first), each answer
kept `ttl_s` at most, an owner's answers dropped together; which requests are deterministic;
what the key holds."""

from __future__ import annotations

import pytest

from chatbox.chat.caches.answer_cache import AnswerCache, deterministic, request_key
from chatbox.chat.options import TurnOptions
from chatbox.chat.policy import AnswerCachePolicy, Policy

USAGE = (3, 4, 0)


def test_bounded_by_bytes_least_recently_used_out_first() -> None:
    cache = AnswerCache(AnswerCachePolicy(max_bytes=8 * 200))
    body = b"x" * 130  # with its 3-byte key, 133 bytes: twelve fit in 1,600
    for i in range(12):
        assert cache.put(f"k{i:02}", "ann", body, USAGE)
    assert cache.get("k00") is not None  # now the most recently used
    assert cache.put("k12", "ann", body, USAGE)
    assert cache.size <= 8 * 200
    assert cache.get("k01") is None and cache.get("k00") is not None
    assert not cache.put("big", "ann", b"x" * 400, USAGE)  # over an eighth: never kept
    assert (cache.hits, cache.misses) == (2, 1)


def test_an_answer_lives_ttl_s_at_most() -> None:
    now = [0.0]
    cache = AnswerCache(AnswerCachePolicy(ttl_s=60), clock=lambda: now[0])
    cache.put("k", "ann", b"{}", USAGE)
    now[0] = 59.0
    assert cache.get("k") is not None
    now[0] = 61.0
    assert cache.get("k") is None and len(cache) == 0 and cache.size == 0


def test_an_owner_s_answers_go_together() -> None:
    cache = AnswerCache(AnswerCachePolicy())
    cache.put("a1", "ann", b"1", USAGE)
    cache.put("a2", "ann", b"2", USAGE)
    cache.put("b1", "bob", b"3", USAGE)
    assert cache.forget_owner("ann") == 2
    assert cache.get("a1") is None and cache.get("b1") is not None


def test_deterministic_means_greedy_or_seeded() -> None:
    assert deterministic(TurnOptions(temperature=0))
    assert deterministic(TurnOptions(temperature=0.8, seed=1))
    assert not deterministic(TurnOptions())  # the default temperature samples
    assert not deterministic(TurnOptions(temperature=0.8))


def test_the_key_holds_scope_model_rules_and_every_shaping_field() -> None:
    opts = TurnOptions(temperature=0)
    request = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "stream": False}

    def key(**changes: object) -> str:
        args: dict[str, object] = {
            "scope": "u1",
            "model": "m",
            "identity": "id",
            "moderation": "off",
            "request": request,
            "options": opts,
            "max_tokens": 64,
        }
        args.update(changes)
        return request_key(**args)  # type: ignore[arg-type]

    base = key()
    assert key(request={**request, "stream": True, "user": "tag"}) == base  # delivery only
    for change in (
        {"scope": "u2"},
        {"identity": "other-file"},
        {"moderation": "v2"},
        {"request": {**request, "response_format": {"type": "json_object"}}},
        {"options": TurnOptions(temperature=0, top_p=0.5)},
        {"max_tokens": 65},
    ):
        assert key(**change) != base, change


def test_the_policy_section_is_read_and_checked() -> None:
    policy = Policy.from_dict({"answer_cache": {"charge": "requests", "public_tiers": ["eval"]}})
    assert policy.answer_cache.charge == "requests"
    assert policy.answer_cache.public_tiers == ("eval",)
    with pytest.raises(ValueError, match="charge"):
        Policy.from_dict({"answer_cache": {"charge": "half"}})
    with pytest.raises(ValueError, match="unknown keys"):
        Policy.from_dict({"answer_cache": {"size": 1}})
