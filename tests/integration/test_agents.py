"""Named, versioned agents end to end (issue 34, part 1) on the real broker and database, with the scripted
model: definitions registered on ``agent.agents``, a task naming ``support`` (the latest) and one naming
``support@1`` run with those definitions (the system prompt reaches the model's request, the tools are the
definition's) and record the exact version; an unknown agent is refused with the names that exist, by the
client and, for a task published around it, by the planner."""

from __future__ import annotations

import json
import uuid

import pytest
import pytest_asyncio
from aiokafka import TopicPartition

from agentstream import Agent, AgentRejected, TaskRejected
from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.events import InferenceRequested, TaskSubmitted
from agentstream.testing import Pipeline, end_offsets, isolated, read_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

V1 = Agent(name="support", system_prompt="You are Support, first edition.", tools=["calculator"], max_steps=4)
V2 = Agent(name="support", version=2, system_prompt="You are Support, second edition.", tools=["calculator"],
           max_steps=6, calls=["research"], handoffs=["research"])
RESEARCH = Agent(name="research", description="Looks things up.", prefetch=False)
TOOL_TASK = '[[tool:calculator {"expression": "6 * 7"}]]'


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), WorkerOptions(backend="scripted")) as p:
        yield p


async def _model_requests(pipe: Pipeline, run_id: str) -> list[InferenceRequested]:
    """The run's model requests as they went out on agent.inference.requests."""
    tp = TopicPartition(pipe.client.topics.inference_requests, pipe.client.topics.partition_for(run_id))
    end = (await end_offsets(pipe.settings, [tp]))[tp]
    events = await read_events(pipe.settings, tp, 0, expect=end)
    return [e for e in events if isinstance(e, InferenceRequested) and e.run_id == run_id]


async def _state(pipe: Pipeline, run_id: str) -> dict:
    return json.loads(await (await pipe.client.pool()).fetchval("SELECT state FROM runs WHERE run_id = $1", run_id))


async def test_registered_agents_run_with_their_definition_and_record_the_version(pipe):
    registered = await pipe.client.agents.register(V1, RESEARCH, V2)  # research first: support@2 calls it
    assert sorted((a.ref, j) for a, j in registered) == [("research@1", "new"), ("support@1", "new"),
                                                        ("support@2", "newer")]
    assert {n: sorted(v) for n, v in (await pipe.client.agents.list()).items()} == {"research": [1], "support": [1, 2]}

    latest = await pipe.client.submit(TOOL_TASK, agent="support")
    pinned = await pipe.client.submit(TOOL_TASK, agent="support@1", metadata={"ticket": "7"})
    for run_id, ref, prompt, steps, tools in (
            (latest, "support@2", "second edition", 6, ["calculator", "agent__research", "handoff__research"]),
            (pinned, "support@1", "first edition", 4, ["calculator"])):
        result = await pipe.client.wait(run_id, timeout=30)
        assert result.ok and result.answer == "Based on the last step: calculator returned: 42", result
        state = await _state(pipe, run_id)
        assert (state["agent"], state["tools"], state["max_steps"]) == (ref, tools, steps)
        requests = await _model_requests(pipe, run_id)
        assert requests and all(prompt in r.messages[0].content for r in requests)  # what the model was sent
        assert [e["event_type"] for e in await pipe.client.events(run_id)].count("ToolCallRequested") == 1

    # The same definitions again: nothing new; a changed one under a registered version: refused.
    assert {j for _, j in await pipe.client.agents.register(V1, V2)} == {"same"}
    with pytest.raises(AgentRejected, match="already registered"):
        await pipe.client.agents.register(Agent(name="support", version=2, system_prompt="Changed."))


async def test_an_unknown_agent_is_refused_with_the_names_that_exist(pipe):
    await pipe.client.agents.register(V1, RESEARCH, V2)
    with pytest.raises(TaskRejected, match="unknown agent 'ghost'; registered agents: research, support"):
        await pipe.client.submit("Hello", agent="ghost")
    with pytest.raises(TaskRejected, match="agent 'support' has no version 5; its versions: 1, 2"):
        await pipe.client.submit("Hello", agent="support@5")
    # Published around the client's check (another producer): the planner refuses it the same way.
    run_id = f"run-{uuid.uuid4().hex[:16]}"
    task = TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="foreign", task="Hello", max_steps=8,
                               agent="ghost")
    await pipe.client.watch_outcomes()
    await (await pipe.client.runtime.send(pipe.client.topics.tasks, task))
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.error_code == "invalid_task" and "registered agents: research, support" in (result.error or "")


