"""The tool service on the real broker and database: argument errors, timeouts, retries with backoff,
exhausted retries (a failed step and a dead letter), the read-only ``sql_query``, ``retrieve`` through
events, and a tool worker killed with ``kill -9`` mid-execution (the tool does not run again).

A tool outside the task's allowlist is refused by the planner before any tool service sees it:
tests/integration/test_pipeline.py::test_unparseable_and_disallowed_replies_are_handled; and by the tool
service when a request is published to its topic by anyone else: tests/integration/test_forged_tool_calls.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import TopicPartition

from agentstream.services.tools.sql import SqlQueryConfig, run_query
from agentstream.services.worker import WorkerOptions
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.core.errors import ToolError
from agentstream.streams.core.events import DeadLetter, ToolCallRequested
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.store import db
from agentstream.testing import Pipeline, end_offsets, isolated, read_events
from tests.integration.tool_fixtures import RUNS_TABLE

pytestmark = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("tests.integration.tool_fixtures",)


@pytest.fixture(scope="module")
def runs_table(database_url: str) -> str:
    async def create() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(f"""CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
                id serial PRIMARY KEY, key text NOT NULL, step_id text NOT NULL, attempt int NOT NULL,
                at timestamptz NOT NULL DEFAULT now())""")
        finally:
            await conn.close()

    asyncio.run(create())
    return RUNS_TABLE


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table, runs_table):
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS)
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), options) as pipeline:
        yield pipeline


async def _tool_step(pipe, task: str, tools: list[str], timeout: float = 30) -> tuple[str, dict]:
    """Run ``task`` (a tool directive, then an answer); return the run's id and its tool step."""
    run_id = await pipe.client.submit(task, tools=tools, max_steps=4)
    result = await pipe.client.wait(run_id, timeout=timeout)
    assert result.ok, result  # a failed tool is the model's business: the scripted model answers anyway
    status = await pipe.client.status(run_id)
    steps = [s for s in status["steps"] if s["kind"] == "tool"]
    assert len(steps) == 1, status["steps"]
    return run_id, steps[0]


async def _tool_call(pipe, run_id: str) -> asyncpg.Record | None:
    """The run's row in ``tool_calls`` (the idempotency record)."""
    pool = await pipe.client.pool()
    return await pool.fetchrow(
        "SELECT step_id, status, attempts, error, error_kind FROM tool_calls WHERE run_id = $1", run_id)


async def test_invalid_arguments_are_an_error_result_and_nothing_runs(pipe):
    key = uuid.uuid4().hex
    run_id, step = await _tool_step(
        pipe, f'[[tool:flaky {{"key": "{key}", "failures": "two"}}]] [[answer:done]]', ["flaky"])
    assert step["status"] == "failed"
    assert "invalid arguments" in step["error"] and "'failures'" in step["error"] and "integer" in step["error"]
    assert await _tool_call(pipe, run_id) is None  # refused before the idempotency row: nothing ran

    _, step = await _tool_step(pipe, '[[tool:slow {"seconds": 1, "extra": true}]] [[answer:done]]', ["slow"])
    assert step["status"] == "failed" and "unknown argument(s) extra" in step["error"]


async def test_a_tool_past_its_time_limit_fails_without_retry(pipe):
    t0 = time.monotonic()
    run_id, step = await _tool_step(pipe, '[[tool:slow {"seconds": 5}]] [[answer:done]]', ["slow"])
    assert time.monotonic() - t0 < 3.5
    assert step["status"] == "failed" and step["error"] == "slow timed out after 0.5 s"
    row = await _tool_call(pipe, run_id)
    assert (row["status"], row["attempts"], row["error_kind"]) == ("failed", 1, "timeout")


