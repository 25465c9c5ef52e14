"""Telling a producer that its task never became a run (issue 36: "foreign producers are told of every
refusal").

A record on the intake that cannot be read — undecodable bytes, an unknown schema id, an envelope that
breaks the rules, an event the intake does not carry — is dead-lettered (streams/runtime/middleware/
decode.py) and so never becomes a run: no planner ever publishes its outcome, and a producer waiting on
``agent.outcomes`` for the run its key names would wait forever. The planner, told of each record it
dead-letters (``ServiceConfig.on_rejected``), answers such a record with a ``RunFailed`` (``invalid_task``,
the reason and where the letter is) keyed by that run, when the key is a run id and no run of this
pipeline has it: an undecodable record keyed by a live run (a malformed cancellation, say) does not end
that run's waiters with a false outcome.

The outcome's step id names the letter (``{run_id}:refused:{partition}:{offset}``), not the run's
``{run_id}:outcome``: a task with the same run id that does become a run later gets an outcome of its
own, which de-duplication must not drop as a copy. Redelivered, the same record gives the same event
(deterministic ids), which readers drop.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agentstream.streams.core.events import RunFailed
from agentstream.streams.core.task_rules import run_id_problem
from agentstream.streams.runtime.records import Record

if TYPE_CHECKING:
    from agentstream.services.planner.service import Planner

log = logging.getLogger(__name__)


class Refusals:
    """The planner's answers to intake records it had to dead-letter."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.stats = {"told": 0}

    async def rejected(self, record: Record, kind: str, reason: str) -> None:
        """Answer ``record`` (just dead-lettered) if it was a task that never became a run. Never raises:
        the letter is published already, and telling the producer is a courtesy the record's handling
        must not depend on (a failure is logged)."""
        try:
            await self._tell(record, kind, reason)
        except Exception as exc:  # a broker away, the database away: the letter says it all the same
            log.warning("planner: could not tell the producer of the record at %s[%d]@%d that it was refused "
                        "(%s: %s)", record.topic, record.partition, record.offset, type(exc).__name__, exc)

    async def _tell(self, record: Record, kind: str, reason: str) -> None:
        runtime = self.planner.runtime
        if record.topic != runtime.topics.tasks or not record.key:
            return
        run_id = record.key.decode("utf-8", errors="replace")
        if run_id_problem(run_id) is not None or await self.planner.load(run_id) is not None:
            return  # not a run id, or a run that exists (its waiters get its own outcome)
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        failed = RunFailed.build(
            run_id=run_id, step=f"{run_id}:refused:{record.partition}:{record.offset}", service="planner",
            created_at=datetime.now(UTC), error_code="invalid_task", steps=0, duration_ms=0.0,
            error=f"the task could not become a run ({kind}): {reason}; it is dead-lettered from {where} "
                  "(agentstream dlq show)")
        await (await runtime.send(runtime.topics.outcomes, failed))
        self.stats["told"] += 1
        log.warning("planner: told the producer of %s that its task at %s was refused (%s)", run_id, where, kind)


__all__ = ["Refusals"]
