"""A calculator for the assistant: arithmetic by walking the expression's syntax tree.

Nothing is evaluated but numbers, the arithmetic operators and a short list of math
functions and constants; exponents and results are bounded so no expression can take the
process's CPU or memory (`2 ** 10 ** 10` is refused, not computed)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_CHARS = 500
MAX_POWER = 10_000  # the largest exponent of an integer power
MAX_DIGITS = 4_300  # the largest integer (Python's own str() limit)
_MAX_BITS = int(MAX_DIGITS * 3.33)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    name: getattr(math, name)
    for name in (
        "sqrt",
        "exp",
        "log",
        "log10",
        "log2",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "floor",
        "ceil",
        "degrees",
        "radians",
        "hypot",
        "gcd",
        "lcm",
    )
} | {"abs": abs, "round": round, "min": min, "max": max}
_FUNCTIONS["factorial"] = lambda n: math.factorial(_small(n, 1000))
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf}


class CalculatorError(ValueError):
    """An expression the calculator does not compute (the message says why)."""


def _small(n: Any, limit: int) -> Any:
    if isinstance(n, int) and abs(n) > limit:
        raise CalculatorError(f"{n} is too large here (at most {limit})")
    return n


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalculatorError for anything else."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is over {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an expression: {exc.msg}") from None
    try:
        value = _eval(tree.body)
    except (ArithmeticError, ValueError, TypeError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(str(exc) or type(exc).__name__) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError("the result is not a number")
    return value


def _eval(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        raise CalculatorError(f"{node.value!r} is not a number")
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        op = _BINARY.get(type(node.op))
        if op is None:
            raise CalculatorError(f"the operator {type(node.op).__name__} is not supported")
        return _bounded(op(left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None:
            raise CalculatorError(f"unknown function {node.func.id!r}")
        return _bounded(fn(*[_eval(a) for a in node.args]))
    raise CalculatorError(f"{type(node).__name__} is not arithmetic")


def _power(base: Any, exp: Any) -> Any:
    if isinstance(exp, int) and abs(exp) > MAX_POWER and abs(base) > 1:
        raise CalculatorError(f"the exponent {exp} is too large (at most {MAX_POWER})")
    if isinstance(base, int) and isinstance(exp, int) and base.bit_length() * exp > _MAX_BITS:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    return _bounded(base**exp)


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    return value
