"""What makes a task acceptable: one set of rules for the client that submits it and the planner that
consumes it.

``AgentClient.submit`` refuses a bad task before anything is published (``TaskRejected``). Tasks also
arrive from other producers (a Go or Java service, confluent-kafka, a replay tool), which skip that
check; the planner applies the same rules to every task it consumes and answers a task it cannot
accept with ``RunFailed(invalid_task)`` carrying the same reason, so whoever waits for the run learns
why. The limits also keep every event a run produces well inside a Kafka record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agentstream.streams.core.kinds import ON_TOOL_ERROR
from agentstream.streams.core.structured import MAX_OUTPUT_SCHEMA_BYTES, output_schema_problem

MAX_TASK_BYTES = 32 * 1024
MAX_SYSTEM_PROMPT_BYTES = 32 * 1024
MAX_STEPS_LIMIT = 1000
MAX_METADATA = 64
MAX_METADATA_BYTES = 16 * 1024
MAX_TOOLS = 128
MAX_NAME_BYTES = 256  # a tool name, a model name
MAX_RUN_ID_CHARS = 200
MAX_EVENT_ID_CHARS = 200
MAX_SESSION_ID_CHARS = 200
#: The most tokens any pipeline lets one model step generate (``AGENTSTREAM_MAX_TOKENS_LIMIT`` may not
#: exceed it; its own default is lower: streams/config/generation.py).
MAX_TOKENS_CEILING = 131_072
MAX_TEMPERATURE = 2.0
#: Stop strings per task (OpenAI-compatible servers accept at most 4) and the size of each.
MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 256
#: Seeds are unsigned 32-bit (llama.cpp's range; OpenAI-compatible servers and TensorRT-LLM take more).
MAX_SEED = 2**32 - 1


def text_problem(name: str, value: Any, limit: int, *, required: bool = False) -> str | None:
    """Why ``value`` is not acceptable text (not a str, empty when required, over ``limit`` UTF-8
    bytes, a NUL character, a lone surrogate), or None."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        return f"{name} must be a string, not {type(value).__name__}"
    if required and not value.strip():
        return f"the {name} is empty"
    if "\x00" in value:
        return f"the {name} contains a NUL character"
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return f"the {name} is not valid Unicode (a lone surrogate)"
    if size > limit:
        return f"the {name} is {size} bytes; the limit is {limit}"
    return None


def run_id_problem(run_id: Any) -> str | None:
    """A run id the system can key, store and print."""
    if not isinstance(run_id, str) or not run_id:
        return "the run id is empty"
    if len(run_id) > MAX_RUN_ID_CHARS:
        return f"the run id is {len(run_id)} characters; the limit is {MAX_RUN_ID_CHARS}"
    if not run_id.isprintable():
        return "the run id contains control characters"
    return None


def session_problem(session: Any) -> str | None:
    """A session id the system can key, store and print (None: the task is not a turn of a session). The
    same bounds as a run id: it is a Kafka key and a primary key too."""
    if session is None:
        return None
    if not isinstance(session, str) or not session.strip():
        return "the session id is empty"
    if len(session) > MAX_SESSION_ID_CHARS:
        return f"the session id is {len(session)} characters; the limit is {MAX_SESSION_ID_CHARS}"
    if not session.isprintable():
        return "the session id contains control characters"
    return None


def event_id_problem(event_id: Any) -> str | None:
    """Any non-empty string of at most ``MAX_EVENT_ID_CHARS`` characters identifies an event. agentstream's
    own ids are UUIDs (``agentstream.streams.core.events.event_id_for``), but nothing needs one: consumers drop
    copies by comparing ids, and history stores a UUID as itself and any other id as a UUIDv5 of it
    (``agentstream.streams.store.history.event_uuid``). An empty id would make unrelated events copies of each
    other, so it is refused (decoding checks this for every event: ``Event.problem``)."""
    if not isinstance(event_id, str) or not event_id:
        return "the event id is empty"
    if len(event_id) > MAX_EVENT_ID_CHARS:
        return f"the event id is {len(event_id)} characters; the limit is {MAX_EVENT_ID_CHARS}"
    return None


