"""Model routing: (tier, the model the user picked, an experiment arm) -> the model that answers."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from chatbox.chat.errors import UnknownModel
from chatbox.chat.models import AUTO
from chatbox.chat.policy import Canary, Policy, TierPolicy
from chatbox.store import User


@dataclass(frozen=True)
class Route:
    model: str
    reason: str  # pin | picked | auto-small | auto-large | canary | tier | default | degraded
    arm: str = ""  # the experiment arm ("" outside any canary)
    degraded_from: str | None = None  # the model this request would have used unloaded

    def degrade(self, fallback: str) -> Route:
        return Route(fallback, "degraded", self.arm, self.model)


CanaryState = Literal["running", "held", "promoted", "rolled_back"]


def always_running(arm: str) -> CanaryState:
    return "running"


class Router:
    """Pure rules over the policy and the models available now; no I/O. `canary_state`
    says what the admin (or the verdict) decided of each canary arm."""

    def __init__(
        self,
        policy: Policy,
        names: Callable[[], list[str]],
        default: Callable[[], str],
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.names = names
        self.default = default
        self.rng = rng or random.Random()
        self.canary_state: Callable[[str], CanaryState] = always_running
        # The policy file's canaries and those started at run time (the canary service's).
        self.canaries: Callable[[], tuple[Canary, ...]] = lambda: policy.routing.canaries

    def is_code_or_long(self, text: str) -> bool:
        rules = self.policy.routing
        return len(text) >= rules.auto_long_chars or any(
            marker in text for marker in rules.auto_code_markers
        )

    def expected(self, user: User, requested: str | None) -> str:
        """The model a turn of this user will most likely get: what the picker shows.

        No canary draw and no text to judge, so "auto" shows its small model.
        """
        available = self.names()
        tier = self.policy.tier(user.tier)
        pin = self.policy.routing.pins.get(user.name)
        if pin and pin in available:
            return pin
        if requested == AUTO:
            requested = self.policy.routing.small
        for name in (requested, self.promoted(tier.name, available) or tier.model):
            if _usable(name, available, tier):
                return str(name)
        return self.default()

    def route(self, user: User, requested: str | None, text: str = "") -> Route:
        available = self.names()
        tier = self.policy.tier(user.tier)

        def usable(name: str | None) -> bool:
            return _usable(name, available, tier)

        pin = self.policy.routing.pins.get(user.name)
        if pin and pin in available:
            return Route(pin, "pin")
        if requested == AUTO:
            rules = self.policy.routing
            if self.is_code_or_long(text) and usable(rules.large):
                return Route(str(rules.large), "auto-large")
            if usable(rules.small):
                return Route(str(rules.small), "auto-small")
            requested = None
        if requested:
            if requested not in available:
                raise UnknownModel(requested, available)
            if usable(requested):
                return Route(requested, "picked")
        else:
            promoted = self.promoted(tier.name, available)
            if promoted is not None:  # the tier's model now, until the policy names it
                return Route(promoted, "tier")
            for canary in self.canaries():
                if (
                    canary.tier == tier.name
                    and canary.model in available
                    and self.canary_state(canary.arm) in ("running", "held")
                    and self.rng.random() * 100 < canary.percent
                ):
                    return Route(canary.model, "canary", canary.arm)
        if usable(tier.model):
            return Route(str(tier.model), "tier")
        return Route(self.default(), "default")

    def inherited(self, user: User, model: str | None) -> str | None:
        """The model another member set on a shared (workspace) conversation, as this user's
        request: kept where this user's tier names it (its model, its list, "auto"), else
        None, so the user's own tier answers (a free member never gets a paid model)."""
        tier = self.policy.tier(user.tier)
        if model == AUTO or (model and (model == tier.model or model in tier.models)):
            return model
        return None

    def promoted(self, tier: str, available: list[str]) -> str | None:
        """The model of the tier's promoted canary, where one is and is installed."""
        for canary in self.canaries():
            if (
                canary.tier == tier
                and canary.model in available
                and self.canary_state(canary.arm) == "promoted"
            ):
                return canary.model
        return None


def _usable(name: str | None, available: list[str], tier: TierPolicy) -> bool:
    """A model that is installed and that the tier may use."""
    return bool(name) and name in available and (not tier.models or name in tier.models)
