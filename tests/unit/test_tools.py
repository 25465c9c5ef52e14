import asyncio
import json
import re
import time

import pytest
from aiohttp import web

from agentstream.services.tools.builtin import BuiltinConfig, builtin_tools, calculator, evaluate, tools_for
from agentstream.services.tools.http import HttpGetConfig, _refused_address, fetch, http_get_tool
from agentstream.services.tools.registry import ToolContext, load_tools, tool
from agentstream.services.tools.sql import SqlQueryConfig, _result
from agentstream.streams.core.errors import ConfigError, ToolArgumentError, ToolError


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
        tool(lambda x: x)

    async def untyped(x):
        return x

    with pytest.raises(TypeError, match="type hint"):
        tool(untyped)


def test_load_tools_from_modules():
    names = {t.name for t in load_tools("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")}
    assert {"calculator", "effect", "sleep"} <= names
    with pytest.raises(ValueError, match="no tools"):
        load_tools("json")


# -- retries ------------------------------------------------------------------------------------------

def test_retry_settings_and_backoff():
    @tool(max_attempts=4, backoff_s=0.1, max_backoff_s=0.3, retry_on_timeout=True)
    async def repeatable(x: int) -> int:
        return x

    assert (repeatable.max_attempts, repeatable.retry_on_timeout) == (4, True)
    for attempt, cap in [(1, 0.1), (2, 0.2), (3, 0.3), (10, 0.3)]:
        assert cap / 2 <= repeatable.backoff(attempt) <= cap  # exponential, capped, jittered down to half
    assert calculator.max_attempts == 1 and not calculator.retry_on_timeout  # one attempt unless a tool says so
    with pytest.raises(ValueError, match="max_attempts"):
        tool(max_attempts=0)(repeatable.fn)


def test_only_tools_that_say_so_are_idempotent():
    @tool
    async def refund(order_id: str) -> str:
        return order_id

    assert not refund.idempotent  # at most once per step unless the tool says running it twice is harmless
    config = BuiltinConfig(http_get=HttpGetConfig(allowed_hosts=("example.com",)))
    assert {t.name: t.idempotent for t in builtin_tools(config)} == {
        "calculator": True, "sql_query": True, "retrieve": True, "http_get": True}


# -- which built-ins a worker serves ------------------------------------------------------------------

def test_http_get_is_off_unless_hosts_are_allowed():
    assert {t.name for t in load_tools("agentstream.services.tools.builtin")} == {"calculator", "sql_query", "retrieve"}
    assert {t.name for t in builtin_tools()} == {"calculator", "sql_query", "retrieve"}
    assert BuiltinConfig.from_env({}).http_get is None
    assert BuiltinConfig.from_env({"AGENTSTREAM_HTTP_ALLOWED_HOSTS": " , "}).http_get is None
    config = BuiltinConfig.from_env({"AGENTSTREAM_HTTP_ALLOWED_HOSTS": "Example.COM., api.example.org",
                                     "AGENTSTREAM_HTTP_MAX_BYTES": "5000", "AGENTSTREAM_SQL_MAX_ROWS": "7"})
    assert config.http_get is not None and config.http_get.allowed_hosts == {"example.com", "api.example.org"}
    assert config.http_get.max_bytes == 5000 and not config.http_get.allow_private
    assert config.sql_query is not None and config.sql_query.max_rows == 7
    assert [t.name for t in builtin_tools(config)] == ["calculator", "sql_query", "retrieve", "http_get"]
    assert [t.name for t in builtin_tools(BuiltinConfig(sql_query=None, retrieve=None))] == ["calculator"]
    with pytest.raises(ConfigError, match="AGENTSTREAM_HTTP_TIMEOUT_S"):
        BuiltinConfig.from_env({"AGENTSTREAM_HTTP_ALLOWED_HOSTS": "a.example", "AGENTSTREAM_HTTP_TIMEOUT_S": "soon"})


