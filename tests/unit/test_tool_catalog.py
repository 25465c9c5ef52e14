"""The tool catalogue's parts that need no broker: its topic's spec, the registration event, the version
rules (no downgrade, no silent change), and the error when the broker cannot be reached."""

from __future__ import annotations

import dataclasses
import io
import json
import struct
from datetime import UTC, datetime

import fastavro
import pytest

from agentstream.devstack.process import free_port
from agentstream.services.tools.builtin import BuiltinConfig, builtin_tools
from agentstream.services.tools.registry import tool
from agentstream.streams.catalog.tools import ToolCatalog, ToolInfo, current, judge, record_key, registration
from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.core import resources
from agentstream.streams.core.errors import DecodeError, ToolCatalogUnavailable
from agentstream.streams.core.events import ToolRegistered
from agentstream.streams.core.outages import KAFKA, outage_of
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry, schema_id
from agentstream.streams.kafka.topics import Topics

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
    catalog = ToolCatalog(f"127.0.0.1:{free_port()}", "agent.tools", codec, timeout_s=2, auth=KafkaAuth())
    with pytest.raises(ToolCatalogUnavailable, match="waiting for the broker") as info:
        await catalog.unknown(["calculator"])
    await catalog.close()
    # An outage of the broker for whoever reads: a planner handling a task waits it out instead of
    # dead-lettering the task after a few retries (seen in the chaos suite while the broker restarted).
    assert outage_of(info.value) == KAFKA


# -- versions: no downgrade, no silent change -----------------------------------------------------------

def _registered(info: ToolInfo, worker: str = "agentstream.tools") -> ToolRegistered:
    return registration(info, worker=worker)


V1 = dataclasses.replace(CALC, version=1)
V2 = dataclasses.replace(CALC, description="Evaluate arithmetic exactly.", version=2)


def test_a_higher_version_replaces_a_lower_one_is_refused_and_the_stored_one_stays():
    newer = _registered(V2, "new.tools")
    tools, refused = current([_registered(V1), newer, _registered(V1, "old.tools")])
    assert tools["calculator"] is newer
    assert [(r.event.registered_by, r.judgement) for r in refused] == [("old.tools", "older")]
    assert "version 1 is lower than the catalogue's 2" in refused[0].describe()
    assert judge(_registered(V2), _registered(V1)) == "newer" and judge(_registered(V1), None) == "new"


def test_the_same_version_with_other_metadata_is_a_conflict_and_the_first_stays():
    other = dataclasses.replace(V1, parameters={"type": "object", "properties": {"expr": {"type": "string"}}})
    tools, refused = current([_registered(V1), _registered(other, "other.tools")])
    assert tools["calculator"].parameters == _registered(V1).parameters
    assert [r.judgement for r in refused] == ["conflict"]
    assert "version 1 is already registered with other metadata" in refused[0].describe()
    # The same metadata from another worker group, or in another spelling of the same JSON, is no conflict.
    respelled = dataclasses.replace(_registered(V1, "other.tools"), parameters=json.dumps(V1.parameters, indent=1))
    first = _registered(V1)
    assert judge(respelled, first) == "same"
    assert current([first, respelled]) == ({"calculator": first}, [])


def test_requires_approval_is_turned_off_only_by_a_newer_version():
    guarded = dataclasses.replace(V1, requires_approval=True, version=2)
    for downgrade in (dataclasses.replace(guarded, requires_approval=False),   # same version: conflict
                      dataclasses.replace(guarded, requires_approval=False, version=1)):  # lower: older
        tools, refused = current([_registered(guarded), _registered(downgrade, "old.tools")])
        assert tools["calculator"].requires_approval is True and len(refused) == 1
    tools, refused = current([_registered(guarded), _registered(dataclasses.replace(guarded, requires_approval=False,
                                                                                    version=3))])
    assert tools["calculator"].requires_approval is False and refused == []


def test_registrations_from_before_versions_are_version_0(codec):
    """The schema before ``version`` is kept in schemas/history; its records read as version 0, which
    any versioned registration replaces and which cannot replace one."""
    old = json.loads((resources.schemas_dir() / "history" / "ToolRegistered.v0.avsc").read_text())
    assert "version" not in {f["name"] for f in old["fields"]}
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id(old)))
    fastavro.schemaless_writer(out, fastavro.parse_schema(old), {
        "event_id": "e", "run_id": "tools", "step_id": "tools:calculator", "parent_step_id": None, "attempt": 0,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC), "producer": {"service": "tools", "instance": "i"},
        "name": "calculator", "description": "Old.", "parameters": "{}", "requires_approval": False,
        "registered_by": "old.tools"})
    unversioned = codec.decode(out.getvalue())
    assert isinstance(unversioned, ToolRegistered) and unversioned.version == 0
    versioned = _registered(V1)
    assert current([versioned, unversioned])[0]["calculator"] is versioned
    assert current([unversioned, versioned])[0]["calculator"] is versioned


def test_each_distinct_registration_has_a_compaction_key_of_its_own():
    """Compaction keeps the latest record per key: keyed by name alone, an older worker's registration
    would, once compacted, be all that is left of the tool."""
    assert record_key(_registered(V1)) == record_key(_registered(V1, "other.tools"))  # same metadata: one slot
    keys = {record_key(_registered(t)) for t in (V1, V2, dataclasses.replace(V1, requires_approval=True))}
    assert len(keys) == 3 and all(k.startswith("calculator@") for k in keys)
    assert record_key(_registered(V2)).startswith("calculator@2:")


def test_a_tool_declares_its_version_and_the_built_ins_follow_their_setting():
    @tool(description="Versioned.", version=3)
    async def versioned(x: int) -> int:
        return x

    assert versioned.info().version == 3 and _registered(versioned.info()).version == 3
    with pytest.raises(ValueError, match="version must be at least 1"):
        tool(version=0)(versioned.fn)
    assert {t.version for t in builtin_tools()} == {1}
    config = BuiltinConfig.from_env({"AGENTSTREAM_BUILTIN_TOOLS_VERSION": "4"})
    assert config.version == 4 and {t.version for t in builtin_tools(config)} == {4}
