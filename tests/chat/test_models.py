"""Which model a request names: the default, "auto", or an installed one."""

from __future__ import annotations

import pytest

from chatbox.chat.errors import UnknownModel
from chatbox.chat.models import AUTO, resolve_model
from tests.chat.fakes import FakeEngine, FakeModels

MODELS = FakeModels({"small": FakeEngine("small"), "large": FakeEngine("large")}, "small")


def test_no_model_named_means_the_default() -> None:
    assert resolve_model(MODELS, None) == "small"
    assert resolve_model(MODELS, "") == "small"


def test_an_installed_model_is_itself() -> None:
    assert resolve_model(MODELS, "large") == "large"


def test_auto_is_left_for_routing() -> None:
    assert resolve_model(MODELS, AUTO) == "auto"


def test_an_unknown_model_lists_the_available_ones() -> None:
    with pytest.raises(UnknownModel) as err:
        resolve_model(MODELS, "huge")
    assert err.value.name == "huge" and err.value.available == ["small", "large"]
    assert str(err.value) == "unknown model 'huge'; available models: small, large"


def test_a_default_that_is_not_installed_is_unknown_too() -> None:
    with pytest.raises(UnknownModel):
        resolve_model(FakeModels({"large": FakeEngine("large")}, "small"), None)