def test_tools_for_replaces_the_builtin_module_with_the_configured_builtins():
    config = BuiltinConfig(http_get=HttpGetConfig(allowed_hosts=frozenset({"example.com"})))
    names = [t.name for t in tools_for(["agentstream.services.tools.builtin", "tests.integration.pipeline_tools"], config)]
    assert names[:4] == ["calculator", "sql_query", "retrieve", "http_get"] and "effect" in names
    assert "calculator" not in {t.name for t in tools_for(["tests.integration.pipeline_tools"], config)}


def test_sql_results_are_cut_to_their_budget():
    rows = [json.dumps({"id": i, "text": "x" * 50}) for i in range(6)]
    result = _result(rows, SqlQueryConfig(max_rows=5, max_result_chars=300))
    assert result["columns"] == ["id", "text"] and result["truncated"] and result["truncated_by"] == "chars"
    assert 1 <= result["row_count"] < 5 and len(json.dumps(result)) <= 300
    assert _result([], SqlQueryConfig()) == {"columns": [], "rows": [], "row_count": 0, "truncated": False,
                                             "truncated_by": None}
    with pytest.raises(ValueError, match="identifier"):
        SqlQueryConfig(role="x; DROP TABLE runs")


def test_sql_results_say_which_limit_postgresql_stopped_at():
    rows = [json.dumps({"id": i}) for i in range(3)]
    assert _result(rows, SqlQueryConfig(), None)["truncated_by"] is None
    stopped = _result(rows, SqlQueryConfig(), "rows")
    assert stopped["truncated"] and stopped["truncated_by"] == "rows" and stopped["row_count"] == 3
    cut = _result([*rows, json.dumps({"id": 3, "text": "abc…"})], SqlQueryConfig(), "bytes")
    assert cut["truncated"] and cut["truncated_by"] == "bytes" and cut["rows"][-1] == [3, "abc…"]
    assert _result([], SqlQueryConfig(), "bytes") == {"columns": [], "rows": [], "row_count": 0, "truncated": True,
                                                      "truncated_by": "bytes"}


def test_sql_limits_from_the_environment():
    config = BuiltinConfig.from_env({"AGENTSTREAM_SQL_MAX_BYTES": "5000", "AGENTSTREAM_SQL_POOL_SIZE": "3"})
    assert config.sql_query is not None and (config.sql_query.max_bytes, config.sql_query.pool_size) == (5000, 3)
    assert BuiltinConfig.from_env({}).sql_query == SqlQueryConfig()
    for name, bad, says in (("AGENTSTREAM_SQL_MAX_BYTES", "lots", "AGENTSTREAM_SQL_MAX_BYTES"),
                            ("AGENTSTREAM_SQL_MAX_BYTES", "10", r"max_bytes \(100 or more\)"),
                            ("AGENTSTREAM_SQL_POOL_SIZE", "0", "AGENTSTREAM_SQL_POOL_SIZE")):
        with pytest.raises(ConfigError, match=says):
            BuiltinConfig.from_env({name: bad})


async def test_sql_query_never_runs_on_the_tool_services_own_pool():
    sql_query = builtin_tools()[1]
    assert sql_query.name == "sql_query"
    service_pool = object()  # would be used, and fail differently, if the tool fell back to it
    with pytest.raises(ToolError, match="its own database pool"):
        await sql_query.call({"query": "SELECT 1"}, ToolContext("r", "r:1:tool", service_pool))  # type: ignore[arg-type]


# -- http_get -----------------------------------------------------------------------------------------

