"""``@tool`` keeps the decorated function's type: mypy checks callers of a tool against its signature.

mypy runs (through ``mypy.api``) on small programs that use tools; its cache lives in pytest's cache
directory, so only the first run is slow (~10 s; later ones take well under a second).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agentstream.services.tools.registry import Tool, tool

mypy_api = pytest.importorskip("mypy.api")

REPO = Path(__file__).resolve().parents[2]

TOOLS = """
from collections.abc import Awaitable
from typing import assert_type

from agentstream.services.tools.registry import Tool, ToolContext, tool


@tool(description="Add two numbers.", timeout_s=2.0)
async def add(a: float, b: float = 1.0) -> float:
    return a + b


@tool
async def search(query: str, ctx: ToolContext) -> list[str]:
    return [query, ctx.run_id]
"""

#: Must type-check cleanly. The ignores are needed only while the signature is kept (with
#: --warn-unused-ignores, a tool typed as Any would make each of them an error).
CALLERS = TOOLS + """

def keeps(t: Tool[[float, float], float]) -> None: ...


from agentstream import tool as public_tool  # what the README shows


@public_tool(description="Refund an order.", requires_approval=True)
async def refund(order_id: str, amount: float) -> str:
    return f"refunded {amount} on {order_id}"


async def callers(ctx: ToolContext) -> None:
    assert_type(add(1.0, 2.0), Awaitable[float])
    assert_type(await add(1.0), float)
    assert_type(await add.fn(1.0, b=2.0), float)
    assert_type(await search("q", ctx), list[str])
    assert_type(await search.call({"query": "q"}, ctx), list[str])
    keeps(add)
    add("one")  # type: ignore[arg-type]
    add(1.0, c=2.0)  # type: ignore[call-arg]
    search("q")  # type: ignore[call-arg]
    keeps(search)  # type: ignore[arg-type]
    assert_type(await refund("o-1", 2.5), str)
    refund("o-1", "2.5")  # type: ignore[arg-type]
"""


def mypy(tmp_path: Path, cache: Path, source: str) -> tuple[int, str]:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(source))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")  # not the project's configuration: only this program's errors count
    stdout, stderr, status = mypy_api.run([
        "--config-file", str(config), "--cache-dir", str(cache), "--python-version", "3.11",
        "--follow-imports", "silent", "--warn-unused-ignores", "--show-error-codes", "--no-error-summary",
        str(program)])
    return status, stdout + stderr


@pytest.fixture
def cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(REPO)  # agentstream resolves to this checkout
    pytest_cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    return Path(pytest_cache.mkdir("mypy-typing")) if pytest_cache is not None else tmp_path_factory.mktemp("mypy")


@pytest.mark.slow
def test_tool_keeps_the_function_signature_for_callers(tmp_path: Path, cache: Path) -> None:
    status, output = mypy(tmp_path, cache, CALLERS + "\nreveal_type(add)\n")
    assert "Revealed type is \"agentstream.services.tools.registry.Tool[[a: float, b: float =], float]\"" in output
    assert status == 0, output


@pytest.mark.slow
def test_a_wrong_call_of_a_tool_is_a_type_error(tmp_path: Path, cache: Path) -> None:
    status, output = mypy(tmp_path, cache, TOOLS + "\n\nasync def wrong() -> str:\n    return await add(2.0)\n")
    assert status == 1 and "Incompatible return value type (got \"float\", expected \"str\")" in output, output


async def test_a_tool_called_directly_runs_its_function() -> None:
    @tool(description="Add two numbers.")
    async def add(a: float, b: float = 1.0) -> float:
        return a + b

    assert isinstance(add, Tool) and add.name == "add"
    assert await add(2.0) == 3.0 and await add(2.0, b=3.0) == 5.0
