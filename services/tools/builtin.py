"""Built-in tools."""

from __future__ import annotations

import ast
import math
import operator

from services.tools.registry import ToolError, tool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "log": math.log,
              "exp": math.exp, "sin": math.sin, "cos": math.cos, "tan": math.tan}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_EXPRESSION = 500
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e300


def evaluate(expression: str) -> float | int:
    """Arithmetic on numbers, + - * / // % ** (or ^), parentheses, and a few math functions.

    The expression is parsed to an AST and only those node types are evaluated: no names beyond the
    listed functions and constants, no attributes, no calls of anything else, no eval or exec.
    """
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ToolError("result out of range")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords):
        try:
            return _FUNCTIONS[node.func.id](*[_eval(a) for a in node.args])
        except (ValueError, TypeError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
    raise ToolError(f"unsupported element in expression: {ast.dump(node)[:60]}")


@tool(description="Evaluate an arithmetic expression, e.g. '17 * 23' or 'sqrt(2) / 3'.", timeout_s=2.0)
async def calculator(expression: str) -> float | int:
    return evaluate(expression)
