"""Budgets over time (streams/store/budgets.py, services/planner/admission.py): the fixed windows, the
refusal's words, and the planner charging a cell's tasks and model steps once each, failing what a used-up
budget refuses. The counters' SQL (migration 0022) is tried on PostgreSQL in
tests/integration/hostile/test_budgets.py; here the ledger is an in-memory one with the same contract."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest

from agentstream.streams.config.quotas import Quotas
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.events import RunFailed
from agentstream.streams.store.budgets import Budget, Charge, Use

from .test_planner_admission import ANSWER, TOOL_CALL, reply, rig, task


class MemoryLedger:
    """``agentstream_charge_quota`` without windows (one window for the test): each key charged once."""

    def __init__(self) -> None:
        self.used: dict[Budget, int] = {}
        self.keys: set[str] = set()
        self.calls = 0

    async def charge(self, key: str | None, at: datetime, charges: Sequence[Charge]) -> list[Use]:
        self.calls += 1
        fresh = key is not None and key not in self.keys
        if key is not None:
            self.keys.add(key)
        for c in charges:
            if fresh:
                self.used[c.budget] = self.used.get(c.budget, 0) + c.amount
        return [Use(c.budget, self.used.get(c.budget, 0), c.limit) for c in charges]


def test_windows_are_fixed_and_aligned_to_utc():
    at = datetime(2026, 12, 6, 11, 59, 59, 999_000, tzinfo=UTC)
    assert Budget.TASKS_PER_SECOND.window(at) == datetime(2026, 12, 6, 11, 59, 59, tzinfo=UTC)
    assert Budget.TOKENS_PER_HOUR.window(at) == datetime(2026, 12, 6, 11, tzinfo=UTC)
    assert Budget.TOKENS_PER_DAY.window(at) == datetime(2026, 12, 6, tzinfo=UTC)
    # The next millisecond is the next window of all three.
    later = at + timedelta(milliseconds=1)
    assert Budget.TOKENS_PER_HOUR.window(later) == datetime(2026, 12, 6, 12, tzinfo=UTC)
    assert Budget.TOKENS_PER_DAY.window(later) == Budget.TOKENS_PER_DAY.window(at)
    # A clock in another zone names the same UTC windows.
    paris = at.astimezone(timezone(timedelta(hours=1)))
    assert Budget.TOKENS_PER_DAY.window(paris) == datetime(2026, 12, 6, tzinfo=UTC)
    assert Budget.TOKENS_PER_HOUR.window(paris) == datetime(2026, 12, 6, 11, tzinfo=UTC)


def test_a_refusal_names_the_budget_and_its_use():
    use = Use(Budget.TOKENS_PER_HOUR, 10_000, 10_000)
    assert use.exhausted and not use.over
    assert use.reason().startswith("tokens per hour: 10,000 used of 10,000")
    assert Use(Budget.TASKS_PER_SECOND, 6, 5).reason().startswith("tasks per second: 6 submitted of 5")
    assert not Use(Budget.TOKENS_PER_DAY, 9, 10).exhausted


def test_budgets_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_QUOTA_TOKENS_PER_HOUR", "10000")
    monkeypatch.setenv("AGENTSTREAM_QUOTA_TOKENS_PER_DAY", "50000")
    monkeypatch.setenv("AGENTSTREAM_QUOTA_TASKS_PER_SECOND", "5")
    quotas = Quotas.load()
    assert (quotas.tokens_per_hour, quotas.tokens_per_day, quotas.tasks_per_second) == (10_000, 50_000, 5)
    assert quotas.token_budgets and not Quotas(tasks_per_second=5).token_budgets
    monkeypatch.setenv("AGENTSTREAM_QUOTA_TASKS_PER_SECOND", "0")
    with pytest.raises(ConfigError, match="AGENTSTREAM_QUOTA_TASKS_PER_SECOND"):
        Quotas.load()


async def test_the_task_past_the_submissions_rate_fails_and_a_redelivered_task_is_not_counted_again():
    r = await rig(quotas=Quotas(tasks_per_second=2))
    r.planner.admission.ledger = ledger = MemoryLedger()
    await r.feed(task("one"))
    r.planner.cache.pop("one")  # as after a restart: the copy goes through admission again
    await r.feed(task("one"))
    await r.feed(task("two"))
    await r.feed(task("three"))
    assert [r.store.state(x).status for x in ("one", "two")] == ["running", "running"]
    three = r.store.state("three")
    assert (three.status, three.error_code) == ("failed", "quota_exceeded")
    assert three.error is not None and three.error.startswith("tasks per second: 3 submitted of 2")
    assert ledger.used == {Budget.TASKS_PER_SECOND: 3}  # one, two, three: the copy of one is not a submission
    assert any(isinstance(e, RunFailed) and e.run_id == "three" for e in r.sent())


async def test_tokens_are_charged_once_per_model_step_and_a_used_up_budget_fails_runs_and_tasks():
    r = await rig(quotas=Quotas(tokens_per_hour=100, tokens_per_day=1000))
    r.planner.admission.ledger = ledger = MemoryLedger()
    await r.feed(task("a"))
    await r.feed(task("b"))
    await r.feed(reply("a:0:model", TOOL_CALL, prompt_tokens=40, completion_tokens=20))  # 60 of 100
    await r.feed(reply("a:0:model", TOOL_CALL, prompt_tokens=40, completion_tokens=20))  # a copy: not charged
    assert ledger.used == {Budget.TOKENS_PER_HOUR: 60, Budget.TOKENS_PER_DAY: 60}
    assert r.store.state("a").pending_step_id == "a:1:tool"
    await r.feed(reply("b:0:model", TOOL_CALL, prompt_tokens=30, completion_tokens=10))  # 100 of 100: none left
    b = r.store.state("b")
    assert (b.status, b.error_code) == ("failed", "quota_exceeded")
    assert b.error is not None and b.error.startswith("tokens per hour: 100 used of 100")
    await r.feed(task("c"))  # arrives while the hour's budget is used up
    c = r.store.state("c")
    assert (c.status, c.error_code) == ("failed", "quota_exceeded") and "tokens per hour" in (c.error or "")
    assert "InferenceRequested" not in [type(e).__name__ for e in r.sent() if e.run_id == "c"]


async def test_the_step_that_ends_a_run_is_charged_and_the_run_completes():
    r = await rig(quotas=Quotas(tokens_per_day=50))
    r.planner.admission.ledger = ledger = MemoryLedger()
    await r.feed(task("a"))
    await r.feed(reply("a:0:model", ANSWER, prompt_tokens=40, completion_tokens=20))
    assert r.store.state("a").status == "completed"  # its answer came with the step that used the budget up
    assert ledger.used == {Budget.TOKENS_PER_DAY: 60}


async def test_a_cell_without_budgets_over_time_never_asks_the_ledger():
    r = await rig(quotas=Quotas(tokens_per_run=1000, runs_in_flight=10))
    r.planner.admission.ledger = ledger = MemoryLedger()
    await r.feed(task("a"))
    await r.feed(reply("a:0:model", ANSWER))
    assert r.store.state("a").status == "completed" and ledger.calls == 0
