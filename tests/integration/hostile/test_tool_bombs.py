"""Issue 37, finding 4, against the secure stack: a model (here, the scripted one, told what to call) that
sends the calculator a CPU bomb gets a clear error for that call, and acme's tool worker (a process of its
own, as the ``tools`` principal) keeps serving the cell's other runs.

Before the fix, ``round(1, -3*10**7)`` computed 10**30000000 on the tool worker's event loop for about a
minute and a half: the 2 s tool timeout could not interrupt it, the run submitted next waited behind it,
and a redelivery would have stalled the next worker of the cell too. ``exp(1000)`` escaped as an
unhandled ``OverflowError``. (Unit tests: tests/unit/test_tool_bombs.py.) And the related finding:
``sql_query``, under acme's own ``tools`` login, has its temp_file_limit and reads no role names.
"""

from __future__ import annotations

import pytest

from tests.integration.hostile.conftest import ACME

pytestmark = pytest.mark.asyncio(loop_scope="package")

BOMBS = ('[[tool:calculator {"expression": "round(1, -3*10**7)"}]] '
         '[[tool:calculator {"expression": "exp(1000)"}]] [[answer:done]]')


async def test_a_calculator_bomb_fails_its_call_and_the_tool_worker_keeps_serving(cells):
    async with cells.client(ACME) as client:
        bombed = await client.submit(BOMBS, tools=["calculator"], max_steps=6, prefetch=False)
        # Right after it, while the bombs are (or would be) computing: served, and soon.
        after = await client.submit('[[tool:calculator {"expression": "6 * 7"}]] [[answer:forty-two]]',
                                    tools=["calculator"], max_steps=4, prefetch=False)
        second = await client.wait(after, timeout=30)
        assert second.ok and second.answer == "forty-two", second

        result = await client.wait(bombed, timeout=30)
        assert result.ok, result  # a failed tool call is the model's to deal with: the scripted one answers
        steps = [s for s in (await client.status(bombed) or {})["steps"] if s["kind"] == "tool"]
        assert [s["status"] for s in steps] == ["failed", "failed"], steps
        assert "round: ndigits must be within ±300" in steps[0]["error"], steps[0]
        assert "exp: result out of range" in steps[1]["error"], steps[1]
        assert "OverflowError" not in steps[1]["error"]
    assert "OverflowError" not in cells.logs["acme-tools"].read_text(errors="replace")


async def test_sql_query_under_the_tools_login_reads_no_role_names(cells):
    # Acme's tool worker logs in as `tools`, no superuser: it may set sql_query's temp_file_limit
    # (migration 0016 lets agentstream_tools), and the query may not read the catalogues' role names.
    task = ('[[tool:sql_query {"query": "SELECT rolname FROM pg_roles"}]] '
            '[[tool:sql_query {"query": "SELECT count(*) AS n FROM documents WHERE false"}]] [[answer:done]]')
    async with cells.client(ACME) as client:
        run_id = await client.submit(task, tools=["sql_query"], max_steps=6, prefetch=False)
        assert (await client.wait(run_id, timeout=30)).ok
        steps = [s for s in (await client.status(run_id) or {})["steps"] if s["kind"] == "tool"]
    assert [s["status"] for s in steps] == ["failed", "completed"], steps
    assert "permission denied" in steps[0]["error"] and "pg_authid" in steps[0]["error"], steps[0]
    assert '"rows": [[0]]' in steps[1]["result"]["result"], steps[1]
