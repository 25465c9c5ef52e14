"""Agent definitions (streams/core/agents.py): what a valid one is, its digest (what it covers and what
it does not), references and their resolution, what a task naming an agent may still set, and cycles."""

from __future__ import annotations

import json

import pytest

from agentstream import Agent, AgentRejected
from agentstream.streams.core.agents import (
    call_cycle,
    digest_of,
    parse_ref,
    ref_problem,
    resolve,
    task_override_problem,
)


def test_a_definition_keeps_its_fields_as_given_in_convenient_forms():
    agent = Agent(name="support", version=2, description="Answers customers.", system_prompt="Be brief.",
                  tools=["calculator", "order_status"], output_schema={"type": "object"}, temperature=1,
                  stop=["\n\n"], calls=["research"], handoffs=["billing@3"], max_steps=12, deadline_s=30)
    assert agent.tools == ("calculator", "order_status") and agent.stop == ("\n\n",)
    assert agent.calls == ("research",) and agent.handoffs == ("billing@3",)
    assert agent.schema_text == '{"type": "object"}' and agent.temperature == 1.0 and agent.deadline_s == 30.0
    assert agent.ref == "support@2" and "support" in agent.label and "version 2" in agent.label


@pytest.mark.parametrize(("fields", "reason"), [
    ({"name": "has space"}, "letters, digits"),
    ({"name": ""}, "letters, digits"),
    ({"name": "x" * 65}, "letters, digits"),
    ({"name": "a", "version": 0}, "version must be an integer from 1"),
    ({"name": "a", "version": True}, "version must be an integer"),
    ({"name": "a", "tools": ["calculator", "calculator"]}, "named twice"),
    ({"name": "a", "tools": [""]}, "tool name is empty"),
    ({"name": "a", "output_schema": '{"type": "nope"}'}, "output schema"),
    ({"name": "a", "output_schema": "not json"}, "not JSON"),
    ({"name": "a", "temperature": 3}, "temperature"),
    ({"name": "a", "max_tokens": 0}, "max_tokens"),
    ({"name": "a", "stop": ["a", "b", "c", "d", "e"]}, "stop strings"),
    ({"name": "a", "tool_calling": "telepathy"}, "tool_calling"),
    ({"name": "a", "on_tool_error": "shrug"}, "on_tool_error"),
    ({"name": "a", "max_steps": 0}, "max_steps"),
    ({"name": "a", "deadline_s": -1}, "deadline_s"),
    ({"name": "a", "deadline_s": float("inf")}, "deadline_s"),
    ({"name": "a", "calls": ["b@x"]}, "not an agent reference"),
    ({"name": "a", "calls": ["b", "b@2"]}, "names an agent twice"),
    ({"name": "a", "handoffs": ["b@0"]}, "not an agent reference"),
    ({"name": "a", "system_prompt": "nul\x00"}, "NUL"),
    ({"name": "a", "collection": ""}, "retrieval collection is empty"),
])
def test_an_invalid_definition_is_refused_when_made_with_the_reason(fields, reason):
    with pytest.raises(AgentRejected, match=reason):
        Agent(**fields)


def test_the_digest_covers_every_field_but_name_and_version_and_leaves_defaults_out():
    base = Agent(name="a", system_prompt="Be brief.", tools=["calculator"])
    assert base.definition() == {"system_prompt": "Be brief.", "tools": ["calculator"]}
    assert Agent(name="b", version=7, system_prompt="Be brief.", tools=("calculator",)).digest == base.digest
    assert Agent(name="a", system_prompt="Be brief.", tools=["calculator"], max_steps=8, prefetch=True).digest \
        == base.digest  # a field at its default is not part of it: a later field with a default changes nothing
    for change in ({"system_prompt": "Be briefer."}, {"description": "new"}, {"max_steps": 9},
                   {"calls": ["x"]}, {"handoffs": ["x"]}, {"model": "m"}, {"collection": "docs"}):
        assert Agent(**{"name": "a", "system_prompt": "Be brief.", "tools": ["calculator"], **change}).digest \
            != base.digest, change
    # One number, one digest; a schema given as text or as a mapping is one definition.
    assert Agent(name="a", temperature=1).digest == Agent(name="a", temperature=1.0).digest
    assert Agent(name="a", output_schema={"type": "object"}).digest \
        == Agent(name="a", output_schema='{ "type" :  "object" }').digest
    assert len(base.digest) == 16 and base.digest == digest_of(base.definition_json())
    assert digest_of(json.dumps(base.definition(), indent=2)) == base.digest  # spacing does not count


