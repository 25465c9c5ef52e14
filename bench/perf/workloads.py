"""What the pipeline benchmark's runs do (``bench/perf/pipeline.py --workload``).

- ``plain`` (the default, and every figure before issue 32): a run of 3 steps on its own, model →
  calculator → model answer.
- ``conversations``: every run is a turn of a session (twice as many sessions as runs in flight, so turns
  of one session rarely wait for each other; each session has 5 turns, then a new one begins) whose model
  asks for two calculator calls at once, then answers: 4 steps (model, two parallel calls, model). Each turn starts from its session's transcript
  (loaded from PostgreSQL, sent to the model within the token budget) and writes it back; this is the
  conversations issue's "pipeline benchmark with sessions and parallel calls on".
- ``sessions`` and ``parallel``: one of the two each (the plain run as a turn of a session; the
  conversation's turn on its own), to tell their costs apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentstream.streams.client.agent_client import AgentClient


@dataclass(frozen=True)
class Workload:
    """A kind of run: its name and how many steps each run takes (the figures are per step)."""

    name: str
    steps: int
    #: Turns of each session (conversations, sessions).
    turns: int = 5

    async def submit(self, client: AgentClient, i: int, concurrency: int) -> str:
        """Submit run ``i`` (``concurrency``: runs in flight, which sizes the set of sessions)."""
        # Twice as many sessions as runs in flight, each of TURNS turns (then a new one): a session's next
        # turn comes once its previous one has mostly ended, as a user's does (fewer sessions make turns
        # queue behind their session's previous one, a cost of its own), and its transcript stays short.
        slot = 2 * max(1, concurrency)
        session = (f"bench-{i % slot}-{i // (slot * self.turns)}" if self.name in ("conversations", "sessions")
                   else None)
        if self.name in ("conversations", "parallel"):
            task = (f'[[tools:calculator {{"expression": "{i} + {i}"}} | calculator {{"expression": "{i} * 2"}}]] '
                    f"turn {i}")
            return await client.submit(task, tools=["calculator"], max_steps=6, prefetch=False, session=session)
        if session is not None:  # (the scripted model finds a turn's start by its directives)
            task = f'[[tool:calculator {{"expression": "{i} + {i}"}}]] turn {i}'
            return await client.submit(task, tools=["calculator"], max_steps=5, prefetch=False, session=session)
        return await client.submit(f"What is {i} + {i}?", tools=["calculator"], max_steps=5, prefetch=False)


WORKLOADS = {w.name: w for w in (Workload("plain", 3), Workload("conversations", 4), Workload("sessions", 3),
                                 Workload("parallel", 4))}

__all__ = ["WORKLOADS", "Workload"]
