import pytest

from services.tools.builtin import evaluate
from services.tools.registry import ToolArgumentError, ToolContext, ToolError, load_tools, tool


@pytest.mark.parametrize("expression,value", [
    ("17 * 23", 391), ("2 ** 10", 1024), ("2 ^ 3", 8), ("(1 + 2) * -3", -9), ("7 // 2", 3), ("7 % 4", 3),
    ("sqrt(16) + abs(-2)", 6.0), ("round(pi, 2)", 3.14),
])
def test_calculator_evaluates(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('id')", "open('/etc/passwd')", "().__class__", "x", "1/0", "9 ** 9 ** 9",
    "lambda: 1", "[1, 2]", "'a' * 3", "1" * 600,
])
def test_calculator_refuses(expression):
    with pytest.raises(ToolError):
        evaluate(expression)


async def test_schema_derived_from_hints_and_arguments_validated():
    @tool(description="Scale a number.")
    async def scale(value: float, factor: int = 2, label: str | None = None, ctx: ToolContext | None = None) -> float:
        return value * factor

    assert scale.parameters == {
        "type": "object",
        "properties": {"value": {"type": "number"}, "factor": {"type": "integer"}, "label": {"type": "string"}},
        "required": ["value"],
    }
    assert scale.validate({"value": 3}) == {"value": 3}
    for bad, message in [({}, "missing"), ({"value": "3"}, "type number"), ({"value": 1, "x": 2}, "unknown"),
                         ({"value": True}, "type number"), ([1], "JSON object")]:
        with pytest.raises(ToolArgumentError, match=message):
            scale.validate(bad)


def test_context_parameter_is_not_in_the_schema():
    @tool
    async def needs_context(query: str, ctx: ToolContext) -> str:
        return query

    assert needs_context.context_param == "ctx"
    assert list(needs_context.parameters["properties"]) == ["query"]


def test_tools_must_be_async_and_typed():
    with pytest.raises(TypeError, match="async"):
        tool(lambda x: x)  # type: ignore[arg-type]

    async def untyped(x):
        return x

    with pytest.raises(TypeError, match="type hint"):
        tool(untyped)


def test_load_tools_from_modules():
    names = {t.name for t in load_tools("services.tools.builtin", "tests.integration.pipeline_tools")}
    assert {"calculator", "effect", "sleep"} <= names
    with pytest.raises(ValueError, match="no tools"):
        load_tools("json")
