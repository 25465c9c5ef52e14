"""The planner's handler on an in-memory broker and history (tests/unit/planner_fakes.py): which tasks become
runs, what a new run records and publishes, the quotas (services/planner/admission.py), and copies."""

from __future__ import annotations

from agentstream.streams.config.quotas import Quotas
from agentstream.streams.core.events import InferenceCompleted, RunFailed, TaskSubmitted
from agentstream.streams.store.history import Lease

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, names, settings

TOOL_CALL = '{"action":"tool","tool":"calculator","arguments":{"expression":"2+2"}}'
ANSWER = '{"action":"final_answer","answer":"4"}'


def task(run_id: str, **kw) -> TaskSubmitted:
    payload = {"task": "What is 2 + 2?", "tools": ["calculator"], "max_steps": 5, **kw}
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", **payload)


def reply(step: str, text: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> InferenceCompleted:
    return InferenceCompleted.build(run_id=step.split(":")[0], step=step, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=prompt_tokens,
                                    completion_tokens=completion_tokens)


async def rig(**changes) -> PlannerRig:
    """A planner holding the only partition."""
    planner = PlannerRig(FakeKafka(), MemoryHistory(), settings(**changes))
    await planner.take(0)
    return planner


async def test_an_accepted_task_is_recorded_under_the_lease_and_its_first_requests_go_out():
    r = await rig()
    await r.feed(task("r"))
    state = r.store.state("r")
    assert (state.status, state.pending_step_id, state.version) == ("running", "r:0:model", 1)
    assert names(r.sent()) == ["RetrievalRequested", "InferenceRequested"]  # the prefetch, then the model
    (written,) = r.store.transitions
    assert [s.step_id for s in written.steps_requested] == ["r:prefetch", "r:0:model"]
    assert written.lease == Lease("", 0, 1) and written.run.expected_version is None
    assert written.events[0].event.event_id == task("r").event_id  # the task itself, then what it asked for


async def test_invalid_tasks_fail_at_once_with_the_reason_and_ask_nothing():
    r = await rig()
    await r.feed(task("bad-tool", tools=["calculator", "nope"]))
    await r.feed(task("bad-steps", max_steps=0))
    for run_id, reason in (("bad-tool", "unknown tools: nope"), ("bad-steps", "max_steps must be between 1")):
        state = r.store.state(run_id)
        assert (state.status, state.error_code) == ("failed", "invalid_task") and reason in (state.error or "")
    sent = r.sent()
    assert "InferenceRequested" not in names(sent)  # no model call
    outcomes = [e for e in sent if isinstance(e, RunFailed)]
    assert [(e.run_id, e.error_code) for e in outcomes] == [("bad-tool", "invalid_task"), ("bad-steps", "invalid_task")]


async def test_a_run_id_held_by_another_pipeline_is_refused_and_its_row_left_alone():
    kafka, store = FakeKafka(), MemoryHistory()
    other = PlannerRig(kafka, store, settings(topic_prefix="tenant-b."))
    await other.take(0)
    await other.feed(task("shared"))
    ours = PlannerRig(kafka, store, settings(topic_prefix="tenant-a."))
    await ours.take(0)
    mark = len(kafka.produced)
    await ours.feed(task("shared"))
    refused = ours.sent(since=mark)[-1]
    assert isinstance(refused, RunFailed) and refused.error_code == "invalid_task"
    assert "taken by a run of another cell" in refused.error
    assert kafka.produced[-1].topic == ours.topics.outcomes  # told on this pipeline's own outcomes
    assert store.state("shared").topic_prefix == "tenant-b." and store.runs["shared"].version == 1
    assert "shared" not in ours.planner.cache


async def test_a_copy_of_the_event_applied_last_republishes_the_same_events_and_an_older_one_nothing():
    r = await rig()
    await r.feed(task("r"))
    first = r.sent()
    mark = len(r.kafka.produced)
    await r.feed(task("r"))  # redelivered after a crash between the commit and the publish
    again = r.sent(since=mark)
    assert [e.event_id for e in again] == [e.event_id for e in first]
    assert len(r.store.transitions) == 1  # nothing recorded twice
    await r.feed(reply("r:0:model", TOOL_CALL))
    mark = len(r.kafka.produced)
    await r.feed(task("r"))  # the task is no longer the event applied last: dropped
    assert r.kafka.produced[mark:] == [] and len(r.store.transitions) == 2


async def test_a_task_over_the_max_steps_quota_fails_with_quota_exceeded():
    r = await rig(quotas=Quotas(max_steps=3))
    await r.feed(task("big", max_steps=5))
    await r.feed(task("small", max_steps=3))
    big = r.store.state("big")
    assert (big.status, big.error_code, big.error) == ("failed", "quota_exceeded",
                                                       "max_steps 5 is over the quota of 3")
    assert r.store.state("small").status == "running"


async def test_the_runs_in_flight_quota_counts_unfinished_runs():
    r = await rig(quotas=Quotas(runs_in_flight=1))
    await r.feed(task("one"))
    await r.feed(task("two"))
    two = r.store.state("two")
    assert (two.error_code, two.error) == ("quota_exceeded", "1 runs are in flight, the quota is 1")
    await r.feed(reply("one:0:model", ANSWER))  # one ends: room for another
    assert r.store.state("one").status == "completed"
    await r.feed(task("three"))
    assert r.store.state("three").status == "running"


async def test_a_run_over_its_token_quota_fails_after_the_step_that_passed_it():
    r = await rig(quotas=Quotas(tokens_per_run=100))
    await r.feed(task("under"))
    await r.feed(task("over"))
    await r.feed(reply("under:0:model", TOOL_CALL, prompt_tokens=60, completion_tokens=40))  # 100: on
    await r.feed(reply("over:0:model", TOOL_CALL, prompt_tokens=90, completion_tokens=11))  # 101: over
    assert r.store.state("under").pending_step_id == "under:1:tool"
    over = r.store.state("over")
    assert (over.status, over.error_code) == ("failed", "quota_exceeded")
    assert over.error == "the run used 101 tokens, over the quota of 100 per run"
    calls = [e.run_id for e in r.sent() if type(e).__name__ == "ToolCallRequested"]
    assert calls == ["under"]  # the tool call the run over its quota asked for never goes out