async def test_retriable_failures_are_retried_with_backoff_then_succeed(pipe):
    key = uuid.uuid4().hex
    run_id, step = await _tool_step(
        pipe, f'[[tool:flaky {{"key": "{key}", "failures": 2}}]] [[answer:done]]', ["flaky"])
    assert step["status"] == "completed", step
    assert json.loads(step["result"]["result"]) == "ok after 3 executions"
    pool = await pipe.client.pool()
    runs = await pool.fetch(f"SELECT attempt, at FROM {RUNS_TABLE} WHERE key = $1 ORDER BY id", key)
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    gaps = [(b["at"] - a["at"]).total_seconds() for a, b in itertools.pairwise(runs)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04, gaps  # backoff 0.05 s, then 0.1 s (jitter: half to all of it)
    row = await _tool_call(pipe, run_id)
    assert (row["status"], row["attempts"], row["error"]) == ("succeeded", 3, None)


async def test_an_idempotent_tool_is_retried_and_answered_without_a_tool_calls_row(pipe):
    key = uuid.uuid4().hex
    run_id, step = await _tool_step(
        pipe, f'[[tool:flaky_read {{"key": "{key}", "failures": 2}}]] [[answer:done]]', ["flaky_read"])
    assert step["status"] == "completed", step
    assert json.loads(step["result"]["result"]) == "ok after 3 executions"
    pool = await pipe.client.pool()
    runs = await pool.fetch(f"SELECT attempt FROM {RUNS_TABLE} WHERE key = $1 ORDER BY id", key)
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    assert await _tool_call(pipe, run_id) is None  # checked against the run, never claimed or finished


async def test_exhausted_retries_fail_the_step_and_dead_letter_the_request(pipe):
    topics = pipe.worker.runtime.topics
    dlq = TopicPartition(topics.dlq, 0)
    start = (await end_offsets(pipe.settings, [dlq]))[dlq]
    key = uuid.uuid4().hex
    run_id, step = await _tool_step(
        pipe, f'[[tool:flaky {{"key": "{key}", "failures": 10}}]] [[answer:done]]', ["flaky"])
    assert step["status"] == "failed"
    assert step["error"] == "failed after 3 attempts: transient failure 3 of 10"
    pool = await pipe.client.pool()
    assert await pool.fetchval(f"SELECT count(*) FROM {RUNS_TABLE} WHERE key = $1", key) == 3
    row = await _tool_call(pipe, run_id)
    assert (row["status"], row["attempts"], row["error_kind"]) == ("failed", 3, "retries_exhausted")

    letters = [m for m in await read_events(pipe.settings, dlq, start, expect=1) if m.run_id == run_id]
    assert len(letters) == 1, letters
    letter = letters[0]
    assert isinstance(letter, DeadLetter) and letter.error_kind == "retries_exhausted"
    assert letter.consumer == "tools" and letter.source_topic == topics.tool_requests
    assert letter.reason == step["error"]
    request = codec_for(pipe.settings).decode(letter.value)
    assert isinstance(request, ToolCallRequested) and request.step_id == row["step_id"]


async def test_sql_query_reads_documents_and_refuses_writes_through_the_pipeline(pipe):
    _, step = await _tool_step(pipe, '[[tool:sql_query {"query": "DELETE FROM documents"}]] [[answer:done]]',
                               ["sql_query"])
    assert step["status"] == "failed" and "only one read-only query" in step["error"], step
    _, step = await _tool_step(pipe, '[[tool:sql_query {"query": "SELECT 6 * 7 AS answer"}]] [[answer:done]]',
                               ["sql_query"])
    assert step["status"] == "completed", step
    assert json.loads(step["result"]["result"]) == {"columns": ["answer"], "rows": [[42]], "row_count": 1,
                                                    "truncated": False, "truncated_by": None}
    # sql_query runs on a pool of its own, never on the one the tool service records its calls with.
    worker = pipe.worker
    assert worker.query_pool is not None and worker.query_pool is not worker.pool
    assert worker.query_pool.get_max_size() == SqlQueryConfig().pool_size


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def one_connection(database_url):
    """A pool of one connection: session state leaking from one query would show in the next."""
    pool = await db.create_pool(database_url, min_size=1, max_size=1)
    yield pool
    await pool.close()


@pytest.mark.parametrize("query", [
    "INSERT INTO documents (content, content_hash) VALUES ('x', 'x')",
    "UPDATE documents SET content = 'x'",
    "DELETE FROM documents",
    "CREATE TABLE sql_tool_was_here (a int)",
    "SELECT 1; DELETE FROM documents",
    "WITH gone AS (DELETE FROM documents RETURNING id) SELECT * FROM gone",
    "SELECT nextval('documents_id_seq')",
])
async def test_sql_query_cannot_write(one_connection, query):
    before = await one_connection.fetchval("SELECT count(*) FROM documents")
    with pytest.raises(ToolError) as info:
        await run_query(one_connection, query, SqlQueryConfig())
    assert "read-only" in str(info.value) or "permission denied" in str(info.value), info.value
    assert await one_connection.fetchval("SELECT count(*) FROM documents") == before
    assert await one_connection.fetchval("SELECT to_regclass('sql_tool_was_here')") is None


@pytest.mark.parametrize("query", [
    "SELECT * FROM tool_calls",
    "SELECT * FROM runs",
    # Leave the role, then read through dynamic SQL: refused inside the SECURITY DEFINER function.
    "SELECT * FROM ts_stat(coalesce(nullif(set_config('role', 'none', true), 'none'), "
    "'SELECT to_tsvector(tool) FROM tool_calls'))",
    "SELECT set_config('session_authorization', 'postgres', true)",
])
async def test_sql_query_reads_nothing_but_documents(one_connection, query):
    with pytest.raises(ToolError, match=r"permission denied|cannot set parameter"):
        await run_query(one_connection, query, SqlQueryConfig())


async def test_sql_query_time_and_row_limits_and_json(one_connection):
    config = SqlQueryConfig(statement_timeout_s=0.5, max_rows=3)
    t0 = time.monotonic()
    with pytest.raises(ToolError, match=r"time limit of 0\.5 s"):
        await run_query(one_connection, "SELECT pg_sleep(5)", config)
    # Switching the timeout off from inside does not disarm it.
    with pytest.raises(ToolError, match="time limit"):
        await run_query(one_connection, "SELECT set_config('statement_timeout', '0', false), pg_sleep(5)", config)
    assert time.monotonic() - t0 < 3

    rows = await run_query(one_connection, "SELECT g FROM generate_series(1, 1000) g", config)
    assert rows == {"columns": ["g"], "rows": [[1], [2], [3]], "row_count": 3, "truncated": True,
                    "truncated_by": "rows"}

    typed = await run_query(one_connection, """SELECT DATE '2024-02-29' AS d, TIMESTAMPTZ '2024-02-29 12:00Z' AS t,
        12345678901234.5678::numeric AS n, 2.5::numeric AS exact, 'NaN'::numeric AS nan, '7d444840-9dc0-11d1-b245-5ffdce74fad2'::uuid AS u,
        '\\x00ff'::bytea AS b, '{"a": [1]}'::jsonb AS j, NULL::text AS nothing, 1 AS dup, 2 AS dup""", config)
    assert typed["columns"] == ["d", "t", "n", "exact", "nan", "u", "b", "j", "nothing", "dup", "dup"]
    assert typed["rows"] == [["2024-02-29", "2024-02-29T12:00:00+00:00", "12345678901234.5678", 2.5, "NaN",
                              "7d444840-9dc0-11d1-b245-5ffdce74fad2", "\\x00ff", {"a": [1]}, None, 1, 2]]
    json.dumps(typed)


@pytest.mark.slow
async def test_a_50_mb_value_is_cut_inside_postgresql_and_never_reaches_the_worker(one_connection):
    collection = f"big-{uuid.uuid4().hex[:8]}"
    size = 50 * 1024 * 1024
    await one_connection.execute(  # made in the server: the test does not send 50 MB either
        "INSERT INTO documents (collection, content, content_hash) VALUES ($1, repeat('x', $2), 'big'), "
        "($1, 'small', 'small')", collection, size)
    try:
        assert await one_connection.fetchval(
            "SELECT octet_length(content) FROM documents WHERE collection = $1 AND content_hash = 'big'",
            collection) == size  # the premise
        config = SqlQueryConfig(statement_timeout_s=30)
        query = (f"SELECT id, content FROM documents WHERE collection = '{collection}' "
                 "ORDER BY content_hash DESC")  # 'small' first, then the 50 MB row
        tracemalloc.start()
        try:
            result = await run_query(one_connection, query, config)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 * 1024 * 1024, f"{peak} bytes allocated while reading: the value crossed the wire"
        assert result["truncated"] is True and result["truncated_by"] == "bytes", result["truncated_by"]
        assert result["columns"] == ["id", "content"] and result["row_count"] == 2
        assert result["rows"][0][1] == "small"
        cut = result["rows"][1][1]
        assert cut.startswith("xxxx") and cut.endswith("…") and 1000 < len(cut) < config.max_bytes
        assert len(json.dumps(result)) <= config.max_result_chars

        # The big row first: it comes back cut to the whole budget, and the row after it is not read.
        tiny = await run_query(one_connection, query.replace("DESC", "ASC"), SqlQueryConfig(max_bytes=100))
        assert tiny["truncated_by"] == "bytes" and tiny["row_count"] == 1, tiny
        assert tiny["rows"][0][1].endswith("…") and len(json.dumps(tiny["rows"])) <= 100
    finally:
        await one_connection.execute("DELETE FROM documents WHERE collection = $1", collection)


async def test_a_busy_query_pool_is_a_retriable_error_not_a_wait(database_url):
    pool = await db.create_pool(database_url, min_size=1, max_size=1)
    try:
        slow = asyncio.create_task(run_query(pool, "SELECT pg_sleep(3)", SqlQueryConfig(statement_timeout_s=5)))
        async def taken() -> bool:
            return pool.get_idle_size() == 0

        await _until(taken, 10, "the slow query never held the pool's connection")
        with pytest.raises(ToolError, match="busy") as info:
            await run_query(pool, "SELECT 1", SqlQueryConfig(statement_timeout_s=0.5))
        # Refused while the slow query still held the connection: it did not wait for it (an order, not a time).
        assert info.value.retriable and not slow.done()
        assert (await slow)["truncated"] is False
    finally:
        await pool.close()


async def test_sql_query_leaves_no_session_state_on_the_pooled_connection(one_connection):
    await run_query(one_connection, "SELECT set_config('search_path', 'nowhere', false), pg_advisory_lock(4242)",
                    SqlQueryConfig())
    assert await one_connection.fetchval("SHOW search_path") == '"$user", public'
    assert await one_connection.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    assert await one_connection.fetchval("SELECT current_user") != "agentstream_readonly"
    assert await one_connection.fetchval("SHOW transaction_read_only") == "off"


@pytest.mark.parametrize("query", [
    "SELECT rolname FROM pg_roles",
    "SELECT usename FROM pg_user",
    "SELECT usename, query FROM pg_stat_activity",
    "SELECT pid, query FROM pg_stat_activity",  # (the planner drops the join with pg_authid here)
    "SELECT name, setting FROM pg_settings",
    "SELECT * FROM information_schema.enabled_roles",
    "SELECT content FROM documents WHERE content = (SELECT rolname FROM pg_roles LIMIT 1)",
    "SELECT current_user", "SELECT session_user", 'SELECT "session_user"()', "SELECT system_user",
    "SELECT pg_get_userbyid(10)",
    "SELECT g::oid::regrole FROM generate_series(1, 20000) g",
    "SELECT acldefault('r', 10)::text",
    "SELECT current_setting('session_authorization')",
    "SELECT has_table_privilege('planner', 'documents', 'SELECT')",
    "SELECT query_to_xml('SELECT rolname FROM pg_roles', true, true, '')",
    "SELECT (pg_stat_get_activity(NULL)).usesysid",
    # 0005's overload, called by the query itself: it has the same checks now.
    "SELECT * FROM agentstream_readonly_query('SELECT rolname FROM pg_roles', 10)",
    "SELECT agentstream_readonly_query('SELECT rolname FROM pg_roles', 10)",
])
async def test_sql_query_reads_no_role_names_from_the_catalogs(one_connection, query):
    with pytest.raises(ToolError, match="permission denied") as info:
        await run_query(one_connection, query, SqlQueryConfig())
    assert "postgres" not in str(info.value)  # (the owner's name, in every cluster)


@pytest.mark.parametrize("query,rows", [
    ("SELECT count(*) AS n FROM documents d, plainto_tsquery('english', 'zyx') q "
     "WHERE to_tsvector('english', d.content) @@ q", [[0]]),
    ("WITH g AS (SELECT generate_series(1, 3) AS i) SELECT i FROM g", [[1], [2], [3]]),
    ("SELECT * FROM unnest(ARRAY['a', 'b'])", [["a"], ["b"]]),
    ("SELECT 'current_user' AS who, left('session_user', 7) AS what", [["current_user", "session"]]),
])
async def test_sql_query_still_reads_documents_and_plain_values(one_connection, query, rows):
    assert (await run_query(one_connection, query, SqlQueryConfig()))["rows"] == rows


async def test_sql_query_has_a_temp_file_limit_the_query_cannot_raise(one_connection):
    spill = "SELECT count(*) FROM (SELECT g FROM generate_series(1, 3000000) g ORDER BY g DESC) s"
    small = SqlQueryConfig(max_temp_bytes=1024 * 1024, statement_timeout_s=30)
    with pytest.raises(ToolError, match="more temporary disk space than its limit of 1048576 bytes"):
        await run_query(one_connection, spill, small)
    with pytest.raises(ToolError, match='permission denied to set parameter "temp_file_limit"'):
        await run_query(one_connection, "SELECT set_config('temp_file_limit', '-1', true)", small)

    # The tool services' role may set it (migration 0016), without being a superuser; a role that may not
    # gets a clear error rather than a query without the limit.
    await one_connection.execute("SET ROLE agentstream_tools")
    try:
        with pytest.raises(ToolError, match="more temporary disk space"):
            await run_query(one_connection, spill, small)
        assert (await run_query(one_connection, "SELECT 6 * 7 AS a", small))["rows"] == [[42]]
        await one_connection.execute("RESET ROLE; SET ROLE agentstream_reader")
        with pytest.raises(ToolError, match="not set up in this database: permission denied to set parameter"):
            await run_query(one_connection, "SELECT 1", small)
    finally:
        await one_connection.execute("RESET ROLE")


async def test_retrieve_asks_the_retrieval_service_through_events(pipe):
    word = f"zyx{uuid.uuid4().hex[:8]}"
    pool = await pipe.client.pool()
    await pool.execute("INSERT INTO documents (content, content_hash, source) VALUES ($1, $2, 'test')",
                       f"The {word} is a rare bird.", word)
    run_id, step = await _tool_step(
        pipe, f'[[tool:retrieve {{"query": "{word}", "k": 2}}]] [[answer:done]]', ["retrieve"])
    assert step["status"] == "completed", step
    passages = json.loads(step["result"]["result"])
    assert [p["text"] for p in passages] == [f"The {word} is a rare bird."]
    # The planner's group read the tool's RetrievalCompleted too (same topic) and dropped it: not its
    # pending step, not its prefetch; nothing of that step was recorded in the run's history.
    events = await pipe.client.events(run_id)
    assert not [e for e in events if (e["step_id"] or "").endswith("/retrieve")], events
    assert [e["event_type"] for e in events].count("ToolCallCompleted") == 1

    _, step = await _tool_step(pipe, '[[tool:retrieve {"query": "anything", "k": 99}]] [[answer:done]]',
                               ["retrieve"])
    assert step["status"] == "failed" and "k must be between 1 and 20" in step["error"]


def _tools_worker(settings, log: Path) -> subprocess.Popen:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
           "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions),
           "AGENTSTREAM_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms)}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", "tools", "--tools", TOOLS[0]],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


