"""Summarising a session's oldest turns (``AGENTSTREAM_SESSION_OVERFLOW=summarise``), as pure values.

When a turn begins from a transcript over the session's token budget, the oldest turns are folded into
a summary by a model step of the turn's own run, before the turn's first real step: the step is an
``InferenceRequested`` like any other (same topic, same inference service, same history, replayed like
the rest), so a summary costs no stage of its own and no stage waits on it but the turn. Its prompt holds
the session's earlier summary and the folded turns; its reply becomes the session's new summary, which
the model then sees in its instructions. The step is given on top of the task's ``max_steps`` (a turn
asked for one step still gets it).

Why a quarter of the budget for the summary: the summary must leave room for the turns kept verbatim
(the recent ones, which matter most), and a few hundred tokens hold the facts of many turns. If the step
fails (the model errs), the turn goes on with the folded turns dropped and the earlier summary kept: a
summary is an improvement on dropping, never a reason to fail a user's turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from agentstream.services.planner.state import SummaryRequest
from agentstream.services.planner.transcript import BYTES_PER_TOKEN, Transcript, Turn
from agentstream.streams.core.events import Message

#: The summary may take this share of the session's token budget (1/4).
SUMMARY_SHARE: Final = 4
#: Characters of one folded turn's message shown to the summarising model.
TURN_CHARS: Final = 2000

INSTRUCTIONS: Final = (
    "You maintain the memory of a conversation between a user and an assistant. Write a concise summary "
    "that replaces the earlier summary (if any) and the turns given: keep the facts, names, numbers, "
    "decisions, the user's preferences and anything left open; drop pleasantries. Write plain sentences in "
    "the third person (\"The user asked ...\"), at most {words} words. Reply with the summary only.")


def condense(history: Transcript, budget: int) -> tuple[Transcript, tuple[Turn, ...]]:
    """``history`` split for a summary: the turns kept verbatim (the newest, within the budget less the
    summary's share) and the oldest turns to fold into the summary. Nothing to fold when it fits."""
    if history.tokens <= budget:
        return history, ()
    room = budget - summary_tokens(budget)
    total = sum(t.tokens for t in history.turns)
    cut = 0
    while cut < len(history.turns) and total > room:
        total -= history.turns[cut].tokens
        cut += 1
    kept = Transcript(epoch=history.epoch, turns=history.turns[cut:], dropped=history.dropped + cut,
                      summary=history.summary)
    return kept, history.turns[:cut]


def summary_tokens(budget: int) -> int:
    """The most tokens a summary may take of a session's ``budget``."""
    return max(16, budget // SUMMARY_SHARE)


def request(earlier: str, folded: Sequence[Turn], budget: int) -> SummaryRequest:
    """The model step that folds ``folded`` (oldest first) into the ``earlier`` summary."""
    limit = summary_tokens(budget)
    lines = [f"Earlier summary: {earlier}", ""] if earlier else []
    for turn in folded:
        lines.append(f"User: {_cut(turn.user)}")
        lines.append(f"Assistant: {_cut(turn.answer or turn.reply)}")
    prompt = (Message(role="system", content=INSTRUCTIONS.format(words=max(10, limit * 3 // 5))),
              Message(role="user", content="\n".join(lines)))
    return SummaryRequest(prompt=prompt, max_tokens=limit, budget=budget, folded=len(folded))


def summarised(kept: Transcript, reply: str | None, budget: int) -> Transcript:
    """The transcript a turn begins from once the summary step is back: ``kept`` with the new summary
    (``reply``; None when the step failed: the earlier summary stays), cut to the budget if the
    estimate says the summary ran over its share (the estimate errs high: transcript.py)."""
    summary = kept.summary if reply is None or not reply.strip() else reply.strip()
    limit = summary_tokens(budget) * BYTES_PER_TOKEN
    if len(summary.encode("utf-8", "surrogatepass")) > limit:
        summary = summary.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")
    return Transcript(epoch=kept.epoch, turns=kept.turns, dropped=kept.dropped, summary=summary).fit(budget)


def _cut(text: str) -> str:
    return text if len(text) <= TURN_CHARS else text[:TURN_CHARS] + " …"


__all__ = ["SUMMARY_SHARE", "SummaryRequest", "condense", "request", "summarised", "summary_tokens"]