def task_problem(*, task: Any, tools: Any, max_steps: Any, deadline: Any, model: Any, system_prompt: Any,
                 metadata: Any, on_tool_error: Any, prefetch: Any, now: datetime) -> str | None:
    """Why this task cannot run, or None. ``tools`` is the list of names (their existence is checked
    against the tool catalogue separately); ``deadline`` an aware datetime or None."""
    problem = (text_problem("task", task, MAX_TASK_BYTES, required=True)
               or text_problem("system prompt", system_prompt, MAX_SYSTEM_PROMPT_BYTES)
               or text_problem("model", model, MAX_NAME_BYTES)
               or _tools_problem(tools) or _metadata_problem(metadata))
    if problem:
        return problem
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        return f"max_steps must be an integer, not {type(max_steps).__name__}"
    if not 1 <= max_steps <= MAX_STEPS_LIMIT:
        return f"max_steps must be between 1 and {MAX_STEPS_LIMIT} (got {max_steps})"
    if on_tool_error not in ON_TOOL_ERROR:
        return f"on_tool_error must be one of {', '.join(ON_TOOL_ERROR)} (got {on_tool_error!r})"
    if not isinstance(prefetch, bool):
        return "prefetch must be true or false"
    if deadline is not None:
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            return "the deadline must be a timezone-aware time"
        if deadline <= now:
            return "the deadline has already passed"
    return None


def generation_problem(*, output_schema: Any, max_tokens: Any, temperature: Any, top_p: Any, stop: Any, seed: Any,
                       max_tokens_limit: int) -> str | None:
    """Why a task's output schema or generation settings cannot be used, or None. Every one is optional
    (None, or ``[]`` for ``stop``). ``max_tokens_limit``: this pipeline's bound on ``max_tokens``
    (``GenerationSettings.max_tokens_limit``, which the client and the planner each read from their
    environment: a planner with a lower bound refuses what a client let through, with this reason)."""
    problem = (text_problem("output schema", output_schema, MAX_OUTPUT_SCHEMA_BYTES)
               or output_schema_problem(output_schema))
    if problem:
        return problem
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            return f"max_tokens must be an integer, not {type(max_tokens).__name__}"
        if not 1 <= max_tokens <= max_tokens_limit:
            return (f"max_tokens must be between 1 and {max_tokens_limit} (got {max_tokens}; the bound is "
                    "AGENTSTREAM_MAX_TOKENS_LIMIT)")
    if temperature is not None and not (_is_number(temperature) and 0 <= temperature <= MAX_TEMPERATURE):
        return f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} (got {temperature!r})"
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        return f"top_p must be a number above 0 and at most 1 (got {top_p!r})"
    if isinstance(stop, str) or not isinstance(stop, Sequence):
        return "stop must be a list of strings"
    if len(stop) > MAX_STOP_STRINGS:
        return f"a task may give at most {MAX_STOP_STRINGS} stop strings (got {len(stop)})"
    for text in stop:
        if text == "" or text is None:  # whitespace is a stop string like any other ("\n\n" is a common one)
            return "a stop string is empty"
        problem = text_problem("stop string", text, MAX_STOP_BYTES)
        if problem:
            return problem
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        return f"seed must be an integer from 0 to {MAX_SEED}"
    return None


def _is_number(value: Any) -> bool:
    """An int or float that is finite (NaN and infinity compare false with every bound, or pass them)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _tools_problem(tools: Any) -> str | None:
    if isinstance(tools, str) or not isinstance(tools, Sequence):
        return "tools must be a list of tool names"
    if len(tools) > MAX_TOOLS:
        return f"a task may name at most {MAX_TOOLS} tools (got {len(tools)})"
    for name in tools:
        problem = text_problem("tool name", name, MAX_NAME_BYTES, required=True)
        if problem:
            return problem
    return None


def _metadata_problem(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or len(metadata) > MAX_METADATA:
        return f"metadata must be a dict of at most {MAX_METADATA} string keys and values"
    size = 0
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return "metadata keys and values must be strings"
        problem = text_problem("metadata", key + value, MAX_METADATA_BYTES)
        if problem:
            return problem
        size += len(key.encode()) + len(value.encode())
    if size > MAX_METADATA_BYTES:
        return f"the metadata is {size} bytes; the limit is {MAX_METADATA_BYTES}"
    return None


__all__ = ["MAX_EVENT_ID_CHARS", "MAX_METADATA", "MAX_SEED", "MAX_STEPS_LIMIT", "MAX_STOP_BYTES", "MAX_STOP_STRINGS",
           "MAX_SYSTEM_PROMPT_BYTES", "MAX_TASK_BYTES", "MAX_TEMPERATURE", "MAX_TOKENS_CEILING", "event_id_problem",
           "generation_problem", "run_id_problem", "task_problem", "text_problem"]
