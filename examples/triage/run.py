"""The triage example: a triage agent that asks a research sub-agent (two questions at once) and hands a
billing question over to the billing agent, in a conversation (docs/agents.md, "Calls and handoffs").

    agentstream dev up
    agentstream worker all &              # the scripted model (default); --backend llamacpp for the CPU model
    python examples/triage/run.py         # registers examples/triage/agents.yaml, then runs two turns

With the scripted model (the default backend) the customer's messages carry the model's moves as
directives (``--scripted``, on by default), so the run takes the same path every time; with a real model
(``--no-scripted``) the model decides, and a small CPU model may well not call anyone.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path

from agentstream import AgentClient
from agentstream.streams.client.agents import load

HERE = Path(__file__).resolve().parent
QUESTION = "I was charged twice for my subscription this month. Why, and can I get my money back?"
#: What the scripted model plays for triage: two research questions at once, then a handoff; billing answers.
MOVES = ('[[tools:agent__research {"task": "Which charges did the customer get this month?"} | '
         'agent__research {"task": "What does the refund policy say about double charges?"}]] '
         '[[tool:handoff__billing {}]] [[answer:You were charged twice by mistake; the second charge is refunded.]] ')
FOLLOW_UP = "[[answer:The refund reaches your card within five working days.]] When will I see the refund?"


async def main(scripted: bool) -> None:
    async with AgentClient() as client:
        for agent, judgement in await client.agents.register(*load(str(HERE / "agents.yaml"))):
            print(f"registered {agent.ref}: {judgement}")
        session = f"customer-{uuid.uuid4().hex[:6]}"
        first = await client.submit((MOVES if scripted else "") + QUESTION, agent="triage", session=session)
        result = await client.wait(first, timeout=120)
        print(f"\nturn 1 ({first}): {result.status}: {result.answer or result.error}")
        pool = await client.pool()
        state = await pool.fetchrow("SELECT state->>'agent' AS agent, state->>'handed_from' AS handed FROM runs "
                                    "WHERE run_id = $1", first)
        print(f"  answered by {state['agent']}" + (f" (handed over from {state['handed']})" if state["handed"] else ""))
        for child in await pool.fetch(
                "SELECT run_id, status, answer, state->>'parent_step_id' AS step FROM runs "
                "WHERE state->>'parent_run_id' = $1 ORDER BY state->>'parent_step_id'", first):
            print(f"  └ {child['step']}: research run {child['run_id']} {child['status']}: {child['answer']}")
        second = await client.submit(FOLLOW_UP if scripted else "When will I see the refund?", agent="triage",
                                     session=session)
        result = await client.wait(second, timeout=120)
        agent = await pool.fetchval("SELECT state->>'agent' FROM runs WHERE run_id = $1", second)
        print(f"\nturn 2 ({second}), naming triage again: {agent} answers: {result.answer or result.error}")
        print(f"\nsee the whole tree: agentstream replay show {first}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripted", action=argparse.BooleanOptionalAction, default=True,
                        help="prefix the scripted model's moves to the customer's messages (default: on)")
    asyncio.run(main(parser.parse_args().scripted))
