"""Where definitions come from (streams/client/agents.py): a YAML file (one, a list, ``agents:``, several
documents; PyYAML from the ``deploy`` extra) or a module of ``Agent`` objects; and ``agentstream agent``."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentstream import Agent, AgentRejected, MissingExtra
from agentstream.cli import app
from agentstream.streams.client.agents import from_module, from_yaml, load

YAML = """\
name: support
version: 2
description: Answers customers' questions.
system_prompt: |
  You are a support agent. Be brief.
tools: [calculator]
temperature: 0.2
max_steps: 12
deadline_s: 60
output_schema:
  type: object
  properties: {answer: {type: string}}
  required: [answer]
calls: [research]
handoffs: [billing@1]
"""


def test_a_yaml_file_holds_one_definition_or_many():
    (one,) = from_yaml(YAML, source="agents.yaml")
    assert one.ref == "support@2" and one.system_prompt == "You are a support agent. Be brief.\n"
    assert one.tools == ("calculator",) and one.temperature == 0.2 and one.deadline_s == 60.0
    assert one.calls == ("research",) and one.handoffs == ("billing@1",) and one.source == "agents.yaml"
    assert '"required": ["answer"]' in (one.schema_text or "")
    listed = from_yaml("- {name: a}\n- {name: b, version: 3}\n")
    assert [a.ref for a in listed] == ["a@1", "b@3"]
    assert [a.ref for a in from_yaml("agents:\n  - name: a\n  - name: b\n")] == ["a@1", "b@1"]
    assert [a.ref for a in from_yaml("name: a\n---\nname: b\n---\n")] == ["a@1", "b@1"]


@pytest.mark.parametrize(("text", "reason"), [
    ("name: a\ntemprature: 0.2\n", "unknown field"),
    ("name: a\nmax_steps: lots\n", "max_steps"),
    ("- 3\n", "must be a mapping"),
    ("just text\n", "a document must be"),
    ("name: [unclosed\n", "not valid YAML"),
    ("", "defines no agent"),
    ("version: 2\n", "has no name"),
])
def test_a_bad_yaml_file_is_refused_saying_where_and_why(text, reason):
    with pytest.raises(AgentRejected, match=reason):
        from_yaml(text, source="bad.yaml")


def test_yaml_needs_the_deploy_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(MissingExtra, match=r"agentstream\[deploy\]"):
        from_yaml(YAML)


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proj"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "agents.py").write_text(textwrap.dedent("""
        from agentstream import Agent

        research = Agent(name="research", description="Looks things up.")
        support = Agent(name="support", system_prompt="Help.", calls=["research"])
        ALSO_SUPPORT = support  # the same object twice is one definition
        NOT_AN_AGENT = {"name": "x"}
    """))
    (root / "mypkg" / "empty.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_module_gives_its_top_level_agents(package: Path):
    agents = from_module("mypkg.agents")
    assert [a.ref for a in agents] == ["research@1", "support@1"] and agents[1].source == "mypkg.agents"
    assert load("mypkg.agents") == agents
    with pytest.raises(AgentRejected, match="defines no Agent"):
        from_module("mypkg.empty")
    with pytest.raises(AgentRejected, match=r"no module 'mypkg\.nothing'"):
        from_module("mypkg.nothing")


def test_load_reads_a_file_when_given_one(tmp_path: Path):
    path = tmp_path / "agents.yml"
    path.write_text(YAML)
    assert [a.ref for a in load(str(path))] == ["support@2"]
    with pytest.raises(AgentRejected, match="no file"):
        load(str(tmp_path / "missing.yaml"))


def test_the_agent_commands_are_there():
    result = CliRunner().invoke(app, ["agent", "--help"])
    assert result.exit_code == 0
    for command in ("register", "list", "show"):
        assert command in result.output
    assert "--agent" in CliRunner().invoke(app, ["submit", "--help"]).output


def test_an_agent_object_is_public_and_checked_when_made():
    assert Agent(name="a").ref == "a@1"
    with pytest.raises(AgentRejected):
        Agent(name="a b")
