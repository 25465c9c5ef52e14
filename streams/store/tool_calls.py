"""A tool call's claim in ``tool_calls``, and the check that the run it names asked for it.

Anyone who can write to ``agent.tool.requests`` can publish a ``ToolCallRequested``; the planner's checks
(the run's tools, approvals) are worth nothing if the tool service runs whatever arrives. So before a
call runs, the tool service checks it against the run's record in PostgreSQL — the planner's state row
(``runs.state``, services/planner/state.py), which the planner commits *before* it publishes a tool
request (services/planner/publishing.py: tool calls are not ``EARLY``). A call is run only if:

- its run exists, belongs to this pipeline (the state's ``topic_prefix``) and has not ended (completed,
  failed, cancelled: a cancelled run is ``failed`` with error code ``cancelled``);
- its tool is one of the run's tools;
- its step is the run's pending step, a tool step, with the same tool and arguments (compared as JSON) —
  or one of the calls of the run's pending fan-out (pending kind ``tools``: several calls of one model
  reply, each with its own step id, services/planner/fanout.py) that has not been answered yet;
- the call is not waiting for a person, and when the tool needs approval (the run's ``approval_tools``,
  fixed from the catalogue when the run started, or this worker's own definition of the tool) the
  pending request carries the approval (``approved_by``, written by the planner in the transition that
  recorded the ``ApprovalDecided``).

The check and the claim are one statement: a CTE reads the run's row, inserts the ``running`` row only
when nothing is wrong, and returns what was there before — one round trip, as the claim alone was.
A call whose step was claimed before (a redelivery, a planner republishing) is answered from that row
whatever the run's state is now, because it was checked when it was claimed; but only if the row is
the same call (run, tool, arguments): a forged request cannot borrow a real step's id to get another
call's answer.

Which refusals answer the run: only ``approval_required`` — the run did ask for exactly this call, but
this worker's definition of the tool needs an approval the run's plan (made from an older catalogue)
did not ask for; the run gets an error result saying so. Every other refusal is of a call the run did
not ask for: it must not produce a result the planner could take as the answer to a real step, so it
goes to the dead-letter topic only (error kind ``refused``, run id as the request named it, so the
run's owner finds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import asyncpg

from agentstream.streams.core.events import ToolCallRequested

#: Why a call was refused (the dead letter's reason starts with it).
Refusal: TypeAlias = Literal["unknown_run", "other_pipeline", "run_finished", "tool_not_allowed", "not_pending",
                             "awaiting_approval", "not_as_requested", "not_approved", "approval_required",
                             "step_taken"]
#: Refusals of a call the run did ask for (answered with an error result, not dead-lettered).
ANSWERED: Final[frozenset[Refusal]] = frozenset({"approval_required"})

#: $1 step id, $2 run id, $3 tool, $4 arguments (JSON text, or NULL when they are not JSON), $5 this
#: pipeline's topic prefix, $6 whether this worker's definition of the tool requires approval, $7 whether
#: to claim the call (false: check only, for calls this worker will answer with an error without running).
#: The final SELECT sees the table as it was before the statement: ``t`` is the call's earlier row, if any.
_CLAIM = """
WITH run AS (
    SELECT status, error_code, state,
           CASE WHEN state->>'pending_kind' = 'tools'
                THEN jsonb_path_query_first(state->'pending_request', '$.calls[*] ? (@.step_id == $step)',
                                            jsonb_build_object('step', $1::text))
                WHEN state->>'pending_kind' = 'tool' AND state->>'pending_step_id' = $1
                THEN state->'pending_request' END AS request
    FROM runs WHERE run_id = $2
), verdict AS (
    SELECT CASE
        WHEN run.state IS NULL THEN 'unknown_run'
        WHEN coalesce(run.state->>'topic_prefix', '') <> $5 THEN 'other_pipeline'
        WHEN run.status IN ('completed', 'failed') THEN 'run_finished'
        WHEN NOT coalesce(run.state->'tools' ? $3, false) THEN 'tool_not_allowed'
        WHEN run.request IS NULL OR run.request ? 'done' THEN 'not_pending'
        WHEN run.request ? 'awaiting_approval'
             OR (run.status = 'awaiting_approval' AND run.state->>'pending_kind' = 'tool') THEN 'awaiting_approval'
        WHEN run.request->>'tool' IS DISTINCT FROM $3
             OR run.request->'arguments' IS DISTINCT FROM $4::jsonb THEN 'not_as_requested'
        WHEN run.request ? 'approved_by' THEN NULL
        WHEN coalesce(run.state->'approval_tools' ? $3, false) THEN 'not_approved'
        WHEN $6::boolean THEN 'approval_required'
    END AS refusal, run.status, run.error_code, run.state->>'pending_step_id' AS pending_step
    FROM (SELECT 1) AS one LEFT JOIN run ON true
), claimed AS (
    INSERT INTO tool_calls (step_id, run_id, tool, arguments, status)
    SELECT $1, $2, $3, $4::jsonb, 'running' FROM verdict WHERE verdict.refusal IS NULL AND $7::boolean
    ON CONFLICT (step_id) DO NOTHING RETURNING step_id
)
SELECT v.refusal, v.status AS run_status, v.error_code AS run_error_code, v.pending_step,
       EXISTS (SELECT 1 FROM claimed) AS claimed,
       t.run_id AS prev_run_id, t.tool AS prev_tool, t.arguments = $4::jsonb AS prev_same_arguments,
       t.status AS prev_status, t.result::text AS prev_result, t.error AS prev_error,
       t.error_kind AS prev_error_kind, t.attempts AS prev_attempts
