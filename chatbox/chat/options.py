"""Per-request generation choices."""

from __future__ import annotations

from dataclasses import dataclass

from chatbox.chat.errors import InvalidInput
from chatbox.engine.types import SamplingParams, ToolSpec


@dataclass(frozen=True)
class TurnOptions:
    """Per-request choices; None means the conversation's or the model's default."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int = -1  # -1 none; k: each token's logprob and its top k alternatives
    grammar: str | None = None  # GBNF the answer must match (tools, response_format)
    grammar_triggers: tuple[str, ...] = ()  # lazy grammar: applies from a match on
    grammar_param: str = "response_format"  # the request parameter the grammar comes from
    tools: tuple[ToolSpec, ...] = ()
    n: int = 1
    fresh: bool = (
        False  # never answer from the semantic cache (chatbox/chat/caches/semantic_cache.py)
    )
    # A stored chat's tools: none (the default: no descriptions lengthen the prompt unless
    # the user turned tools on) | auto | required.
    tool_choice: str = "none"
    force_tools: tuple[str, ...] = ()  # tools the answer calls first, one per round, in order

    def sampling(self, default_max: int) -> SamplingParams:
        base = SamplingParams()
        return SamplingParams(
            temperature=base.temperature if self.temperature is None else self.temperature,
            top_p=base.top_p if self.top_p is None else self.top_p,
            max_tokens=default_max if self.max_tokens is None else self.max_tokens,
            seed=self.seed,
            stop=self.stop,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias,
            logprobs=self.logprobs,
            grammar=self.grammar,
            grammar_triggers=self.grammar_triggers,
        )


def check_stops(stop: tuple[str, ...], max_count: int, max_chars: int) -> None:
    """Refuse more stop sequences, or longer ones, than the limits allow (each one is
    scanned for on every generated token, on the decode thread every stream shares)."""
    if len(stop) > max_count:
        raise InvalidInput(f"stop has {len(stop):,} sequences; the limit is {max_count:,}", "stop")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise InvalidInput(f"stop[{i}] must be a string", "stop")
        if len(s) > max_chars:
            raise InvalidInput(
                f"stop[{i}] is {len(s):,} characters; the limit is {max_chars:,}", "stop"
            )
