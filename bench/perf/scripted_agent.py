"""The benchmark agent run in-process: the planner's state machine, the scripted model and the calculator,
without Kafka or PostgreSQL (bench/perf/pipeline.py's in-process baseline, bench/perf/planner_gc.py's load)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

from agentstream.services.inference.backends.base import ChatMessage
from agentstream.services.inference.backends.scripted import scripted_reply
from agentstream.services.planner import machine
from agentstream.services.planner.state import RunState, ToolRequest
from agentstream.services.tools.builtin import evaluate
from agentstream.streams.core.events import InferenceCompleted, TaskSubmitted, ToolCallCompleted
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.topics import Topics

CALCULATOR = [ToolInfo("calculator", "Evaluate arithmetic.", {"type": "object"})]


def run_agent(i: int, *, topics: Topics | None = None, remember: Callable[[RunState], None] | None = None) -> int:
    """Run ``i`` of the benchmark agent ("What is i + 1?": model → calculator → model answer); returns its
    steps. ``topics``: also build the events each state would publish (``machine.outputs``), as the
    planner does; ``remember``: called with every state, as the planner caches it."""
    task = TaskSubmitted.build(run_id=f"r{i}", step=f"r{i}:task", service="bench", task=f"What is {i} + 1?",
                               tools=["calculator"], max_steps=5)
    state = machine.start(task, CALCULATOR, datetime.now(UTC))
    steps = 0
    while True:
        if remember is not None:
            remember(state)
        if topics is not None:
            machine.outputs(state, topics)
        if state.terminal:
            return steps
        step = state.pending_step_id or ""
        result: InferenceCompleted | ToolCallCompleted
        if state.pending_kind == "model":
            text, _ = scripted_reply(tuple(ChatMessage(role=m.role, content=m.content) for m in state.messages))
            result = InferenceCompleted.build(run_id=state.run_id, step=step, service="bench", text=text,
                                              finish_reason="stop")
        else:
            request = state.pending_request
            assert isinstance(request, ToolRequest), request
            value = evaluate(request.arguments["expression"])
            result = ToolCallCompleted.build(run_id=state.run_id, step=step, service="bench", tool="calculator",
                                             ok=True, result=json.dumps(value))
        state = machine.advance(state, result, datetime.now(UTC))
        steps += 1