TRIAGE = Agent(name="triage", system_prompt="You triage.", calls=["research"], handoffs=["billing"], max_steps=6)
BILLING = Agent(name="billing", system_prompt="You do billing.", tools=["calculator"])


async def test_a_parent_calls_two_children_at_once_then_hands_the_conversation_over(pipe):
    await pipe.client.agents.register(RESEARCH, BILLING, TRIAGE)
    ask = ('[[tools:agent__research {"task": "the first charge"} | agent__research {"task": "the second charge"}]] '
           '[[tool:handoff__billing {}]] [[answer:refund issued]] Why was I charged twice?')
    session = f"chat-{uuid.uuid4().hex[:6]}"
    run_id = await pipe.client.submit(ask, agent="triage", session=session)
    result = await pipe.client.wait(run_id, timeout=60)
    assert result.ok and result.answer == "refund issued", result
    state = await _state(pipe, run_id)
    assert (state["agent"], state["handed_from"]) == ("billing@1", "triage@1")  # billing answered
    results = [m["content"] for m in state["messages"] if m["role"] == "tool" and m["name"] == "agent__research"]
    assert results == ["agent__research returned: You asked: the first charge",
                       "agent__research returned: You asked: the second charge"]  # in the order asked
    pool = await pipe.client.pool()
    children = await pool.fetch("SELECT run_id, status, state->>'agent' AS agent, state->>'parent_step_id' AS step "
                                "FROM runs WHERE state->>'parent_run_id' = $1 ORDER BY state->>'parent_step_id'", run_id)
    assert [(c["status"], c["agent"], c["step"]) for c in children] == [
        ("completed", "research@1", f"{run_id}:1:tool"), ("completed", "research@1", f"{run_id}:2:tool")]
    traces = {r["traceparent"].split("-")[1] for r in await pool.fetch(
        "SELECT traceparent FROM runs WHERE run_id = $1 OR state->>'parent_run_id' = $1", run_id)}
    assert len(traces) == 1  # one trace spans the tree

    # A recorded rerun re-executes the tree: its own children, each answered from the original child's record.
    from agentstream.replay.rerun import rerun

    replayed = await rerun(pipe.settings, run_id, options=WorkerOptions(backend="scripted"), timeout=60)
    assert replayed.finished and replayed.result.answer == "refund issued" and replayed.same_decisions, \
        replayed.diff.to_dict()
    kids = await pool.fetch("SELECT status, answer FROM runs WHERE state->>'parent_run_id' = $1 "
                            "ORDER BY state->>'parent_step_id'", replayed.run_id)
    assert [(k["status"], k["answer"]) for k in kids] == [("completed", "You asked: the first charge"),
                                                          ("completed", "You asked: the second charge")]
    # ... and replay diff compares the two trees step by step, children under their parents' steps.
    from agentstream.streams.replay.diff import children_of, diff_tree
    from agentstream.streams.replay.timeline import summaries

    found = await summaries(pool, [run_id, replayed.run_id])
    found.update(await summaries(pool, [*children_of(found[run_id]).values(),
                                        *children_of(found[replayed.run_id]).values()]))
    tree = diff_tree(found[run_id], found[replayed.run_id], lambda a, b: found)
    assert sorted(tree.children) == [1, 2] and not tree.changed
    assert [d.to_dict()["changed_steps"] for d in (c.run for c in tree.children.values())] == [[], []]

    # The session's next turn names triage again, and billing (to whom it was handed) answers.
    again = await pipe.client.submit("[[answer:still billing]] and now?", agent="triage", session=session)
    assert (await pipe.client.wait(again, timeout=30)).answer == "still billing"
    assert (await _state(pipe, again))["agent"] == "billing@1"


async def test_a_recorded_rerun_of_an_agent_run_uses_the_version_it_ran(pipe):
    from agentstream.replay.rerun import rerun

    await pipe.client.agents.register(V1, RESEARCH, V2)
    run_id = await pipe.client.submit(TOOL_TASK, agent="support@1")
    assert (await pipe.client.wait(run_id, timeout=30)).ok
    await pipe.client.agents.register(Agent(name="support", version=3, system_prompt="Third.", tools=[]))
    result = await rerun(pipe.settings, run_id, options=WorkerOptions(backend="scripted"), timeout=30)
    assert result.finished and result.same_decisions, result.diff.to_dict()
    assert (await _state(pipe, result.run_id))["agent"] == "support@1"  # not the newer support@3