@pytest.fixture
async def server():
    """A local HTTP server on 127.0.0.1 (allowed explicitly by the tests' configurations)."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello world", content_type="text/plain")

    async def long(request: web.Request) -> web.Response:
        return web.Response(text="é" * 100, content_type="text/html")

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000, content_type="application/octet-stream")

    async def big_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # no Content-Length: the limit must hold while reading
        await response.prepare(request)
        for _ in range(50):
            await response.write(b"y" * 200)
        return response

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def missing(request: web.Request) -> web.Response:
        return web.Response(status=404, text="no such page")

    def redirect(to: str):
        async def handler(request: web.Request) -> web.Response:
            raise web.HTTPFound(to.format(port=request.url.port))
        return handler

    app = web.Application()
    app.add_routes([web.get("/hello", hello), web.get("/long", long), web.get("/big", big),
                    web.get("/big-stream", big_stream), web.get("/slow", slow), web.get("/missing", missing),
                    web.get("/to-hello", redirect("/hello")),
                    web.get("/to-localhost", redirect("http://localhost:{port}/hello")),
                    web.get("/to-file", redirect("file:///etc/passwd")),
                    web.get("/loop", redirect("/loop"))])
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


LOCAL = HttpGetConfig(allowed_hosts=frozenset({"127.0.0.1"}), allow_private=True, max_bytes=1000,
                      max_text_chars=50, timeout_s=1.0)


async def test_http_get_fetches_from_an_allowed_host(server):
    result = await fetch(f"{server}/hello", LOCAL)
    assert result == {"url": f"{server}/hello", "status": 200, "content_type": "text/plain", "text": "hello world",
                      "truncated": False}
    assert (await fetch(f"{server}/to-hello", LOCAL))["url"] == f"{server}/hello"  # a redirect within the allowlist
    assert (await fetch(f"{server}/missing", LOCAL))["status"] == 404  # a status is a result, not an error
    long = await fetch(f"{server}/long", LOCAL)
    assert long["text"] == "é" * 50 and long["truncated"]
    tool_ = http_get_tool(LOCAL)
    assert tool_.name == "http_get" and tool_.max_attempts == 2 and tool_.retry_on_timeout
    assert (await tool_.call({"url": f"{server}/hello"}, ToolContext("r", "r:1:tool")))["text"] == "hello world"


@pytest.mark.parametrize("url,reason", [
    ("ftp://127.0.0.1/file", "scheme 'ftp'"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("/hello", "scheme '(none)'"),
    ("//127.0.0.1/hello", "scheme '(none)'"),
    ("http://example.com/", "not on this worker's allowlist"),
    ("http://127.0.0.1.nip.io/", "not on this worker's allowlist"),   # no suffix matching
    ("http://example.com#@127.0.0.1/", "not on this worker's allowlist"),
    ("http://user:secret@127.0.0.1/", "user name or password"),
])
async def test_http_get_refuses_urls_outside_the_rules(url, reason):
    with pytest.raises(ToolError, match=re.escape(reason)) as info:
        await fetch(url, LOCAL)
    assert not info.value.retriable


async def test_http_get_refuses_private_addresses_unless_allowed(server):
    port = server.rsplit(":", 1)[1]
    strict = HttpGetConfig(allowed_hosts=frozenset({"127.0.0.1", "localhost", "169.254.169.254", "10.1.2.3"}))
    for url, reason in [(f"http://127.0.0.1:{port}/hello", "loopback"), ("http://169.254.169.254/latest/", "link-local"),
                        ("http://10.1.2.3/", "private"),
                        (f"http://localhost:{port}/hello", "localhost resolves to")]:  # checked when resolving
        with pytest.raises(ToolError, match=reason):
            await fetch(url, strict)
    assert _refused_address("8.8.8.8") is None
    assert _refused_address("100.64.0.1") and _refused_address("::ffff:127.0.0.1") and _refused_address("fe80::1")


async def test_http_get_refuses_bad_redirects_big_bodies_and_slow_servers(server):
    with pytest.raises(ToolError, match="host 'localhost' is not on this worker's allowlist"):
        await fetch(f"{server}/to-localhost", LOCAL)
    with pytest.raises(ToolError, match="scheme 'file'"):
        await fetch(f"{server}/to-file", LOCAL)
    with pytest.raises(ToolError, match="more than 3 redirects"):
        await fetch(f"{server}/loop", LOCAL)
    with pytest.raises(ToolError, match="5000 bytes, over the limit of 1000"):
        await fetch(f"{server}/big", LOCAL)
    with pytest.raises(ToolError, match="over the limit of 1000 bytes"):
        await fetch(f"{server}/big-stream", LOCAL)
    t0 = time.monotonic()
    with pytest.raises(ToolError, match=r"timed out after 1 s") as info:
        await fetch(f"{server}/slow", LOCAL)
    assert info.value.retriable and time.monotonic() - t0 < 2
