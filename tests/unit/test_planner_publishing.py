"""When a transition's outputs go out (services/planner/publishing.py), and what happens when the history
refuses a transition: on an in-memory broker and history."""

from __future__ import annotations

from agentstream.streams.core.errors import TransitionRejected
from agentstream.streams.core.events import InferenceCompleted, RunFailed, TaskSubmitted, ToolCallCompleted
from agentstream.streams.store.history import Transition

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, names, settings

TOOL_CALL = '{"action":"tool","tool":"calculator","arguments":{"expression":"2+2"}}'


def task(run_id: str) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", task="What is 2 + 2?",
                               tools=["calculator"], max_steps=5)


def reply(step: str, text: str) -> InferenceCompleted:
    return InferenceCompleted.build(run_id=step.split(":")[0], step=step, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=1, completion_tokens=1)


class WatchedHistory(MemoryHistory):
    """Notes what had been published when each transition was written; refuses the ``refuse``-th write."""

    def __init__(self, rig: list[PlannerRig], refuse: int | None = None) -> None:
        super().__init__()
        self.rig = rig
        self.refuse = refuse
        self.published_before: list[list[str]] = []

    async def write(self, transition: Transition) -> None:
        self.published_before.append(names(self.rig[0].sent()))
        if len(self.published_before) == self.refuse:
            raise TransitionRejected(f"PostgreSQL refused the transition of {transition.run.run_id}")
        await super().write(transition)


async def test_model_and_retrieval_requests_go_out_before_the_record_tool_calls_and_outcomes_after():
    rigs: list[PlannerRig] = []
    store = WatchedHistory(rigs)
    rigs.append(r := PlannerRig(FakeKafka(), store, settings()))
    await r.take(0)
    await r.feed(task("r"))
    await r.feed(reply("r:0:model", TOOL_CALL))
    await r.feed(ToolCallCompleted.build(run_id="r", step="r:1:tool", service="tools", tool="calculator", ok=True,
                                         result="4"))
    await r.feed(reply("r:2:model", '{"action":"final_answer","answer":"4"}'))
    started, tool_call, tool_result, answer = store.published_before
    assert started == ["RetrievalRequested", "InferenceRequested"]  # sent while the task's record was written
    assert tool_call == started  # the tool call waited for its record
    assert tool_result == [*started, "ToolCallRequested", "InferenceRequested"]  # the next model call did not
    assert answer == tool_result and names(r.sent()) == [*answer, "RunCompleted"]  # the outcome waited too


async def test_a_transition_the_history_refuses_fails_the_run_from_its_last_recorded_state():
    rigs: list[PlannerRig] = []
    store = WatchedHistory(rigs, refuse=2)
    rigs.append(r := PlannerRig(FakeKafka(), store, settings()))
    await r.take(0)
    await r.feed(task("r"))
    await r.feed(reply("r:0:model", TOOL_CALL))  # its transition is refused (its data, say)
    state = store.state("r")
    assert (state.status, state.error_code, state.version) == ("failed", "internal_error", 2)
    assert "could not be recorded" in (state.error or "") and r.planner.stats["rejected"] == 1
    outcome = r.sent()[-1]
    assert isinstance(outcome, RunFailed) and outcome.error_code == "internal_error"
    assert "ToolCallRequested" not in names(r.sent())