FROM verdict AS v LEFT JOIN tool_calls AS t ON t.step_id = $1
"""

#: Only after losing a race: another handler claimed the same step between our snapshot and our insert.
_EARLIER = """
SELECT run_id AS prev_run_id, tool AS prev_tool, arguments = $2::jsonb AS prev_same_arguments,
       status AS prev_status, result::text AS prev_result, error AS prev_error, error_kind AS prev_error_kind,
       attempts AS prev_attempts
FROM tool_calls WHERE step_id = $1
"""


#: A call of an idempotent tool leaves no row in ``tool_calls``; when such a call is refused because its
#: run has moved on, this tells a redelivered copy (its step recorded as done, with this very tool and
#: these arguments: the planner has the answer) from a forgery.
#: With ``$5`` true, a step the run requested and never had answered counts too: the run ended (a deadline,
#: a cancel) while its call was on its way, so the call is stale, not forged.
_ANSWERED = """
SELECT EXISTS (SELECT 1 FROM steps
               WHERE step_id = $1 AND run_id = $2 AND kind = 'tool' AND (status <> 'requested' OR $5)
                 AND request->>'tool' = $3 AND request->'arguments' = $4::jsonb)
"""
#: The refusals a copy of an answered call meets: the run waits for a later step, or has ended.
MOVED_ON: Final[frozenset[Refusal]] = frozenset({"not_pending", "run_finished"})


@dataclass(frozen=True)
class EarlierCall:
    """The step's row from before: ``running`` (interrupted, or running elsewhere), or finished."""

    status: str
    attempts: int
    result: str | None = None
    error: str | None = None
    error_kind: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What the check decided. ``refusal`` None: the call may be answered — run it when ``claimed``,
    answer it from ``earlier`` when the step was claimed before."""

    refusal: Refusal | None = None
    reason: str = ""
    claimed: bool = False
    earlier: EarlierCall | None = None

    @property
    def answers_the_run(self) -> bool:
        """A refusal the run hears as its step's (error) result, rather than a dead letter only."""
        return self.refusal in ANSWERED


