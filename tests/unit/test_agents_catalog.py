"""The agent catalogue (streams/catalog/agents.py) on the in-memory broker: its topic, the registration
event, the version rules (``judge``, ``fold``), what a batch may not do (unknown tools and agents, cycles of
calls, a changed definition, a downgrade), and registering and reading through the real reader."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from agentstream import Agent, AgentRejected
from agentstream.streams.catalog import agents as catalog
from agentstream.streams.catalog.agents import (
    AgentCatalog,
    batch_problems,
    fold,
    judge,
    record_key,
    register,
    registration,
)
from agentstream.streams.catalog.reader import CompactedCatalog
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.catalog.tools import registration as tool_registration
from agentstream.streams.core.events import AgentRegistered
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import InMemoryBroker

SUPPORT = Agent(name="support", system_prompt="Help.", tools=["calculator"])


@pytest.fixture
async def broker(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[InMemoryBroker]:
    """An in-memory broker whose catalogue readers (tools and agents) read its logs."""
    async with InMemoryBroker() as memory:
        async def open_(self: CompactedCatalog) -> object:
            consumer = memory.consumer(auto_offset_reset="earliest")
            consumer.assign([self._tp])
            return consumer

        monkeypatch.setattr(CompactedCatalog, "_open", open_)
        memory.publish(memory.topics.tools, tool_registration(ToolInfo("calculator", "Arithmetic."), worker="w"))
        yield memory


def test_the_agents_topic_is_compacted_one_partition_and_prefixed():
    topics = Topics("t1.", partitions=8)
    spec = next(s for s in topics.specs() if s.name == topics.agents)
    assert spec.name == "t1.agent.agents" and spec.partitions == 1 and spec.configs["cleanup.policy"] == "compact"


def test_a_registration_round_trips_and_its_id_and_key_follow_the_definition():
    codec = Codec(LocalRegistry())
    event = registration(SUPPORT, by="me")
    decoded = codec.decode(codec.encode(event))
    assert isinstance(decoded, AgentRegistered) and decoded == event
    assert (decoded.run_id, decoded.step_id, decoded.digest) == ("agents", "agents:support@1", SUPPORT.digest)
    assert Agent.from_definition(decoded.name, decoded.version, decoded.definition) == SUPPORT
    assert registration(SUPPORT, by="someone else").event_id == event.event_id  # who registers is not what
    changed = Agent(name="support", system_prompt="Help more.", tools=["calculator"])
    assert registration(changed).event_id != event.event_id
    assert record_key(event) == f"support@1:{SUPPORT.digest}"
    lying = AgentRegistered.build(run_id="agents", step="agents:support@1", service="x", name="support", version=1,
                                  definition=SUPPORT.definition_json(), digest="0000")
    assert record_key(lying) == record_key(event)  # the digest is computed, not taken from the event


def _event(version: int, prompt: str = "Help.", name: str = "support") -> AgentRegistered:
    return registration(Agent(name=name, version=version, system_prompt=prompt))


def test_the_version_rules():
    v1, v2 = _event(1), _event(2)
    assert judge(v1, None) == "new" and judge(v2, {1: v1}) == "newer"
    assert judge(_event(1), {1: v1, 2: v2}) == "same"  # an earlier version, registered again as it was
    assert judge(_event(2, "Other."), {1: v1, 2: v2}) == "conflict"
    assert judge(_event(1, "Other."), {1: v1, 2: v2}) == "conflict"
    v3, v5 = _event(3), _event(5)
    assert judge(v3, {1: v1, 5: v5}) == "older"  # a new version under the latest


def test_readers_fold_in_publication_order_keeping_every_version_and_the_first_of_a_conflict():
    first, rival = _event(2, "First."), _event(2, "Rival.")
    versions, refused = fold([_event(1), first, rival, _event(1), _event(3), _event(2, "First."), _event(1, "Late.")])
    assert sorted(versions["support"]) == [1, 2, 3] and versions["support"][2] == first
    assert [(r.event.version, r.judgement) for r in refused] == [(2, "conflict"), (1, "conflict")]
    assert "already registered with another definition" in refused[0].describe()
    _, refused = fold([_event(3), _event(2)])
    assert refused[0].judgement == "older" and "lower than the catalogue's latest, 3" in refused[0].describe()


def _view(*agents: Agent) -> dict[str, dict[int, Agent]]:
    view: dict[str, dict[int, Agent]] = {}
    for a in agents:
        view.setdefault(a.name, {})[a.version] = a
    return view


def test_a_batch_is_refused_for_unknown_tools_and_agents_naming_what_exists():
    existing = _view(Agent(name="billing"), Agent(name="billing", version=2))
    batch = [Agent(name="triage", tools=["calculator", "teleport"], calls=["research", "billing@3"],
                   handoffs=["billing", "ghost"])]
    problems = batch_problems(batch, existing, ["calculator", "order_status"])
    assert any("unknown tool(s) teleport; registered tools: calculator, order_status" in p for p in problems)
    assert any("calls 'research': unknown agent 'research'; registered agents: billing" in p for p in problems)
    assert any("calls 'billing@3': agent 'billing' has no version 3; its versions: 1, 2" in p for p in problems)
    assert any("hands off to 'ghost'" in p for p in problems)
    assert len(problems) == 4
    # Agents of the same batch may name each other; tools are not checked without a tool catalogue.
    assert batch_problems([Agent(name="triage", tools=["x"], calls=["research"]), Agent(name="research")],
                          existing, None) == []


def test_a_batch_is_refused_for_a_cycle_of_calls_but_handoffs_may_go_back_and_forth():
    (cycle,) = batch_problems([Agent(name="a", calls=["b"]), Agent(name="b", calls=["a"])], {}, None)
    assert "cycle: a@1 → b@1 → a@1" in cycle
    (own,) = batch_problems([Agent(name="a", calls=["a"])], {}, None)
    assert "a@1 → a@1" in own
    both = batch_problems([Agent(name="a", calls=["a"]), Agent(name="t", tools=["x"])], {}, ["y"])
    assert len(both) == 2 and "cycle" in both[1]  # reported with the other problems, not after them
    # Through the catalogue: b (registered) calls a by name, so a new a that calls b closes a cycle...
    existing = _view(Agent(name="a"), Agent(name="b", calls=["a"]))
    assert batch_problems([Agent(name="a", version=2, calls=["b"])], existing, None)
    # ...but not when b pins the old a, which calls nobody.
    pinned = _view(Agent(name="a"), Agent(name="b", calls=["a@1"]))
    assert batch_problems([Agent(name="a", version=2, calls=["b"])], pinned, None) == []
    assert batch_problems([Agent(name="a", handoffs=["b"]), Agent(name="b", handoffs=["a"])], {}, None) == []


def test_a_batch_is_refused_for_a_changed_definition_or_a_downgrade():
    existing = _view(Agent(name="a"), Agent(name="a", version=3))
    (changed,) = batch_problems([Agent(name="a", version=3, system_prompt="new")], existing, None)
    assert "version 3 is already registered in the catalogue with another definition" in changed
    assert "register the change as version 4" in changed
    (lower,) = batch_problems([Agent(name="a", version=2)], existing, None)
    assert "a new version must be higher than the latest, 3; its versions: 1, 3" in lower
    assert batch_problems([Agent(name="a", version=3)], existing, None) == []  # the same: nothing to do
    assert batch_problems([Agent(name="a", version=4), Agent(name="a", version=5)], existing, None) == []
    (twice,) = batch_problems([Agent(name="n"), Agent(name="n", description="other")], {}, None)
    assert "in this batch" in twice


async def test_register_publishes_a_batch_once_and_readers_see_every_version(broker: InMemoryBroker):
    runtime = broker.runtime
    tools = ToolCatalog.for_runtime(runtime)
    v1 = SUPPORT
    v2 = Agent(name="support", version=2, system_prompt="Help well.", tools=["calculator"], calls=["research"])
    research = Agent(name="research", description="Looks things up.")
    result = await register(runtime, [v1, research], by="test", tools=tools)
    assert [(a.ref, j) for a, j in result] == [("research@1", "new"), ("support@1", "new")]
    result = await register(runtime, [v1, v2], tools=tools)  # v1 again: nothing to publish
    assert [(a.ref, j) for a, j in result] == [("support@1", "same"), ("support@2", "newer")]
    published = broker.events(runtime.topics.agents, AgentRegistered)
    assert [e.step_id for e in published] == ["agents:research@1", "agents:support@1", "agents:support@2"]
    assert [r.key for r in broker.records(runtime.topics.agents)] == [record_key(e).encode() for e in published]
    assert published[0].registered_by == "test" and published[1].registered_by  # default: host and process

    reader = AgentCatalog.for_runtime(runtime, ttl_s=60)
    versions = await reader.all()
    assert {n: sorted(v) for n, v in versions.items()} == {"research": [1], "support": [1, 2]}
    assert await reader.resolve("support") == v2 and await reader.resolve("support@1") == v1
    late = Agent(name="late")
    await register(runtime, [late])
    assert await reader.resolve("late") == late  # unknown in the cached view: read again
    with pytest.raises(AgentRejected, match="registered agents: late, research, support"):
        await reader.resolve("nope")
    with pytest.raises(AgentRejected, match="its versions: 1, 2"):
        await reader.resolve("support@7")
    await reader.close()


async def test_a_refused_batch_publishes_nothing_and_says_everything(broker: InMemoryBroker):
    runtime = broker.runtime
    await register(runtime, [SUPPORT])
    before = len(broker.records(runtime.topics.agents))
    with pytest.raises(AgentRejected) as refused:
        await register(runtime, [Agent(name="ok"), Agent(name="support", system_prompt="changed"),
                                 Agent(name="bad", tools=["teleport"])], tools=ToolCatalog.for_runtime(runtime))
    message = str(refused.value)
    assert message.startswith("nothing was registered:\n  - ")
    assert "version 1 is already registered" in message and "unknown tool(s) teleport" in message
    assert len(broker.records(runtime.topics.agents)) == before


async def test_readers_ignore_what_the_rules_refuse_published_anyway(broker: InMemoryBroker, caplog):
    runtime, topic = broker.runtime, broker.runtime.topics.agents
    first, rival = registration(SUPPORT), registration(Agent(name="support", system_prompt="Rival."))
    broker.publish(topic, first, key=record_key(first))
    broker.publish(topic, rival, key=record_key(rival))  # a race between two registrars: the first stays
    broken = AgentRegistered.build(run_id="agents", step="agents:broken@1", service="x", name="broken", version=1,
                                   definition='{"max_steps": -1}', digest="")
    broker.publish(topic, broken, key=record_key(broken))
    with caplog.at_level(logging.WARNING, logger=catalog.__name__):
        reader = AgentCatalog.for_runtime(runtime)
        versions = await reader.refresh()
    assert versions == {"support": {1: SUPPORT}}
    assert "already registered with another definition" in caplog.text and "max_steps" in caplog.text
    await reader.close()
