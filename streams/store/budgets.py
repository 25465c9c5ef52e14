"""Budgets over time (``Quotas.tokens_per_hour``, ``tokens_per_day``, ``tasks_per_second``): their fixed
windows, and the counters in PostgreSQL that all the planners of a cell share (migration 0022).

Windows are **fixed** and aligned to UTC: a second, an hour from the top of the hour, a day from midnight
UTC. A fixed window is one counter row per budget and one upsert per charge, where a sliding one would
need a row per charge; the price is the usual one: a cell may use up to twice a budget across the edge of
two windows (the end of one hour and the start of the next).

A charge names its key (a model step's id, a run's task): the function charges a key once, so a step or a
task handled again (a redelivery after a crash or a rebalance) is not counted twice.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import asyncpg


class Budget(enum.Enum):
    """A budget over time: its name in ``quota_usage`` and how long its window is."""

    TOKENS_PER_HOUR = ("tokens_per_hour", 3600)
    TOKENS_PER_DAY = ("tokens_per_day", 86400)
    TASKS_PER_SECOND = ("tasks_per_second", 1)

    def __init__(self, key: str, seconds: int) -> None:
        self.key = key
        self.seconds = seconds

    @property
    def label(self) -> str:
        """How a refusal names it: "tokens per hour"."""
        return self.key.replace("_", " ")

    def window(self, at: datetime) -> datetime:
        """The start (UTC) of the window ``at`` (timezone-aware) falls in."""
        at = at.astimezone(UTC).replace(microsecond=0)
        if self is Budget.TASKS_PER_SECOND:
            return at
        if self is Budget.TOKENS_PER_HOUR:
            return at.replace(minute=0, second=0)
        return at.replace(hour=0, minute=0, second=0)


@dataclass(frozen=True)
class Charge:
    """``amount`` charged to ``budget`` (0: only read its use), whose limit is ``limit``."""

    budget: Budget
    amount: int
    limit: int


@dataclass(frozen=True)
class Use:
    """A budget's use in its current window, after a charge."""

    budget: Budget
    used: int
    limit: int

    @property
    def exhausted(self) -> bool:
        """Nothing is left of it."""
        return self.used >= self.limit

    @property
    def over(self) -> bool:
        """More than all of it is used (the charge that crossed it)."""
        return self.used > self.limit

    def reason(self) -> str:
        """What a ``quota_exceeded`` says: "tokens per hour: 10,000 used of 10,000"."""
        verb = "submitted" if self.budget is Budget.TASKS_PER_SECOND else "used"
        return f"{self.budget.label}: {self.used:,} {verb} of {self.limit:,} (a fixed window, UTC)"


class Ledger(Protocol):
    """Where a cell's budgets are charged: ``BudgetLedger`` (PostgreSQL), or a test's own."""

    async def charge(self, key: str | None, at: datetime, charges: Sequence[Charge]) -> list[Use]: ...


@dataclass
class _Pending:
    key: str | None
    at: datetime
    charges: tuple[Charge, ...]
    done: asyncio.Future[list[Use]]


class BudgetLedger:
    """The cell ``prefix``'s counters, through ``pool`` (the planner's: only its role may charge).

    Charged in batches, as the history is written (streams/store/history.py): while one batch is in
    PostgreSQL the next gathers, and a batch is one statement (one round trip, one commit) calling
    ``agentstream_charge_quota`` once per charge, in order, so each still learns the use right after its own
    charge. A batch's windows are those of its latest charge (they are sub-millisecond apart)."""

    def __init__(self, pool: asyncpg.Pool, prefix: str, *, max_batch: int = 500) -> None:
        self.pool = pool
        self.prefix = prefix
        self.max_batch = max_batch
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    async def charge(self, key: str | None, at: datetime, charges: Sequence[Charge]) -> list[Use]:
        """Charge ``charges`` once for ``key`` (None: read only) at ``at``; each budget's use after it."""
        if not charges:
            return []
        pending = _Pending(key, at, tuple(charges), asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await pending.done

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            shapes: dict[tuple[Budget, ...], list[_Pending]] = {}
            for p in batch:  # one statement per list of budgets (a task's, a model step's)
                shapes.setdefault(tuple(c.budget for c in p.charges), []).append(p)
            for budgets, group in shapes.items():
                try:
                    used = await self._send(budgets, group)
                except Exception as exc:  # each caller gets the failure (the transition is retried)
                    for p in group:
                        if not p.done.done():
                            p.done.set_exception(exc)
                    continue
                for p, row in zip(group, used, strict=True):
                    if not p.done.done():
                        p.done.set_result([Use(c.budget, int(u), c.limit) for c, u in zip(p.charges, row, strict=True)])

    async def _send(self, budgets: tuple[Budget, ...], group: list[_Pending]) -> list[list[int]]:
        at = max(p.at for p in group)
        columns = [f"a{i}" for i in range(len(budgets))]
        rows = await self.pool.fetch(
            f"SELECT agentstream_charge_quota($1, t.k, $2, $3::text[], $4::timestamptz[], "
            f"ARRAY[{', '.join(columns)}]::bigint[]) AS used "
            f"FROM unnest($5::text[], {', '.join(f'${6 + i}::bigint[]' for i in range(len(budgets)))}) "
            f"WITH ORDINALITY AS t(k, {', '.join(columns)}, o) ORDER BY t.o",
            self.prefix, at, [b.key for b in budgets], [b.window(at) for b in budgets], [p.key for p in group],
            *([p.charges[i].amount for p in group] for i in range(len(budgets))))
        return [list(r["used"]) for r in rows]


__all__ = ["Budget", "BudgetLedger", "Charge", "Ledger", "Use"]
