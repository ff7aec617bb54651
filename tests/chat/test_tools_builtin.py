"""The calculator refuses what is not arithmetic (no eval, no huge numbers), and one answer's
tool session keeps the tier's budget and caches per conversation, or per user for a pure
tool, and nothing under zero-data-retention."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from chatbox.chat.tools.base import ToolContext
from chatbox.chat.tools.builtin import BuiltinToolbox, Calculator, CurrentTime
from chatbox.chat.tools.calculator import CalculatorError, calculate
from chatbox.chat.tools.loop import Budget, ToolSession
from chatbox.chat.tools.sandbox import Sandbox


@pytest.mark.parametrize(
    ("expression", "value"),
    [("2 + 3 * 4", 14), ("2^10", 1024), ("sqrt(16) + pi - pi", 4.0), ("factorial(5)", 120)],
)
def test_the_calculator_computes_arithmetic(expression: str, value: float) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        '__import__("os").system("id")',
        "(1).real",
        "open",
        "[1, 2]",
        "9 ** 9 ** 9",
        "(10 ** 4000) ** 9999",
        "factorial(100000)",
        "lambda: 1",
        "1 if 1 else 2",
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression: str) -> None:
    started = time.monotonic()
    with pytest.raises(CalculatorError):
        calculate(expression)
    assert time.monotonic() - started < 5


class Cache:
    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str, str]] = {}

    async def get(self, key: str, user_id: str) -> str | None:
        row = self.rows.get(key)
        return row[2] if row and row[0] == user_id else None

    async def put(
        self, key: str, user_id: str, conversation_id: str, tool: str, result: str
    ) -> None:
        self.rows[key] = (user_id, conversation_id, result)


def _context(conv: str = "c_1", user: str = "u_1") -> ToolContext:
    return ToolContext(user, conv, None, time.monotonic() + 60, "paid")


def _session(cache: Cache, keep: bool = True, calls: int = 4, **kw: Any) -> ToolSession:
    return ToolSession(
        [Calculator(), CurrentTime()], _context(**kw), Budget(calls, 30.0), cache, keep
    )


def test_a_pure_tool_is_cached_per_user_and_an_unpure_one_not_at_all() -> None:
    cache = Cache()

    async def run() -> None:
        first = await _session(cache).call("a", "calculator", '{"expression": "6*7"}')
        assert first.result.text == "42" and not first.cached
        [(user, conv, _)] = cache.rows.values()
        assert (user, conv) == ("u_1", "c_1")  # the conversation's, erased with it
        again = await _session(cache, conv="c_2").call("b", "calculator", '{"expression":"6*7"}')
        assert again.cached and again.result.text == "42"  # found from the user's others
        other = await _session(cache, user="u_2").call("c", "calculator", '{"expression":"6*7"}')
        assert not other.cached  # another user's cache is not this one's
        await _session(cache).call("d", "current_time", "{}")
        assert len(cache.rows) == 2  # the time is never cached

    asyncio.run(run())


def test_zero_retention_caches_nothing_and_errors_are_not_cached() -> None:
    cache = Cache()

    async def run() -> None:
        await _session(cache, keep=False).call("a", "calculator", '{"expression": "1+1"}')
        bad = await _session(cache).call("b", "calculator", '{"expression": "x"}')
        assert bad.result.is_error
        assert cache.rows == {}

    asyncio.run(run())


def test_the_budget_closes_the_session() -> None:
    async def run() -> None:
        session = _session(Cache(), calls=2)
        for n in range(2):
            assert session.open
            await session.call(str(n), "current_time", "{}")
        assert not session.open
        missing = await _session(Cache()).call("x", "no_such", "{}")
        assert missing.result.is_error and "no tool named" in missing.result.text

    asyncio.run(run())


def test_the_code_interpreter_is_offered_by_tier_and_memory_not_in_workspaces() -> None:
    async def recall(user: str, query: str, k: int) -> list[str]:
        return []

    box = BuiltinToolbox(recall=recall, sandbox=None, code_enabled=lambda tier: tier == "paid")

    async def names(ws: str | None) -> list[str]:
        ctx = ToolContext("u", "c", ws, time.monotonic() + 5, "paid")
        return [t.spec.name for t in await box.tools(ctx)]

    assert "recall_memory" in asyncio.run(names(None))
    assert "recall_memory" not in asyncio.run(names("w_1"))
    box.sandbox = Sandbox()
    assert "run_python" in asyncio.run(names(None))
    box.code_enabled = lambda tier: False
    assert "run_python" not in asyncio.run(names(None))
