"""Structured output (streams/core/structured.py, services/planner/answers.py): which output schemas a task may
carry, how the answer is shaped for the engine and checked by the planner, the retries and ``invalid_output``,
and what the outcome and the client's ``RunResult`` carry."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from jsonschema.validators import Draft202012Validator

from agentstream.services.planner import machine
from agentstream.services.planner.state import RunState
from agentstream.streams.client.outcomes import RunResult
from agentstream.streams.config.generation import GenerationSettings
from agentstream.streams.core import structured, task_rules
from agentstream.streams.core.actions import action_schema, instructions, parse_action
from agentstream.streams.core.errors import ActionError
from agentstream.streams.core.events import InferenceCompleted, RunCompleted, RunFailed, TaskSubmitted
from agentstream.streams.core.kinds import RUN_ERROR_CODES
from agentstream.streams.kafka.topics import Topics

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, settings

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TOPICS = Topics()
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
        "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}}}


def _task(schema: dict | str | None = CITY, **kw) -> TaskSubmitted:
    text = json.dumps(schema) if isinstance(schema, dict) else schema
    payload = {"task": "The largest city of France?", "tools": [], "max_steps": 6, "prefetch": False,
               "output_schema": text, **kw}
    return TaskSubmitted.build(run_id="r", step="r:task", service="client", created_at=NOW, **payload)


def _reply(state: RunState, answer: object) -> InferenceCompleted:
    text = json.dumps({"action": "final_answer", "answer": answer})
    return InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=10, completion_tokens=5)


def _problem(schema: object) -> str | None:
    return task_rules.generation_problem(output_schema=schema, max_tokens=None, temperature=None, top_p=None,
                                         stop=[], seed=None, max_tokens_limit=4096)


# -- which schemas a task may carry ------------------------------------------------------------------

@pytest.mark.parametrize(("schema", "reason"), [
    ('{"type": "objekt"}', "not valid JSON Schema"),
    ('{"type": "object", "required": "city"}', "not valid JSON Schema"),
    ("{not json", "not JSON"),
    ('["a list"]', "must be a JSON object"),
    ('{"$schema": "https://example.com/my-draft"}', "names no JSON Schema draft"),
    ('{"$ref": "https://example.com/schema.json"}', "points outside it"),
    ('{"properties": {"a": {"$ref": "#/$defs/missing"}}}', "points at nothing"),
    ('{"type": "string"}\x00', "NUL"),
    ("{" + '"description": "' + "x" * structured.MAX_OUTPUT_SCHEMA_BYTES + '"}', "bytes; the limit"),
    (42, "must be a string"),
])
def test_an_output_schema_that_is_not_usable_json_schema_is_refused_with_the_reason(schema, reason):
    problem = _problem(schema)
    assert problem is not None and reason in problem, problem


@pytest.mark.parametrize("schema", [
    None, json.dumps(CITY), '{"type": "string", "maxLength": 10}',
    '{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "definitions": {"n": {"type": "integer"}},'
    ' "properties": {"n": {"$ref": "#/definitions/n"}}}',
])
def test_valid_output_schemas_of_any_known_draft_are_accepted(schema):
    assert _problem(schema) is None


# -- the answer, for the engine and for the planner ----------------------------------------------------

def test_the_action_schema_carries_the_output_schema_in_its_final_answer_branch():
    schema = action_schema([], output_schema=CITY)
    answer_branch = schema["anyOf"][-1]
    assert answer_branch["properties"]["answer"] == CITY
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"action": "final_answer", "answer": {"city": "Paris", "population": 2_100_000}})
    assert not validator.is_valid({"action": "final_answer", "answer": {"city": "Paris"}})
    assert not validator.is_valid({"action": "final_answer", "answer": "Paris"})  # text no longer fits
    plain = action_schema([], max_answer_chars=50)["anyOf"][-1]["properties"]["answer"]
    assert plain == {"type": "string", "minLength": 1, "maxLength": 50}  # the setting, not the constant


def test_definitions_move_to_the_root_so_references_still_resolve_and_other_references_are_not_nested():
    with_defs = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": {"n": {"type": "integer"}},
                 "type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}
    schema = action_schema([], output_schema=with_defs)
    assert schema["$defs"] == with_defs["$defs"] and "$schema" not in schema["anyOf"][-1]["properties"]["answer"]
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"action": "final_answer", "answer": {"n": 3}})
    assert not validator.is_valid({"action": "final_answer", "answer": {"n": "3"}})
    rooted = {"type": "object", "properties": {"child": {"$ref": "#"}}}  # only valid at its own root
    assert action_schema([], output_schema=rooted)["anyOf"][-1]["properties"]["answer"] == {}


def test_the_instructions_show_the_schema_and_an_answer_of_its_shape():
    text = instructions([], output_schema=CITY)
    assert json.dumps(CITY, separators=(",", ":")) in text
    assert '"answer": {"city": "text", "population": 1}' in text and "Paris is the capital" not in text


def test_a_structured_final_answer_may_be_any_json_value_a_text_one_only_a_string():
    action = parse_action('{"action": "final_answer", "answer": {"city": "Paris"}}', structured=True)
    assert action.value == {"city": "Paris"} and json.loads(action.answer or "") == {"city": "Paris"}
    with pytest.raises(ActionError, match="non-empty string"):
        parse_action('{"action": "final_answer", "answer": {"city": "Paris"}}')
    with pytest.raises(ActionError):
        parse_action('{"action": "final_answer", "answer": null}', structured=True)


@pytest.mark.parametrize(("answer", "output"), [
    ({"city": "Paris", "population": 2}, '{"city":"Paris","population":2}'),
    ('{"city": "Paris", "population": 2}', '{"city":"Paris","population":2}'),  # JSON written as a string
    ('```json\n{"city": "Lyon", "population": 5}\n```', '{"city":"Lyon","population":5}'),
])
def test_a_valid_answer_becomes_compact_json(answer, output):
    assert structured.check_answer(answer, CITY) == structured.CheckedAnswer(output)


@pytest.mark.parametrize(("answer", "reason"), [
    ({"city": "Paris"}, "'population' is a required property"),
    ({"city": "Paris", "population": -1}, "less than the minimum of 0 (at $.population)"),
    ('{"city": "Paris", "population": "many"}', "'many' is not of type 'integer' (at $.population)"),
    ("Paris", "is not of type 'object'"),
])
def test_an_invalid_answer_says_what_is_wrong_and_where(answer, reason):
    checked = structured.check_answer(answer, CITY)
    assert checked.output is None and checked.problem is not None and reason in checked.problem, checked


def test_formats_are_checked():
    assert structured.check_answer("2026-13-45", {"type": "string", "format": "date"}).problem
    assert structured.check_answer("2026-12-06", {"type": "string", "format": "date"}).output == '"2026-12-06"'


# -- the machine: complete, retry, fail ----------------------------------------------------------------

def test_a_valid_structured_answer_completes_the_run_with_its_output():
    state = machine.start(_task(), [], NOW)
    state = machine.advance(state, _reply(state, {"city": "Paris", "population": 2_100_000}), NOW)
    assert state.status == "completed" and state.output == '{"city":"Paris","population":2100000}'
    assert state.answer == state.output
    (_, outcome), _ = machine.outputs(state, TOPICS)
    assert isinstance(outcome, RunCompleted) and outcome.output == state.output
    result = RunResult.of(outcome)
    assert result.output == {"city": "Paris", "population": 2_100_000} and result.answer == state.output
    assert RunState.from_json(state.to_json()) == state


def test_an_invalid_answer_goes_back_to_the_model_with_the_reason_then_the_run_fails_invalid_output():
    state = machine.start(_task(), [], NOW, generation=GenerationSettings(output_retries=2))
    for attempt in (1, 2):
        state = machine.advance(state, _reply(state, {"city": "Paris"}), NOW)
        assert state.status == "running" and state.output_failures == attempt
        hint = state.messages[-1]
        assert hint.role == "user" and "'population' is a required property" in hint.content
        (_, request), _ = machine.outputs(state, TOPICS)
        assert request.messages[-2].role == "assistant"  # the model sees its answer and the reason
    state = machine.advance(state, _reply(state, {"city": "Paris", "population": "many"}), NOW)
    assert (state.status, state.error_code) == ("failed", "invalid_output")
    assert "3 answers did not match the output schema" in (state.error or "") and "'many'" in (state.error or "")
    (_, outcome), _ = machine.outputs(state, TOPICS)
    assert isinstance(outcome, RunFailed) and outcome.error_code == "invalid_output" and outcome.steps == 3
    assert "invalid_output" in RUN_ERROR_CODES


def test_a_corrected_answer_after_a_retry_completes():
    state = machine.start(_task(), [], NOW)
    state = machine.advance(state, _reply(state, "Paris, about two million"), NOW)
    state = machine.advance(state, _reply(state, '{"city": "Paris", "population": 2100000}'), NOW)
    assert state.status == "completed" and json.loads(state.output or "") == {"city": "Paris", "population": 2100000}
    assert state.output_failures == 1 and state.step_index == 2


def test_without_retries_the_first_invalid_answer_fails_the_run():
    state = machine.start(_task(), [], NOW, generation=GenerationSettings(output_retries=0))
    state = machine.advance(state, _reply(state, {"city": 7}), NOW)
    assert (state.status, state.error_code) == ("failed", "invalid_output")


def test_a_run_without_a_schema_answers_text_as_before():
    state = machine.start(_task(None), [], NOW)
    assert json.loads(state.response_schema or "")["anyOf"][-1]["properties"]["answer"]["type"] == "string"
    state = machine.advance(state, _reply(state, "Paris"), NOW)
    assert (state.status, state.answer, state.output) == ("completed", "Paris", None)
    (_, outcome), _ = machine.outputs(state, TOPICS)
    assert outcome.output is None and RunResult.of(outcome).output is None


# -- admission: the same rules as submit ---------------------------------------------------------------

async def test_the_planner_refuses_a_task_with_an_invalid_output_schema_from_another_producer():
    r = PlannerRig(FakeKafka(), MemoryHistory(), settings())
    await r.take(0)
    await r.feed(_task('{"type": "objekt"}'))
    state = r.store.state("r")
    assert (state.status, state.error_code) == ("failed", "invalid_task")
    assert "not valid JSON Schema" in (state.error or "")
    assert [type(e).__name__ for e in r.sent()] == ["RunFailed"]  # no model call


def test_in_the_native_mode_the_answer_is_told_its_schema_and_checked_the_same_way():
    state = machine.start(_task(tool_calling="native"), [], NOW)
    assert state.response_schema is None  # native requests carry tools, not an action schema
    assert json.dumps(CITY, separators=(",", ":")) in state.messages[0].content
    reply = InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference",
                                     text='{"city": "Paris"}', finish_reason="stop")
    state = machine.advance(state, reply, NOW)
    assert state.status == "running" and "'population' is a required property" in state.messages[-1].content
    reply = InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference",
                                     text='{"city": "Paris", "population": 2}', finish_reason="stop")
    state = machine.advance(state, reply, NOW)
    assert state.status == "completed" and state.output == '{"city":"Paris","population":2}'