async def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_tool_worker_killed_mid_execution_does_not_run_the_tool_again(settings, effects_table, tmp_path):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    log = tmp_path / "tools.log"
    options = WorkerOptions(backend="scripted", tool_modules=())
    async with Pipeline.start(s, options, services=("planner", "inference")) as pipe:
        pool = await pipe.client.pool()
        catalog = ToolCatalog.for_runtime(pipe.client.runtime)  # the prefix's own agent.tools: empty so far
        worker = _tools_worker(s, log)
        try:
            async def registered() -> bool:
                return not await catalog.unknown(["effect_then_sleep"])

            await _until(registered, 30, "the tool worker did not register its tools")
            run_id = await pipe.client.submit(
                '[[tool:effect_then_sleep {"label": "once", "seconds": 60}]] [[answer:done]]',
                tools=["effect_then_sleep"], max_steps=4)

            async def effects() -> int:
                return await pool.fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1", run_id)

            async def started() -> bool:
                return await effects() > 0

            await _until(started, 30, "the tool never ran")
            worker.send_signal(signal.SIGKILL)  # mid-execution: after the side effect, before any result
            worker.wait()
            worker = _tools_worker(s, log)
            result = await pipe.client.wait(run_id, timeout=60)
        finally:
            worker.kill()
            worker.wait()
            await catalog.close()
        assert result.ok and result.answer == "done", result
        assert await effects() == 1
        status = await pipe.client.status(run_id)
        step = next(st for st in status["steps"] if st["kind"] == "tool")
        assert step["status"] == "failed" and step["error"].startswith("interrupted:"), step
        assert step["result"]["replayed"] is True
        row = await _tool_call(pipe, run_id)
        assert (row["status"], row["attempts"]) == ("running", 1)  # the row says it started, never finished

