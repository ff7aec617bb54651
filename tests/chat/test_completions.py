"""Stateless completions: admitted, checked against the context, metered; refusals mapped."""

from __future__ import annotations

from typing import Any, cast

import pytest

from chatbox.chat.admission import Gatekeeper
from chatbox.chat.errors import InvalidInput, Overloaded, RateLimited, TooLong, UnknownModel
from chatbox.chat.options import TurnOptions
from chatbox.chat.policy import Policy
from chatbox.chat.routing import Router
from chatbox.chat.stateless.completions import complete
from chatbox.chat.stateless.metered import MeteredGeneration
from chatbox.engine.types import ChatMessage
from chatbox.store import User
from chatbox.store.usage import UsageRepo
from tests.chat.fakes import FakeEngine, FakeModels, FakeUsage

USER = User("u1", "ann", "member", "free", False, 0.0)
POLICY: dict[str, Any] = {
    "tiers": {"free": {"rpm": 0, "tpm": 0, "max_streams": 1, "priority": 3}},
    "overload": {"retry_after_s": 7},
}
HELLO = (ChatMessage("user", "hello"),)


def setup(**engine: Any) -> tuple[FakeModels, Gatekeeper, FakeUsage]:
    models = FakeModels({"tiny": FakeEngine("tiny", **engine), "other": FakeEngine("other")})
    usage = FakeUsage()
    policy = Policy.from_dict(POLICY)
    router = Router(policy, models.names, models.default)
    return models, Gatekeeper(policy, cast(UsageRepo, usage), router, models.stats), usage


async def can_admit_again(gate: Gatekeeper) -> bool:
    """max_streams is 1: a second admission works only if the first ticket was given back."""
    try:
        ticket = await gate.admit(USER, None, "again")
    except RateLimited:
        return False
    await ticket.finish(None)
    return True


async def test_without_a_user_the_named_model_answers_unmetered() -> None:
    models, gate, usage = setup()
    name, generation, tokens = await complete(
        models, gate, 64, HELLO, TurnOptions(model="other", temperature=0.0)
    )
    assert (name, tokens) == ("other", 5)
    [request] = models.engines["other"].submitted
    assert request.messages == HELLO and request.priority == 0
    assert (request.sampling.temperature, request.sampling.max_tokens) == (0.0, 64)
    assert generation is models.engines["other"].generations[0]
    assert usage.records == []


async def test_without_a_user_an_unknown_model_lists_the_available() -> None:
    models, gate, _ = setup()
    with pytest.raises(UnknownModel) as err:
        await complete(models, gate, 64, HELLO, TurnOptions(model="huge"))
    assert err.value.available == ["tiny", "other"]


async def test_with_a_user_it_is_admitted_routed_and_metered() -> None:
    models, gate, _ = setup()
    name, generation, _ = await complete(models, gate, 64, HELLO, TurnOptions(), USER)
    assert name == "tiny"  # the router's default
    assert isinstance(generation, MeteredGeneration)
    assert models.engines["tiny"].submitted[0].priority == 3  # the tier's place in line
    assert not await can_admit_again(gate)  # the answer holds the user's one stream


async def test_empty_messages_are_invalid_and_admit_nothing() -> None:
    models, gate, usage = setup()
    with pytest.raises(InvalidInput, match="messages"):
        await complete(models, gate, 64, (), TurnOptions(), USER)
    assert usage.records == [] and await can_admit_again(gate)


async def test_a_prompt_that_fills_the_context_is_too_long() -> None:
    models, gate, _ = setup(limit=5)  # "hello" is 5 tokens: no room for an answer
    with pytest.raises(TooLong) as err:
        await complete(models, gate, 64, HELLO, TurnOptions(), USER)
    assert (err.value.tokens, err.value.limit) == (5, 5)
    assert models.engines["tiny"].submitted == []
    assert await can_admit_again(gate)  # the admission was given back


async def test_the_engines_own_overflow_is_too_long() -> None:
    models, gate, _ = setup(overflow=True)
    with pytest.raises(TooLong) as err:
        await complete(models, gate, 64, HELLO, TurnOptions(), USER)
    assert (err.value.tokens, err.value.limit) == (101, 100)
    assert await can_admit_again(gate)


async def test_a_busy_engine_is_overloaded_with_the_policys_retry() -> None:
    models, gate, usage = setup(busy=True)
    with pytest.raises(Overloaded) as err:
        await complete(models, gate, 64, HELLO, TurnOptions(), USER)
    assert err.value.retry_after == 7
    [record] = usage.records  # the refused request is counted, with no tokens
    assert (record["prompt"], record["completion"]) == (0, 0)
    assert await can_admit_again(gate)


async def test_a_model_that_fails_to_load_gives_the_admission_back() -> None:
    models, gate, _ = setup()
    models.load_error = RuntimeError("bad gguf")
    with pytest.raises(RuntimeError, match="bad gguf"):
        await complete(models, gate, 64, HELLO, TurnOptions(), USER)
    assert await can_admit_again(gate)