def test_a_definition_round_trips_through_its_json_and_ignores_later_fields_when_read():
    agent = Agent(name="a", version=3, system_prompt="x", output_schema={"type": "object", "required": ["b", "a"]},
                  stop=["END"], calls=["b@1"])
    again = Agent.from_definition("a", 3, agent.definition_json())
    assert again == agent and again.digest == agent.digest
    assert json.loads(again.schema_text or "")["required"] == ["b", "a"]  # key and item order kept
    later = json.dumps({**agent.definition(), "max_depth": 3})  # a field a later release added
    assert Agent.from_definition("a", 3, later) == agent
    with pytest.raises(AgentRejected, match="unknown field"):
        Agent.from_mapping({"name": "a", "temprature": 0.2})  # a typo in a file is refused
    with pytest.raises(AgentRejected, match="has no name"):
        Agent.from_mapping({"version": 1})
    with pytest.raises(AgentRejected, match="not JSON"):
        Agent.from_definition("a", 1, "{")


def test_references_parse_and_resolve_naming_what_exists():
    assert parse_ref("support") == ("support", None) and parse_ref("support@3") == ("support", 3)
    for bad in ("", "a b", "a@", "a@0", "a@-1", "@2", "a@1@2"):
        assert ref_problem(bad), bad
    assert ref_problem(None) and ref_problem(3)
    versions = {"support": {1: Agent(name="support"), 2: Agent(name="support", version=2, max_steps=3)},
                "billing": {1: Agent(name="billing")}}
    assert resolve("support", versions).version == 2 and resolve("support@1", versions).version == 1
    with pytest.raises(AgentRejected, match=r"unknown agent 'nope'; registered agents: billing, support"):
        resolve("nope", versions)
    with pytest.raises(AgentRejected, match=r"agent 'support' has no version 4; its versions: 1, 2"):
        resolve("support@4", versions)
    with pytest.raises(AgentRejected, match="registered agents: none"):
        resolve("support", {})


def test_a_task_naming_an_agent_may_set_only_its_text_deadline_metadata_and_session():
    unset = {"tools": [], "model": None, "system_prompt": None, "output_schema": None, "max_tokens": None,
             "temperature": None, "top_p": None, "stop": [], "seed": None, "tool_calling": None, "prefetch": True,
             "on_tool_error": "tell_model"}
    assert task_override_problem("support", unset) is None
    problem = task_override_problem("support", {**unset, "tools": ["calculator"], "temperature": 0.5})
    assert problem and "takes tools, temperature from the agent's definition" in problem
    assert "prefetch" in (task_override_problem("support", {**unset, "prefetch": False}) or "")
    assert "max_steps" in (task_override_problem("support", unset, also=["max_steps"]) or "")


def test_cycles_of_calls_are_found_with_the_path_that_closes_them():
    assert call_cycle({"a": ["b"], "b": ["c"], "c": []}, ["a"]) is None
    assert call_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}, ["a"]) == ["a", "b", "c", "a"]
    assert call_cycle({"a": ["a"]}, ["a"]) == ["a", "a"]
    assert call_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}, ["a"]) == ["b", "c", "b"]
    # A diamond is no cycle; a cycle not reachable from the start is not this batch's business.
    assert call_cycle({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}, ["a"]) is None
    assert call_cycle({"a": [], "x": ["y"], "y": ["x"]}, ["a"]) is None
    deep = {f"n{i}": [f"n{i + 1}"] for i in range(5000)}  # no recursion limit
    assert call_cycle(deep, ["n0"]) is None
