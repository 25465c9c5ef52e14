"""Budgets over time on the secure stack (docs/security.md, "Quotas per tenant"; issue 36, item 4): the counters'
SQL (migration 0022) on PostgreSQL as the planner's login — a key charged once, fixed windows, a late charge
counted in the newer window — and no other login may read or move them; beta's planner fails a run whose
step uses up the cell's tokens per day, and the tasks that arrive after it, and the tasks past its
submissions per second, all with ``quota_exceeded`` and the budget's name, while acme's runs complete."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.streams.store.budgets import Budget, BudgetLedger, Charge
from tests.integration.acl_probes import connection
from tests.integration.hostile.conftest import ACME, BETA, QUOTAS_BETA

pytestmark = pytest.mark.asyncio(loop_scope="package")

TOKENS_PER_DAY = int(QUOTAS_BETA["AGENTSTREAM_QUOTA_TOKENS_PER_DAY"])


async def test_the_counters_charge_a_key_once_per_fixed_window_and_only_the_planner_may(cells):
    prefix = f"budget-test-{uuid.uuid4().hex[:8]}."
    pool = await asyncpg.create_pool(cells.stack.database_url_for("planner"), min_size=1, max_size=1)
    try:
        ledger = BudgetLedger(pool, prefix)
        hour = Budget.TOKENS_PER_HOUR
        at = datetime(2026, 12, 6, 10, 30, tzinfo=UTC)

        async def used(key: str | None, when: datetime, amount: int) -> int:
            (use,) = await ledger.charge(key, when, [Charge(hour, amount, 100)])
            return use.used

        assert await used("run-1:0:model", at, 30) == 30
        assert await used("run-1:0:model", at, 30) == 30  # redelivered: not counted again
        assert await used("run-2:0:model", at + timedelta(minutes=29), 50) == 80
        assert await used(None, at, 0) == 80  # a read
        assert await used("run-3:0:model", at + timedelta(minutes=30), 5) == 5  # 11:00: the next window
        assert await used("run-4:0:model", at, 7) == 12  # stamped 10:30 by a clock behind: counts in 11:00's
        assert await used(None, at + timedelta(hours=2), 0) == 0  # nothing in 12:30's window yet
        # Charges made at once go in one statement, each still told the use right after its own charge.
        later = at + timedelta(hours=3)
        told = await asyncio.gather(*(used(f"run-5:{i % 3}:model", later, 10) for i in range(6)))
        assert sorted(set(told)) == [10, 20, 30] and await used(None, later, 0) == 30  # three keys, once each
    finally:
        await pool.close()

    for login in ("client", "tools", tenant_principal(BETA), "operator-reader"):
        async with connection(cells.stack.database_url_for(login)) as conn:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval("SELECT agentstream_charge_quota($1, 'k', now(), '{tokens_per_hour}', "
                                    "ARRAY[now()], '{1}')", prefix)
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval("SELECT count(*) FROM quota_usage")
    async with connection(cells.stack.database_url) as conn:
        await conn.execute("DELETE FROM quota_usage WHERE prefix = $1", prefix)
        await conn.execute("DELETE FROM quota_charges WHERE prefix = $1", prefix)


async def test_a_used_up_token_budget_fails_the_tenants_run_and_tasks_and_leaves_the_other_tenant_alone(cells):
    beta_prefix = tenant_prefix(BETA)
    async with connection(cells.stack.database_url) as owner:
        # Beta's day all but used: the next model step of any of its runs uses up the rest.
        await owner.execute(
            "INSERT INTO quota_usage (prefix, budget, window_start, used) VALUES ($1, 'tokens_per_day', "
            "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', $2) ON CONFLICT (prefix, budget) "
            "DO UPDATE SET window_start = EXCLUDED.window_start, used = EXCLUDED.used", beta_prefix,
            TOKENS_PER_DAY - 5)
        try:
            async with cells.client(BETA) as beta, cells.client(ACME) as acme:
                run_id = await beta.submit("What is 2 * 3?", tools=["calculator"], max_steps=4, prefetch=False)
                result = await beta.wait(run_id, timeout=60)
                assert (result.status, result.error_code) == ("failed", "quota_exceeded"), result
                assert result.error is not None and result.error.startswith("tokens per day: ") \
                    and f"used of {TOKENS_PER_DAY:,}" in result.error

                later = await beta.submit("[[answer:late]]", tools=[], max_steps=4, prefetch=False)
                result = await beta.wait(later, timeout=60)
                assert (result.error_code, (result.error or "").split(":")[0]) == ("quota_exceeded", "tokens per day")

                other = await acme.submit("What is 2 * 3?", tools=["calculator"], max_steps=4, prefetch=False)
                assert (await acme.wait(other, timeout=60)).ok  # acme's cell has no budgets: untouched
        finally:
            await owner.execute("DELETE FROM quota_usage WHERE prefix = $1 AND budget = 'tokens_per_day'",
                                beta_prefix)


async def test_the_tasks_past_a_tenants_submissions_per_second_fail_and_the_other_tenant_is_not_limited(cells):
    rate = int(QUOTAS_BETA["AGENTSTREAM_QUOTA_TASKS_PER_SECOND"])
    async with cells.client(BETA) as beta, cells.client(ACME) as acme:
        for client in (beta, acme):  # before submitting at once: no outcome slips past (AgentClient.wait)
            await client.watch_outcomes()
        burst = await asyncio.gather(*(beta.submit(f"[[answer:{i}]]", tools=[], max_steps=4, prefetch=False)
                                       for i in range(4 * rate)))
        results = [await beta.wait(run_id, timeout=120) for run_id in burst]
        refused = [r for r in results if r.error_code == "quota_exceeded" and "tasks per second" in (r.error or "")]
        assert refused, [(r.status, r.error) for r in results]
        assert refused[0].error is not None and f"submitted of {rate}" in refused[0].error
        assert all(r.ok or r.error_code == "quota_exceeded" for r in results)

        many = await asyncio.gather(*(acme.submit(f"[[answer:{i}]]", tools=[], max_steps=4, prefetch=False)
                                      for i in range(2 * rate + 1)))
        results = [await acme.wait(run_id, timeout=120) for run_id in many]
        assert all(r.ok for r in results), [(r.status, r.error) for r in results]
