"""The pure rules behind issue 11: partition balance, outage classification, backoff, PostgreSQL-safe text."""

from __future__ import annotations

import asyncpg
import orjson
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError

from agentstream.streams.core.errors import BackendError
from agentstream.streams.core.outages import DATABASE, KAFKA, MODEL, backoff, outage_of
from agentstream.streams.core.task_rules import event_id_problem, run_id_problem
from agentstream.streams.kafka.assignor import balance
from agentstream.streams.store.history import event_uuid, pg_text, to_json


def test_balance_gives_every_member_its_share_and_keeps_what_it_had():
    plan = balance(list(range(8)), {"a": [0, 1, 2, 3, 4, 5, 6, 7], "b": []})
    assert sorted(len(p) for p in plan.values()) == [4, 4]
    assert set(plan["a"]) < set(range(8))  # a keeps four of its own
    grown = balance(list(range(8)), {**plan, "c": []})  # 2 → 3 members
    assert sorted(len(p) for p in grown.values()) == [2, 3, 3]
    moved = sum(len(set(grown[m]) - set(plan[m])) for m in ("a", "b"))
    assert moved == 0  # only the newcomer's partitions moved
    assert sorted(p for ps in grown.values() for p in ps) == list(range(8))


def test_balance_resolves_a_partition_two_members_claim():
    plan = balance([0, 1], {"a": [0], "b": [0]})
    assert sorted(p for ps in plan.values() for p in ps) == [0, 1]


def test_outages_are_told_from_bad_input():
    assert outage_of(ConnectionRefusedError(111, "refused")) == DATABASE
    assert outage_of(asyncpg.exceptions.CannotConnectNowError("starting up")) == DATABASE
    assert outage_of(asyncpg.exceptions.TooManyConnectionsError("full")) == DATABASE
    assert outage_of(KafkaConnectionError()) == KAFKA and outage_of(KafkaTimeoutError()) == KAFKA
    assert outage_of(BackendError("503", retriable=True)) == MODEL
    for bad in (MessageSizeTooLargeError(), asyncpg.exceptions.UntranslatableCharacterError("\\u0000"),
                asyncpg.exceptions.QueryCanceledError("statement timeout"), BackendError("400"), ValueError()):
        assert outage_of(bad) is None, bad


def test_backoff_doubles_up_to_its_cap_with_jitter():
    assert 0.05 <= backoff(1, base_s=0.1, cap_s=5) <= 0.1
    assert all(2.5 <= backoff(n, base_s=0.1, cap_s=5) <= 5 for n in (7, 50, 10_000))


def test_text_postgres_refuses_is_replaced_and_a_literal_escape_is_kept():
    doc = orjson.loads(to_json({"nul": "a\x00b", "literal": "\\u0000", "lone": "x\ud800"}))
    assert doc == {"nul": "a\ufffdb", "literal": "\\u0000", "lone": "x\ufffd"}
    assert pg_text("a\x00b\udc80") == "a\ufffdb\ufffd"


def test_ids_from_other_producers():
    assert event_id_problem("not-a-uuid") is None and event_id_problem(event_uuid("x")) is None
    assert event_id_problem("") and event_id_problem("e" * 201) and event_id_problem(None)
    assert event_uuid("not-a-uuid") != event_uuid("not-a-uuid-2")
    assert event_uuid("6F1C2A3E-8C55-4D0E-9A43-5B7F0E2D9C11") == "6f1c2a3e-8c55-4d0e-9a43-5b7f0e2d9c11"
    assert event_uuid("not-a-uuid") == event_uuid("not-a-uuid")  # deterministic: a copy is the same event
    assert run_id_problem("") and run_id_problem("r" * 500) and run_id_problem("a\nb")
    assert run_id_problem("run-1") is None
