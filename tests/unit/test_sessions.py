"""Conversations: the transcript and its budget (services/planner/transcript.py), a turn's start from it
(machine.begin), and the planner's ordering of a session's turns (services/planner/sessions.py) on the
in-memory broker and history."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from agentstream.services.inference.backends.base import ChatMessage
from agentstream.services.inference.backends.scripted import scripted_reply
from agentstream.services.planner import machine, transcript
from agentstream.services.planner.state import RunState
from agentstream.services.planner.transcript import Transcript, Turn, estimate_tokens
from agentstream.streams.core.events import (
    InferenceCompleted,
    InferenceRequested,
    RunCancelRequested,
    RunCompleted,
    RunFailed,
    SessionUpdated,
    TaskSubmitted,
)
from agentstream.streams.core.task_rules import session_problem
from agentstream.streams.kafka.topics import Topics

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, settings

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TOPICS = Topics()


def turn(i: int, size: int = 30) -> Turn:
    return Turn.of(f"r{i}", f"question {i} " + "x" * size, json.dumps({"action": "final_answer", "answer": f"a{i}"}),
                   f"a{i}")


# -- the transcript ---------------------------------------------------------------------------------
def test_the_token_estimate_errs_high_and_counts_bytes():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1 and estimate_tokens("abcd") == 2
    assert estimate_tokens("é" * 3) == 2  # six bytes
    t = turn(1)
    assert t.tokens == estimate_tokens(t.user) + estimate_tokens(t.reply) + 8


def test_fit_drops_the_oldest_turns_until_the_rest_is_within_the_budget():
    full = Transcript(epoch=2, turns=tuple(turn(i) for i in range(5)), dropped=1)
    each = full.turns[0].tokens
    assert full.fit(10 * each) is full  # within: unchanged
    cut = full.fit(3 * each)
    assert [t.run_id for t in cut.turns] == ["r2", "r3", "r4"] and cut.dropped == 3 and cut.epoch == 2
    assert cut.tokens <= 3 * each
    assert full.fit(3 * each - 1).turns == full.turns[3:]  # one token short of three turns: two


def test_fit_never_keeps_a_turn_that_alone_is_over_the_budget():
    big = Transcript(turns=(turn(1), turn(2, size=3000)))
    cut = big.fit(500)
    assert cut.turns == () and cut.dropped == 2 and cut.messages() == ()


def test_a_turn_reads_back_as_stored():
    t = turn(3)
    assert Turn.from_dict(t.to_dict()) == t
    assert Turn.from_dict({k: v for k, v in t.to_dict().items() if k != "tokens"}) == t  # recomputed


def test_session_ids_are_checked_like_run_ids():
    assert session_problem(None) is None and session_problem("chat-1") is None
    assert session_problem("") == "the session id is empty"
    assert "control characters" in (session_problem("a\nb") or "")
    assert "limit is 200" in (session_problem("s" * 201) or "")
    assert "empty" in (session_problem(7) or "")


def test_a_turns_run_id_is_drawn_on_its_sessions_partition():
    topics = Topics(partitions=8)
    for session in ("chat-1", "chat-2", "ünïcode"):
        run_id = topics.run_id_for_session(session)
        assert topics.partition_for(run_id) == topics.partition_for(session) and run_id.startswith("run-")


# -- the machine ------------------------------------------------------------------------------------
def _task(run_id: str = "t3", session: str | None = "s", text: str = "and now?") -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", created_at=NOW, task=text,
                               tools=[], max_steps=4, session=session)


def test_a_queued_turn_asks_nothing_and_begins_from_the_transcript():
    queued = machine.start(_task(), [], NOW, queued=True)
    assert queued.status == "queued" and queued.session == "s" and queued.pending_step_id is None
    assert [type(e).__name__ for _, e in machine.outputs(queued, TOPICS)] == ["RunStateSnapshot"]

    history = Transcript(epoch=0, turns=(turn(1), turn(2)), dropped=3)
    state = machine.begin(queued, history, NOW)
    assert state.status == "running" and state.pending_step_id == "t3:0:model"
    (_, prefetch), (_, request), _ = machine.outputs(state, TOPICS)
    assert prefetch.step_id == "t3:prefetch"  # the turn's own prefetch goes out as it begins
    assert isinstance(request, InferenceRequested)
    assert [(m.role, m.content) for m in request.messages[1:]] == [
        ("user", turn(1).user), ("assistant", turn(1).reply), ("user", turn(2).user), ("assistant", turn(2).reply),
        ("user", "and now?")]
    assert request.messages[0].role == "system"
    # recorded with the run, and read back from its stored state
    again = RunState.from_json(state.to_json())
    assert transcript.started(again) == history


def test_a_completed_turn_publishes_the_session_with_itself_added():
    state = machine.begin(machine.start(_task(), [], NOW, queued=True), Transcript(turns=(turn(1),)), NOW)
    reply = '{"action": "final_answer", "answer": "done"}'
    state = machine.advance(state, InferenceCompleted.build(run_id="t3", step="t3:0:model", service="inference",
                                                            text=reply, finish_reason="stop"), NOW)
    out = [e for _, e in machine.outputs(state, TOPICS)]
    assert [type(e).__name__ for e in out] == ["RunCompleted", "SessionUpdated", "RunStateSnapshot"]
    updated = out[1]
    assert isinstance(updated, SessionUpdated) and updated.session == "s" and updated.step_id == "t3:session"
    assert [(t.run_id, t.answer) for t in updated.turns] == [("r1", "a1"), ("t3", "done")]
    assert updated.turns[-1].reply == reply and updated.turns[-1].user == "and now?"


def test_a_turn_whose_session_was_deleted_since_it_arrived_fails_as_it_begins():
    queued = machine.start(_task(), [], NOW, queued=True)  # arrived in epoch 0
    state = machine.begin(queued, Transcript(epoch=1), NOW)
    assert (state.status, state.error_code) == ("failed", "session_deleted")
    (_, outcome), _ = machine.outputs(state, TOPICS)
    assert isinstance(outcome, RunFailed) and "deleted" in outcome.error


def test_the_scripted_model_plays_the_turns_own_directives_and_recalls_the_earlier_answers():
    earlier = [ChatMessage(role="user", content="[[answer:alpha]]"),
               ChatMessage(role="assistant", content='{"action": "final_answer", "answer": "alpha"}'),
               ChatMessage(role="user", content="[[answer:beta]]"),
               ChatMessage(role="assistant", content='{"action": "final_answer", "answer": "beta"}')]
    system = ChatMessage(role="system", content="be brief")
    reply, _ = scripted_reply((system, *earlier, ChatMessage(role="user", content="[[recall]] what did I say?")))
    assert json.loads(reply) == {"action": "final_answer", "answer": "recall: alpha | beta"}
    reply, _ = scripted_reply((system, *earlier, ChatMessage(role="user", content="[[answer:gamma]]")))
    assert json.loads(reply)["answer"] == "gamma"  # this turn's first step, not turn 1's


# -- the planner ------------------------------------------------------------------------------------
def task(run_id: str, text: str, session: str = "s") -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", task=text, tools=[],
                               max_steps=4, prefetch=False, session=session)


def answer(run_id: str, text: str, step: int = 0) -> InferenceCompleted:
    return InferenceCompleted.build(run_id=run_id, step=f"{run_id}:{step}:model", service="inference",
                                    text=json.dumps({"action": "final_answer", "answer": text}), finish_reason="stop")


async def rig(store: MemoryHistory | None = None, partitions: int = 1) -> PlannerRig:
    r = PlannerRig(FakeKafka(), store or MemoryHistory(), settings(partitions=partitions))
    await r.take(*range(partitions))
    return r


def requests(r: PlannerRig, since: int = 0) -> list[InferenceRequested]:
    return [e for e in r.sent(since=since) if isinstance(e, InferenceRequested)]


async def test_a_turn_that_arrives_while_another_runs_waits_then_begins_from_its_answer():
    r = await rig()
    await r.feed(task("t1", "[[answer:alpha]] first"))
    await r.feed(task("t2", "[[recall]] second"))  # arrives while t1 runs
    assert [q.run_id for q in requests(r)] == ["t1"] and r.store.state("t2").status == "queued"
    assert r.store.sessions[("", "s")].turns == []  # opened by the first turn, nothing finished yet

    mark = len(r.kafka.produced)
    await r.feed(answer("t1", "alpha"))  # t1 ends: t2 begins, from t1's turn
    assert r.store.sessions[("", "s")].turns[0]["answer"] == "alpha"
    (begun,) = requests(r, since=mark)
    assert begun.run_id == "t2" and [m.content for m in begun.messages[1:]] == [
        "[[answer:alpha]] first", json.dumps({"action": "final_answer", "answer": "alpha"}), "[[recall]] second"]
    mirror = [p for p in r.kafka.produced[mark:] if p.topic == r.topics.sessions]
    assert len(mirror) == 1 and mirror[0].key == b"s"  # the compacted mirror, keyed by session

    await r.feed(answer("t2", "beta"))
    assert [t["run_id"] for t in r.store.sessions[("", "s")].turns] == ["t1", "t2"]
    assert [type(e).__name__ for e in r.sent(since=mark) if isinstance(e, (RunCompleted, RunFailed))] == [
        "RunCompleted", "RunCompleted"]


async def test_queued_turns_begin_in_the_order_they_arrived_one_at_a_time():
    r = await rig()
    for i in range(1, 5):
        await r.feed(task(f"t{i}", f"[[answer:a{i}]]"))
    assert [s.status for s in map(r.store.state, ("t1", "t2", "t3", "t4"))] == ["running", "queued", "queued", "queued"]
    for i in range(1, 5):
        assert [q.run_id for q in requests(r)][-1] == f"t{i}"  # the only one asking the model now
        await r.feed(answer(f"t{i}", f"a{i}"))
    assert [t["answer"] for t in r.store.sessions[("", "s")].turns] == ["a1", "a2", "a3", "a4"]
    assert [q.run_id for q in requests(r)] == ["t1", "t2", "t3", "t4"]
    # Only the last turn's end found nothing queued, and it looked nothing up (the planner's hint).
    assert r.planner.sessions.stats["unqueued_ends"] == 1 and r.planner.sessions._queued == {}


async def test_a_turn_queued_by_the_partitions_previous_owner_begins_when_the_running_one_ends():
    store = MemoryHistory()
    first = await rig(store)
    await first.feed(task("t1", "[[answer:a]]"))
    await first.feed(task("t2", "[[recall]]"))  # queued by the first planner, which then goes away
    second = await rig(store)  # takes the partition over: the queued turn is counted as it loads
    assert second.planner.sessions._queued == {"s": 1}
    await second.feed(answer("t1", "a"))
    assert store.state("t2").status == "running" and [q.run_id for q in requests(second)] == ["t2"]


async def test_a_redelivered_turn_is_neither_queued_twice_nor_begun_twice():
    r = await rig()
    await r.feed(task("t1", "[[answer:a]]"))
    await r.feed(task("t2", "[[answer:b]]"))
    await r.feed(task("t2", "[[answer:b]]"))  # a redelivered copy
    await r.feed(task("t1", "[[answer:a]]"))
    await r.feed(answer("t1", "a"))
    await r.feed(answer("t1", "a"))  # and a copy of the answer: t2 does not begin again
    # (a copy of t1's task republishes its request: the same event, which consumers drop)
    assert list({q.event_id: q.run_id for q in requests(r)}.values()) == ["t1", "t2"]
    assert [q.run_id for q in requests(r)].count("t2") == 1
    assert len(r.store.sessions[("", "s")].turns) == 1


async def test_a_turn_off_its_sessions_partition_is_refused_saying_how_to_pick_the_run_id():
    r = await rig(partitions=4)
    off = next(f"x{i}" for i in range(100) if r.topics.partition_for(f"x{i}") != r.topics.partition_for("s"))
    await r.feed(task(off, "[[answer:a]]"))
    (failed,) = [e for e in r.sent() if isinstance(e, RunFailed)]
    assert failed.error_code == "invalid_task" and "run_id_for_session" not in failed.error
    assert f"must be on the session's, {r.topics.partition_for('s')}" in failed.error and "murmur2" in failed.error
    assert ("", "s") not in r.store.sessions  # nothing opened


async def test_a_deleted_sessions_turns_fail_with_session_deleted_and_a_new_turn_starts_afresh():
    r = await rig()
    await r.feed(task("t1", "[[answer:a]]"))
    await r.feed(answer("t1", "a"))
    await r.feed(task("t2", "[[slow:1000]] [[answer:b]]"))
    await r.feed(task("t3", "[[answer:c]]"))  # queued behind t2
    r.store.delete_session("", "s")  # agentstream session delete: the turns erased, the epoch moved on
    for run_id in ("t2", "t3"):  # ... and the turns still going asked to stop
        await r.feed(RunCancelRequested.build(run_id=run_id, step=f"{run_id}:cancel", service="client",
                                              reason="the session was deleted"))
    outcomes = {e.run_id: e for e in r.sent() if isinstance(e, RunFailed)}
    assert outcomes["t2"].error_code == outcomes["t3"].error_code == "session_deleted"
    await r.feed(answer("t2", "b"))  # the stopped turn's late answer writes nothing
    assert r.store.sessions[("", "s")].turns == []

    mark = len(r.kafka.produced)
    await r.feed(task("t4", "[[answer:d]]"))  # the same session id again: a new, empty session
    (request,) = requests(r, since=mark)
    assert request.run_id == "t4" and len(request.messages) == 2
    assert r.store.sessions[("", "s")].deleted_at is None and r.store.state("t4").session_epoch == 1


async def test_a_plain_cancel_of_a_queued_turn_lets_the_next_one_begin():
    r = await rig()
    for i in (1, 2, 3):
        await r.feed(task(f"t{i}", f"[[answer:a{i}]]"))
    await r.feed(RunCancelRequested.build(run_id="t2", step="t2:cancel", service="client", reason="no"))
    assert r.store.state("t2").error_code == "cancelled"
    await r.feed(answer("t1", "a1"))
    assert [q.run_id for q in requests(r)] == ["t1", "t3"]


async def test_a_planner_that_dies_between_two_turns_leaves_the_next_one_to_its_successor():
    store = MemoryHistory()
    first = await rig(store)
    await first.feed(task("t1", "[[answer:a]]"))
    await first.feed(task("t2", "[[recall]]"))
    # The end of t1 is recorded, and the planner dies before t2 begins (no advance).
    state = store.state("t1")
    done = machine.advance(state, answer("t1", "a"), datetime.now(UTC))
    await first.planner.commit(state, done, machine.outputs(done, first.topics), None, consumed=None)
    assert store.state("t2").status == "queued"

    second = await rig(store)  # takes the partition over: loads the active runs, the queued turn among them
    sweeper = second.planner.sweeper
    queued = second.planner.cache.get("t2")
    assert queued is not None and sweeper.due(queued, datetime.now(UTC))
    await sweeper.sweep_run("t2")
    begun = store.state("t2")
    assert begun.status == "running" and begun.messages[-2].content == json.dumps(
        {"action": "final_answer", "answer": "a"})
    assert [q.run_id for q in requests(second)] == ["t2"]
    await sweeper.sweep_run("t2")  # looked at again: it has begun, nothing more
    assert [q.run_id for q in requests(second)] == ["t2"]


async def test_a_turn_starts_from_the_transcript_cut_to_the_budget():
    r = PlannerRig(FakeKafka(), MemoryHistory(), settings(sessions=settings().sessions.__class__(token_budget=40)))
    await r.take(0)
    for i in (1, 2, 3):
        await r.feed(task(f"t{i}", f"[[answer:{'x' * 30}{i}]]"))
        await r.feed(answer(f"t{i}", f"{'x' * 30}{i}"))
    state = r.store.state("t3")
    assert transcript.started(state).tokens <= 40 and state.session_dropped >= 1
    request = requests(r)[-1]
    assert sum(estimate_tokens(m.content) + 4 for m in request.messages[1:-1]) <= 40  # the model never got more


@pytest.mark.parametrize("session", ["", " ", "a\x00b"])
async def test_a_bad_session_id_fails_the_task(session: str):
    r = await rig()
    await r.feed(task("t1", "[[answer:a]]", session=session))
    (failed,) = [e for e in r.sent() if isinstance(e, RunFailed)]
    assert failed.error_code == "invalid_task" and "session id" in failed.error


def test_the_client_refuses_a_run_id_off_its_sessions_partition():
    from agentstream.streams.client.task_fields import session_run_problem as _session_run_problem

    topics = Topics(partitions=8)
    on = topics.run_id_for_session("chat-1")
    off = next(f"r{i}" for i in range(100) if topics.partition_for(f"r{i}") != topics.partition_for("chat-1"))
    assert _session_run_problem(topics, "chat-1", on) is None
    assert _session_run_problem(topics, None, off) is None and _session_run_problem(topics, "chat-1", None) is None
    assert "run_id_for_session" in (_session_run_problem(topics, "chat-1", off) or "")


async def test_a_tasks_session_header_orders_it_behind_the_sessions_earlier_tasks():
    from agentstream.streams.runtime.records import Record

    r = await rig()

    def record(topic: str, headers: dict[str, bytes]) -> Record:
        return Record(topic=topic, partition=0, offset=1, key=b"t1", timestamp_ms=0, headers=headers,
                      consumed_at=datetime.now(UTC))

    keys = r.planner.runner.config.order_keys if r.planner.runner else r.planner.service().config.order_keys
    assert keys is not None
    assert keys(record(r.topics.tasks, {"agentstream-session": b"chat-1"})) == (b"session\x00chat-1",)
    assert keys(record(r.topics.tasks, {})) == ()  # a run on its own, or a producer without the header
    assert keys(record(r.topics.inference_results, {"agentstream-session": b"chat-1"})) == ()


async def test_a_turns_model_steps_carry_its_session_as_the_engines_cache_key():
    from types import SimpleNamespace

    from agentstream.services.inference.backends.base import Final
    from agentstream.services.inference.service import InferenceService

    state = machine.begin(machine.start(_task(), [], NOW, queued=True), Transcript(), NOW)
    [request] = [e for _, e in machine.outputs(state, TOPICS) if isinstance(e, InferenceRequested)]
    assert request.session == "s"
    alone = machine.start(_task(session=None), [], NOW)
    assert [e.session for _, e in machine.outputs(alone, TOPICS) if isinstance(e, InferenceRequested)] == [None]

    keys: list[str | None] = []

    class Recording:
        name, slots = "recording", 1

        async def generate(self, req):
            keys.append(req.cache_key)
            yield Final(text="{}", finish_reason="stop", prompt_tokens=1, completion_tokens=1)

    class Ctx:
        async def emit(self, *_a, **_k) -> None: ...

    runtime = SimpleNamespace(settings=settings(), topics=TOPICS, metrics=None, tracing=None, stages=None)
    inference = InferenceService(runtime, Recording())  # type: ignore[arg-type]
    inference.service()
    for event in (request, next(e for _, e in machine.outputs(alone, TOPICS) if isinstance(e, InferenceRequested))):
        await inference.handle(event, Ctx())  # type: ignore[arg-type]
    assert keys == ["s", "t3"]  # the session's turns share a cache key; a run on its own keys by its run