async def claim(pool: asyncpg.Pool, call: ToolCallRequested, arguments_json: str | None, *, prefix: str,
                requires_approval: bool, execute: bool = True) -> Verdict:
    """Check ``call`` against its run and, when ``execute`` and nothing is wrong, claim it (the ``running``
    row). ``arguments_json``: the call's arguments as ``store.to_json`` writes them (the planner's state
    went through it too), or None when they are not JSON."""
    row = await pool.fetchrow(_CLAIM, call.step_id, call.run_id, call.tool, arguments_json, prefix,
                              requires_approval, execute)
    assert row is not None  # the verdict CTE has exactly one row
    if row["prev_status"] is not None:
        return _earlier(call, row)
    refusal = row["refusal"]
    if refusal is not None:
        return Verdict(refusal, refusal_reason(refusal, call, run_status=row["run_status"],
                                               run_error_code=row["run_error_code"], pending_step=row["pending_step"]))
    if row["claimed"] or not execute:
        return Verdict(claimed=row["claimed"])
    earlier = await pool.fetchrow(_EARLIER, call.step_id, arguments_json)
    if earlier is None:  # never expected: the insert conflicted with a row that is gone now
        raise RuntimeError(f"the claim of {call.step_id} conflicted, yet no row has its step id")
    return _earlier(call, earlier)


async def answered(pool: asyncpg.Pool, call: ToolCallRequested, arguments_json: str | None, *,
                   or_requested: bool = False) -> bool:
    """Whether ``call``'s run recorded its step as done with exactly this tool and these arguments: a
    redelivered copy of a call already answered (for calls that keep no ``tool_calls`` row). With
    ``or_requested``, also a step the run requested and never had answered (its run ended first)."""
    if arguments_json is None:
        return False
    return bool(await pool.fetchval(_ANSWERED, call.step_id, call.run_id, call.tool, arguments_json,
                                    or_requested))


def _earlier(call: ToolCallRequested, row: asyncpg.Record) -> Verdict:
    if not same_call(call, run_id=row["prev_run_id"], tool=row["prev_tool"],
                     same_arguments=bool(row["prev_same_arguments"])):
        return Verdict("step_taken", refusal_reason("step_taken", call))
    return Verdict(earlier=EarlierCall(status=row["prev_status"], attempts=row["prev_attempts"],
                                       result=row["prev_result"], error=row["prev_error"],
                                       error_kind=row["prev_error_kind"]))


def same_call(call: ToolCallRequested, *, run_id: str, tool: str, same_arguments: bool) -> bool:
    """Whether the row claimed for ``call``'s step id was claimed for this very call."""
    return run_id == call.run_id and tool == call.tool and same_arguments


def refusal_reason(refusal: Refusal, call: ToolCallRequested, *, run_status: str | None = None,
                   run_error_code: str | None = None, pending_step: str | None = None) -> str:
    """The dead letter's (or the error result's) reason: for a person, naming the run, step and tool."""
    run, step, tool = call.run_id, call.step_id, call.tool
    why = {
        "unknown_run": f"run {run!r} does not exist",
        "other_pipeline": f"run {run!r} belongs to another pipeline (topic prefix) than this tool service's",
        "run_finished": f"run {run!r} has ended ({run_status}"
                        + (f": {run_error_code})" if run_error_code else ")"),
        "tool_not_allowed": f"tool {tool!r} is not among the tools of run {run!r}",
        "not_pending": f"step {step!r} is not the tool call run {run!r} waits for "
                       f"(its pending step: {pending_step or 'none'})",
        "awaiting_approval": f"step {step!r} waits for a person's approval, which it has not been given",
        "not_as_requested": f"the tool or arguments of step {step!r} differ from what run {run!r} requested",
        "not_approved": f"tool {tool!r} needs a person's approval and step {step!r} has none",
        "approval_required": f"this worker's {tool!r} requires a person's approval, which run {run!r} did not ask "
                             "for (its plan predates the requirement); the tool was not run",
        "step_taken": f"step id {step!r} was already claimed by a different call (run, tool or arguments)",
    }[refusal]
    return f"{refusal}: {why}"


__all__ = ["ANSWERED", "MOVED_ON", "EarlierCall", "Refusal", "Verdict", "answered", "claim", "refusal_reason",
           "same_call"]
