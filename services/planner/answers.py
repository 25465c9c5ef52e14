"""What a run's model steps generate and what its answer must be: the pure helpers ``machine.py`` uses for a
task's generation settings and its structured output.

- ``sampling``: the task's generation settings, with this planner's defaults filled in once, when the run
  starts (streams/config/generation.py); the run's state keeps them.
- ``check``: a final answer held against the task's output schema (streams/core/structured.py). Whatever
  the engine enforced, the planner checks: an invalid answer goes back to the model with the reason
  (``retry_message``), up to the run's ``output_retries``; then the run fails with ``invalid_output``.
"""

from __future__ import annotations

import json
from typing import Any

from agentstream.services.planner.state import RunState, Sampling
from agentstream.streams.config.generation import GenerationSettings
from agentstream.streams.core.events import Message, TaskSubmitted
from agentstream.streams.core.structured import CheckedAnswer, check_answer, example, load_schema


def sampling(task: TaskSubmitted, generation: GenerationSettings) -> Sampling:
    """The run's generation settings: the task's, else the planner's defaults. Values the task rules
    refuse are not repaired here: such a task fails at once (``invalid_task``) and never asks the model."""
    return Sampling(max_tokens=task.max_tokens if task.max_tokens is not None else generation.max_tokens,
                    temperature=task.temperature if task.temperature is not None else 0.0,
                    top_p=task.top_p, stop=tuple(task.stop or ()), seed=task.seed)


def check(state: RunState, value: Any) -> CheckedAnswer:
    """``value`` (a final answer as the model gave it) against the run's output schema."""
    schema = load_schema(state.output_schema)
    if schema is None:  # admission refuses such a task; a state can only hold one if written by hand
        return CheckedAnswer(None, "the run's output schema is not a JSON object")
    return check_answer(value, schema)


def native_note(schema: dict[str, Any] | None) -> str:
    """What the native mode's system message adds for a run with an output schema: its answer is JSON of
    the schema, not text. (Native requests carry tools, not an action schema, so nothing guides the
    answer's shape there; the check still holds it to the schema.)"""
    if schema is None:
        return ""
    return ("\nThe final answer is JSON (no other text) matching this JSON Schema: "
            f"{json.dumps(schema, separators=(',', ':'))}\nFor example: {json.dumps(example(schema))}")


def retry_message(problem: str) -> Message:
    """What the model is told after an answer that does not match the output schema."""
    return Message(role="user", content=f"That answer does not match the required output schema: {problem}. "
                                        'Reply with one final_answer whose "answer" is JSON matching the schema.')


__all__ = ["check", "native_note", "retry_message", "sampling"]
