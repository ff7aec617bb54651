"""Starter prompts on an empty chat, chosen per model from what it can do: the manifest
names each built-in model's (`starters = [...]`); a model added by an admin gets them all."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Starter:
    label: str
    prompt: str


STARTERS: dict[str, Starter] = {
    "explain": Starter(
        "Explain a concept", "Explain in simple terms how HTTPS keeps a connection private."
    ),
    "code": Starter(
        "Write some code",
        "Write a Python function that checks whether a string is a palindrome, with a short test.",
    ),
    "email": Starter(
        "Draft an email",
        "Draft a short, friendly email asking a colleague to review my report by Friday.",
    ),
    "meal": Starter("Plan a meal", "Give me three ideas for a quick, healthy weeknight dinner."),
    "names": Starter("Name something", "Suggest five names for a small neighbourhood bakery."),
    "story": Starter("Start a story", "Tell a short story about a lighthouse keeper and a cat."),
}
ALL = ("explain", "code", "email", "meal")  # a model the manifest does not describe
SHOWN = 4  # at most this many on the page


def unknown_starters(keys: tuple[str, ...]) -> list[str]:
    """The keys a manifest entry names that are no starter (a typo the manifest test finds)."""
    return [k for k in keys if k not in STARTERS]


def starters_for(keys: tuple[str, ...] | None) -> list[Starter]:
    """The starters of a model whose manifest entry names `keys` (None: not described)."""
    chosen = ALL if keys is None else keys
    return [STARTERS[k] for k in chosen if k in STARTERS][:SHOWN]
