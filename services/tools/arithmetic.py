"""The calculator's arithmetic, bounded so that no expression can take long (issue 37).

The model writes the expression, and Python's integers have no size limit: ``round(1, -3*10**7)``
computed 10**30000000 on the tool service's event loop, where the tool's 2 s timeout cannot interrupt
it, and the worker stopped serving. Two protections, each enough on its own for what it covers:

1. **Bounded arithmetic** (here). Every number, given or computed, is finite and within
   ±``MAX_MAGNITUDE`` (1e300, so an integer has at most ~1000 bits), checked before anything uses it;
   ``**`` is refused *before* it runs when its result would leave that range (estimated from the
   operands: ``|result| = |base| ** exponent``), and its exponent must be within ±``MAX_EXPONENT``;
   ``round``'s ndigits must be an integer within ±``MAX_NDIGITS`` (beyond the range it means nothing,
   and ``round(1, -n)`` computes 10**n); the math functions' ``OverflowError`` (``exp(1000)``),
   ``ValueError`` (``log(0)``, ``sqrt(-1)``) and ``ZeroDivisionError`` (``log(8, 1)``) are clear
   errors. So every operation works on numbers of a few hundred digits at most.
2. **A guard for what the first might miss** (services/tools/compute.py). ``cheap`` decides from the
   expression's text alone, without trusting the checks above, whether it can only be cheap: no
   ``**`` with a computed exponent or a base that is itself a power, no ``round`` with a computed
   ndigits. Then every number is bounded by the literals' sizes (at most 500 characters of them) and
   the expression is evaluated inline, in microseconds. Anything else is evaluated in a child process
   that a timeout kills (``GUARDED`` is what that child may run).

This module imports nothing of the worker's (no asyncio, no database driver), so that the guarded
child starts in a fraction of a second.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

Number = int | float

MAX_EXPRESSION = 500
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e300
MAX_NDIGITS = 300
#: log2(MAX_MAGNITUDE): a power whose result would be larger is refused before it is computed.
_MAX_LOG2 = math.log2(MAX_MAGNITUDE)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "log": math.log,
    "exp": math.exp, "sin": math.sin, "cos": math.cos, "tan": math.tan}
_CONSTANTS = {"pi": math.pi, "e": math.e}


class CalculationError(ValueError):
    """The expression is refused or cannot be evaluated; the message says why, for the model."""


def parse(expression: str) -> ast.expr:
    """The expression's syntax tree (``^`` read as ``**``); ``CalculationError`` if it is not one."""
    if len(expression) > MAX_EXPRESSION:
        raise CalculationError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        return ast.parse(expression.replace("^", "**"), mode="eval").body
    except SyntaxError as exc:
        raise CalculationError(f"not an arithmetic expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):  # NUL bytes; nesting the parser gives up on
        raise CalculationError("not an arithmetic expression") from None


def evaluate(expression: str) -> Number:
    """Arithmetic on numbers, + - * / // % ** (or ^), parentheses, and a few math functions.

    The expression is parsed to an AST and only those node types are evaluated: no names beyond the
    listed functions and constants, no attributes, no calls of anything else, no eval or exec. Bounded
    as the module docstring says; ``CalculationError`` for anything refused.
    """
    return evaluate_tree(parse(expression))


def evaluate_tree(tree: ast.expr) -> Number:
    """``evaluate`` of an expression ``parse`` returned."""
    try:
        return _eval(tree)
    except RecursionError:
        raise CalculationError("expression nested too deeply") from None


def cheap(expression: str, tree: ast.expr) -> bool:
    """Whether ``expression`` (``tree``, as ``parse`` returned it) is cheap whatever the values: no
    ``**`` and no ``round`` in the text, or every ``**`` has a literal exponent within
    ±MAX_EXPONENT and a base with no ``**`` in it, every ``round`` a literal ndigits within ±MAX_NDIGITS
    (or none). Without those, numbers only grow by the operations' operands (+ - * // % keep an integer
    within the sum of the literals' sizes; the math functions return floats), and one power of such a
    base is at most MAX_EXPONENT times that: a bounded amount of work even if a check above failed."""
    if "round" not in expression and "*" * 2 not in expression and "^" not in expression:
        return True  # (the usual case, decided without walking the tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = _literal(node.right)
            if exponent is None or abs(exponent) > MAX_EXPONENT:
                return False
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.left)):
                return False
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round":
            if len(node.args) > 1:
                ndigits = _literal(node.args[1])
                if not isinstance(ndigits, int) or abs(ndigits) > MAX_NDIGITS:
                    return False
    return True


def _literal(node: ast.expr) -> Number | None:
    """The value of a number written out (with a sign, if any), else None."""
    sign = 1
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        sign = -sign if isinstance(node.op, ast.USub) else sign
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return sign * node.value
    return None


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculationError("division by zero") from None
        except OverflowError:
            raise CalculationError("result out of range") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))  # (a number in range, negated, is in range)
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords):
        return _bounded(_call(node.func.id, [_eval(a) for a in node.args]))
    raise CalculationError(f"unsupported element in expression: {ast.dump(node)[:60]}")


def _bounded(value: Any) -> Number:
    """``value`` if it is a real, finite number within ±MAX_MAGNITUDE (so an int of ~1000 bits at most)."""
    if isinstance(value, complex):
        raise CalculationError("result is not a real number")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > MAX_MAGNITUDE:
        raise CalculationError("result out of range")
    return value


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse ``base ** exponent`` before computing it when its result would be out of range."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculationError(f"exponent larger than {MAX_EXPONENT}")
    if base != 0 and exponent * math.log2(abs(base)) > _MAX_LOG2:
        raise CalculationError("result out of range")


def _call(name: str, args: list[Number]) -> Any:
    if name == "round" and len(args) == 2:
        ndigits = args[1]
        if not isinstance(ndigits, int):
            raise CalculationError("round: ndigits must be an integer")
        if abs(ndigits) > MAX_NDIGITS:
            raise CalculationError(f"round: ndigits must be within ±{MAX_NDIGITS}")
    try:
        return _FUNCTIONS[name](*args)
    except OverflowError:
        raise CalculationError(f"{name}: result out of range") from None
    except ZeroDivisionError:
        raise CalculationError(f"{name}: division by zero") from None
    except (ValueError, TypeError) as exc:
        raise CalculationError(f"{name}: {exc}") from None


#: What the guarded child may run (services/tools/compute.py): JSON arguments in, a JSON value out.
GUARDED: dict[str, Callable[..., Any]] = {"evaluate": evaluate}
