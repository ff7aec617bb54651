"""Per-request generation choices."""

from __future__ import annotations

from dataclasses import dataclass

from chatbox.engine.types import SamplingParams


@dataclass(frozen=True)
class TurnOptions:
    """Per-request choices; None means the conversation's or the model's default."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def sampling(self, default_max: int) -> SamplingParams:
        base = SamplingParams()
        return SamplingParams(
            temperature=base.temperature if self.temperature is None else self.temperature,
            top_p=base.top_p if self.top_p is None else self.top_p,
            max_tokens=default_max if self.max_tokens is None else self.max_tokens,
            seed=self.seed,
            stop=self.stop,
        )
