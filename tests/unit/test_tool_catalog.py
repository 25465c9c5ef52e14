"""The tool catalogue's parts that need no broker: its topic's spec, the registration event, and the
error when the broker cannot be reached."""

from __future__ import annotations

import json

import pytest

from agentstream.devstack.process import free_port
from agentstream.streams.codec import Codec, DecodeError
from agentstream.streams.events import ToolRegistered
from agentstream.streams.registry import LocalRegistry
from agentstream.streams.tool_catalog import ToolCatalog, ToolCatalogUnavailable, ToolInfo, registration
from agentstream.streams.topics import Topics

CALC = ToolInfo("calculator", "Evaluate arithmetic.", {"type": "object", "properties": {"expression": {"type": "string"}}})


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(LocalRegistry())


def test_the_tools_topic_is_compacted_one_partition_and_prefixed():
    topics = Topics("t1.", partitions=8)
    spec = next(s for s in topics.specs() if s.name == topics.tools)
    assert spec.name == "t1.agent.tools"
    assert spec.partitions == 1 and spec.configs["cleanup.policy"] == "compact"


def test_a_registration_round_trips_and_its_id_follows_its_content(codec):
    event = registration(CALC, worker="agentstream.tools")
    decoded = codec.decode(codec.encode(event))
    assert isinstance(decoded, ToolRegistered) and decoded == event
    assert (decoded.run_id, decoded.step_id, decoded.name) == ("tools", "tools:calculator", "calculator")
    assert json.loads(decoded.parameters) == CALC.parameters and decoded.registered_by == "agentstream.tools"
    assert registration(CALC, worker="agentstream.tools").event_id == event.event_id  # a restart repeats it
    changed = ToolInfo(CALC.name, "Evaluate arithmetic, exactly.", CALC.parameters)
    assert registration(changed, worker="agentstream.tools").event_id != event.event_id
    assert registration(CALC, worker="other.tools").event_id != event.event_id


def test_a_registration_without_a_name_is_invalid(codec):
    nameless = registration(ToolInfo("", "No name."), worker="w")
    with pytest.raises(DecodeError) as info:
        codec.decode(codec.encode(nameless))
    assert info.value.kind == "invalid" and "name is empty" in info.value.reason


async def test_an_unreachable_broker_is_a_catalogue_error_not_a_connection_error(codec):
    catalog = ToolCatalog(f"127.0.0.1:{free_port()}", "agent.tools", codec, timeout_s=2)
    with pytest.raises(ToolCatalogUnavailable, match="waiting for the broker"):
        await catalog.unknown(["calculator"])
    await catalog.close()
