"""A session's transcript, as pure values: the turns a conversation carries forward, their token
estimate, and the cut that keeps it within the session's token budget.

A turn is what the next turn's model must see of it: the task (the user's message) and the model's final
reply as it said it (in JSON-action mode, the ``final_answer`` action: a model that sees its own earlier
replies keeps to the format). A turn's tool calls and results stay in its run's history; they are not
carried forward. A turn that failed adds nothing.

Tokens are estimated, not counted (the planner has no tokenizer, and the model may be any): a third of
the UTF-8 bytes, rounded up, plus 4 per message for the chat template's framing. English runs at about
4 bytes a token on the usual BPE vocabularies and JSON at about 3, so the estimate errs high, and a
transcript cut to fit the budget by it fits by the tokenizer's count too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from agentstream.services.planner.state import COMPLETED, RunState
from agentstream.streams.core.events import Message, SessionTurn, SessionUpdated

#: Tokens the chat template adds around each message (role markers, separators), estimated.
MESSAGE_OVERHEAD: Final = 4
BYTES_PER_TOKEN: Final = 3


def estimate_tokens(text: str) -> int:
    """An upper estimate of ``text``'s tokens (see the module's docstring)."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One finished turn of a session: its run, the user's message, the model's final reply (what the
    next turn's model sees) and the answer extracted from it (what people read)."""

    run_id: str
    user: str
    reply: str
    answer: str
    tokens: int
    #: A turn whose agent handed the conversation over: the agent it ended with, and the one it started
    #: with (the session's next turn naming that one goes on with this one: services/planner/sessions.py).
    agent: str | None = None
    handed_from: str | None = None

    @classmethod
    def of(cls, run_id: str, user: str, reply: str, answer: str, *, agent: str | None = None,
           handed_from: str | None = None) -> Turn:
        tokens = estimate_tokens(user) + estimate_tokens(reply) + 2 * MESSAGE_OVERHEAD
        return cls(run_id=run_id, user=user, reply=reply, answer=answer, tokens=tokens,
                   agent=agent if handed_from else None, handed_from=handed_from)

    def messages(self) -> tuple[Message, Message]:
        return Message(role="user", content=self.user), Message(role="assistant", content=self.reply)

    def to_dict(self) -> dict[str, Any]:
        data = {"run_id": self.run_id, "user": self.user, "reply": self.reply, "answer": self.answer,
                "tokens": self.tokens}
        return data | {"agent": self.agent, "handed_from": self.handed_from} if self.handed_from else data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Turn:
        """A turn as ``sessions.turns`` or a run's state holds it; the estimate is recomputed when absent."""
        tokens = data.get("tokens")
        turn = cls.of(str(data["run_id"]), str(data["user"]), str(data["reply"]), str(data.get("answer") or ""),
                      agent=data.get("agent"), handed_from=data.get("handed_from"))
        return turn if tokens is None else replace(turn, tokens=int(tokens))


@dataclass(frozen=True, kw_only=True)
class Transcript:
    """A session as a turn starts from it: its ``epoch`` (a delete moves it on: a turn begun in an earlier
    epoch belongs to a session that was deleted), its turns, oldest first, how many turns left it so far
    to keep it within its budget (dropped, or folded into the summary), and the ``summary`` of those
    (``overflow = summarise``: services/planner/summaries.py; "" when none).

    Stored (``sessions.turns``, a run's ``session_turns``) as its turns' dicts, preceded by
    ``{"summary": ..., "tokens": n}`` when it has a summary: one JSON array, so the transition writer
    and the session's row need no column of their own for it."""

    epoch: int = 0
    turns: tuple[Turn, ...] = ()
    dropped: int = 0
    summary: str = ""

    @property
    def summary_tokens(self) -> int:
        return estimate_tokens(self.summary) + MESSAGE_OVERHEAD if self.summary else 0

    @property
    def tokens(self) -> int:
        return self.summary_tokens + sum(t.tokens for t in self.turns)

    def instructions(self, system: str) -> str:
        """The turn's instructions with the session's summary after them (the model reads it as context
        it was given, not as something a user said)."""
        return f"{system}\n\nSummary of the conversation before the turns below: {self.summary}" if self.summary \
            else system

    def rows(self) -> list[dict[str, Any]]:
        """As ``sessions.turns`` and a run's ``session_turns`` hold it (see the class)."""
        head = [{"summary": self.summary, "tokens": self.summary_tokens}] if self.summary else []
        return head + [t.to_dict() for t in self.turns]

    def messages(self) -> tuple[Message, ...]:
        """What the model sees of the session, before the turn's own task."""
        return tuple(m for turn in self.turns for m in turn.messages())

    def fit(self, budget: int) -> Transcript:
        """The transcript within ``budget`` estimated tokens: the oldest turns dropped until the rest fits
        (the newest turn too, if it alone is over the budget: the model never gets a transcript over it)."""
        total = self.tokens
        cut = 0
        while cut < len(self.turns) and total > budget:
            total -= self.turns[cut].tokens
            cut += 1
        if cut == 0:
            return self
        return Transcript(epoch=self.epoch, turns=self.turns[cut:], dropped=self.dropped + cut, summary=self.summary)

    def after(self, turn: Turn) -> Transcript:
        """The transcript once ``turn`` has finished."""
        return Transcript(epoch=self.epoch, turns=(*self.turns, turn), dropped=self.dropped, summary=self.summary)

    @classmethod
    def from_rows(cls, epoch: int, turns: Iterable[Mapping[str, Any]], dropped: int = 0,
                  summary: str = "") -> Transcript:
        """From ``rows()`` (a summary entry first, if any), or from a session's row (``summary`` apart)."""
        kept: list[Turn] = []
        for row in turns:
            if "summary" in row:
                summary = str(row["summary"])
            else:
                kept.append(Turn.from_dict(row))
        return cls(epoch=epoch, turns=tuple(kept), dropped=dropped, summary=summary)


def started(state: RunState) -> Transcript:
    """The transcript the turn ``state`` started from (as recorded with it)."""
    return Transcript.from_rows(state.session_epoch, state.session_turns, state.session_dropped)


def finished(state: RunState) -> Transcript | None:
    """The session's transcript once the turn ``state`` completed with its answer: the one it started
    from, and itself. None for a run that is not a completed turn (a failed turn adds nothing)."""
    if state.session is None or state.status != COMPLETED or not state.messages:
        return None
    reply = state.messages[-1].content if state.messages[-1].role == "assistant" else (state.answer or "")
    return started(state).after(Turn.of(state.run_id, state.task, reply, state.answer or "", agent=state.agent,
                                        handed_from=state.handed_from))


def event(state: RunState, service: str) -> SessionUpdated | None:
    """The ``SessionUpdated`` a completed turn publishes (keyed by the session, on ``agent.sessions``)."""
    after = finished(state)
    if after is None or state.session is None:
        return None
    return SessionUpdated.build(
        run_id=state.run_id, step=f"{state.run_id}:session", service=service, created_at=state.updated_at,
        session=state.session, epoch=after.epoch, dropped=after.dropped, tokens=after.tokens,
        summary=after.summary, turns=[SessionTurn(run_id=t.run_id, user=t.user, reply=t.reply, answer=t.answer, tokens=t.tokens)
               for t in after.turns])


__all__ = ["BYTES_PER_TOKEN", "MESSAGE_OVERHEAD", "Transcript", "Turn", "estimate_tokens", "event", "finished",
           "started"]
