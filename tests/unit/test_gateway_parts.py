"""The gateway's parts, one at a time: stream positions (the SSE ids), the token bucket, run ids from
idempotency keys, the token format and its hash, the answer text of a streamed reply, a chat request as a
task, and the live fan-out's history and slow-reader drop."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentstream.services.gateway.answer_text import AnswerText
from agentstream.services.gateway.auth import Authenticator
from agentstream.services.gateway.hub import History, Item, Subscription
from agentstream.services.gateway.limits import RateLimiter, TokenBucket
from agentstream.services.gateway.openai_models import ChatCompletionRequest
from agentstream.services.gateway.positions import OUTCOME, TOKENS, BadPosition, Position
from agentstream.services.gateway.problems import Problem
from agentstream.services.gateway.routes_openai import compose
from agentstream.services.gateway.state import run_id_for_key
from agentstream.services.gateway.tokens import Principal, Role, digest, new_token, split
from agentstream.streams.core.events import TokenChunk
from agentstream.streams.kafka.topics import Topics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_position_round_trips_and_moves_forward_per_topic() -> None:
    start = Position(3, (10, 0, 5, 0, 7))
    assert Position.decode(start.encode()) == start and start.encode() == "3.10.0.5.0.7"
    after = start.after(TOKENS, 10).after(OUTCOME, 7)
    assert after.offsets == (11, 0, 5, 0, 8)
    assert after.covers(TOKENS, 10) and not after.covers(TOKENS, 11)
    assert start.after(TOKENS, 3) == start  # an offset already behind it changes nothing
    assert after.at_least(start) and not start.at_least(after)
    assert start.merge(Position(3, (0, 9, 0, 0, 0))).offsets == (10, 9, 5, 0, 7)
    for bad in ("", "3.1.2", "a.b.c.d.e.f", "3.1.2.3.4.-5", "1" * 30 + ".0.0.0.0.0"):
        with pytest.raises(BadPosition):
            Position.decode(bad)


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 100
    assert [bucket.take() for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # never more than the burst saved up


def test_the_rate_limiter_forgets_idle_tenants() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=1, clock=clock)
    limiter.check("a")
    with pytest.raises(Problem) as raised:
        limiter.check("a")
    assert raised.value.status == 429 and raised.value.headers["Retry-After"] == "1"
    clock.now += 10
    limiter.check("b")
    assert "a" not in limiter.buckets  # full again long since: dropped


def test_an_idempotency_key_names_one_run_per_tenant_and_a_session_turn_is_on_its_partition() -> None:
    topics = Topics(prefix="", partitions=8)
    first = run_id_for_key(topics, "acme", "order-17")
    assert first == run_id_for_key(topics, "acme", "order-17")  # any replica, any time
    assert first.startswith("run-") and len(first) == 20
    assert first != run_id_for_key(topics, "beta", "order-17")  # tenants' keys never meet
    assert first != run_id_for_key(topics, "acme", "order-18")
    for session in ("chat-1", "chat-2", "chat-3", "chat-4"):
        turn = run_id_for_key(topics, "acme", "order-17", session)
        assert topics.partition_for(turn) == topics.partition_for(session)
        assert turn == run_id_for_key(topics, "acme", "order-17", session)


def test_a_token_is_shown_once_and_only_its_secrets_hash_is_kept() -> None:
    token, token_id, hashed = new_token()
    assert token.startswith(f"ags_{token_id}_") and len(token_id) == 12
    parts = split(token)
    assert parts is not None and parts[0] == token_id and digest(parts[1]) == hashed
    assert hashed not in token and len(hashed) == 64
    for bad in ("", "ags_", "Bearer x", f"ags_{token_id}", f"ags_{token_id.upper()}_x", "ags_zzzzzzzzzzzz_x"):
        assert split(bad) is None


async def test_a_verified_token_is_cached_for_a_while_and_a_bad_one_is_not() -> None:
    calls: list[str] = []
    clock = Clock()

    async def verify(token: str) -> Principal | None:
        calls.append(token)
        return Principal("acme", Role.READER, "t1") if token == "good" else None

    auth = Authenticator(verify, cache_s=30, clock=clock)
    assert (await auth.principal("good")) == (await auth.principal("good"))
    assert calls == ["good"]
    assert await auth.principal("bad") is None and await auth.principal("bad") is None
    assert calls == ["good", "bad", "bad"]
    clock.now += 31
    await auth.principal("good")
    assert calls[-1] == "good" and len(calls) == 4  # asked again once the entry expired (a revocation)
    assert "good" not in auth.cache  # keyed by hash


def test_roles_include_the_ones_below() -> None:
    reader, approver, submitter, operator = (Principal("t", role, "id") for role in Role)
    assert reader.may(Role.READER) and not reader.may(Role.APPROVER) and not reader.may(Role.SUBMITTER)
    assert approver.may(Role.APPROVER) and not approver.may(Role.SUBMITTER)
    assert submitter.may(Role.SUBMITTER) and not submitter.may(Role.APPROVER)
    assert not any(p.may(Role.OPERATOR) for p in (reader, approver, submitter))
    assert operator.may(Role.READER) and operator.may(Role.OPERATOR)  # the reads, and the dead letters only
    assert not operator.may(Role.APPROVER) and not operator.may(Role.SUBMITTER)
    assert Principal("acme", Role.APPROVER, "abc", name="ops").approver_name == "gateway:acme:ops"


def test_the_answer_text_streams_a_final_answer_and_nothing_else() -> None:
    text = AnswerText()
    tool = json.dumps({"action": "tool", "tool": "calculator", "arguments": {"expression": "1 + 1"}})
    assert "".join(text.feed("s0", tool[i:i + 3]) for i in range(0, len(tool), 3)) == ""
    answer = json.dumps({"action": "final_answer", "answer": 'It is "2" \u00e9\U0001f600\nok\\'})
    pieces = [text.feed("s1", answer[i:i + 2]) for i in range(0, len(answer), 2)]
    assert "".join(pieces) == 'It is "2" \u00e9\U0001f600\nok\\'
    assert len([p for p in pieces if p]) > 5  # as it came, not at the end
    assert text.rest('It is "2" \u00e9\U0001f600\nok\\') == ""
    other = AnswerText()
    assert other.feed("s", '{"answer": "x", "action": "final_answer"}') == ""  # not streamable: sent at the end
    assert other.rest("x") == "x"
    structured = AnswerText()
    assert structured.feed("s", '{"action": "final_answer", "answer": {"city": "Paris"}}') == ""
    assert structured.rest('{"city": "Paris"}') == '{"city": "Paris"}'
    native = AnswerText(native=True)
    assert native.feed("s", "Paris") == "Paris" and native.rest("Paris, France") == ", France"


def test_a_chat_request_becomes_a_task() -> None:
    def request(messages: list[dict], **extra: object) -> ChatCompletionRequest:
        return ChatCompletionRequest.model_validate({"model": "agentstream", "messages": messages, **extra})

    one = compose(request([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]), None)
    assert (one.task, one.system_prompt, one.session, one.output_schema) == ("Hi", "Be brief.", None, None)
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
               {"role": "user", "content": [{"type": "text", "text": "What is my name?"}]}]
    folded = compose(request(history), None)
    assert folded.task.startswith("The conversation so far:\nUser: My name is Ada.\nAssistant: Hello Ada.")
    assert folded.task.endswith("The user's new message:\nWhat is my name?")
    turn = compose(request(history), "chat-7")  # the session's transcript stands for the earlier messages
    assert turn.task == "What is my name?" and turn.session == "chat-7"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    shaped = compose(request([{"role": "user", "content": "x"}], response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": schema}}), None)
    assert shaped.output_schema == schema
    assert compose(request([{"role": "user", "content": "x"}], response_format={"type": "json_object"}),
                   None).output_schema == {"type": "object"}


def _item(run: str, offset: int, topic: int = TOKENS) -> Item:
    return Item(topic, offset, 0, TokenChunk.build(run_id=run, step=f"{run}:0", service="t", part=str(offset),
                                                   seq=offset, text="x"))


def test_history_keeps_recent_runs_and_remembers_what_it_dropped() -> None:
    start = Position(0, (0, 0, 0, 0, 0))
    history = History(max_events=10, max_age_s=60)
    for i in range(6):
        history.add("a", _item("a", i), start, now=0.0)
    for i in range(6, 12):
        history.add("b", _item("b", i), start, now=1.0)
    assert "a" not in history.runs and "a" in history.forgotten and history.count <= 10
    history.add("a", _item("a", 20), start, now=2.0)
    assert "a" not in history.runs  # its earlier records are gone: never kept as if complete
    history.sweep(now=100.0)
    assert not history.runs and history.count == 0


async def test_a_slow_subscriber_is_dropped_not_waited_for() -> None:
    sub = Subscription("a", 0, Position(0, (0, 0, 0, 0, 0)), size=2)
    assert sub.offer(_item("a", 0)) and sub.offer(_item("a", 1))
    assert not sub.offer(_item("a", 2)) and sub.dropped
    assert (await asyncio.wait_for(sub.queue.get(), 1)).offset == 0
