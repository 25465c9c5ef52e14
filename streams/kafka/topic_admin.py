"""Creating, checking and deleting the catalogue's topics on a broker (``streams/kafka/topics.py`` says
what they are). Topics are created on purpose, from the catalogue only: ``ensure_topics`` creates what is
missing, brings configs that differ in line, adds partitions to a topic that never held a record, and
refuses with ``TopicMismatch`` what cannot be fixed in place; the client's ``require_topics`` names the
command that creates them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import CoordinatorNotAvailableError, InvalidPartitionsError, for_code

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.config.masking import mask_url
from agentstream.streams.core.errors import TopicMismatch, TopicsMissing
from agentstream.streams.kafka.topics import TopicSpec

log = logging.getLogger(__name__)

# Kafka's error codes, as the admin responses carry them.
_TOPIC_ALREADY_EXISTS = 36
_TOPIC_AUTHORIZATION_FAILED = 29
_UNKNOWN_TOPIC_OR_PARTITION = 3
_CLUSTER_AUTHORIZATION_FAILED = 31
_DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs v1+ config_source: set on the topic itself


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], *, timeout_ms: int = 30000,
                        auth: KafkaAuth) -> list[str]:
    """Create the topics that do not exist yet and bring existing ones in line; return the names created.

    An existing topic may not come from the catalogue: a broker with ``auto.create.topics.enable=true``
    creates one (its default partition count, ``cleanup.policy=delete``) when any client asks for it. So a
    config that differs from the catalogue's is altered to the catalogue's value, and a topic with too
    few partitions that never held a record gets the missing ones (each logged as a warning). A topic
    with too few partitions that holds records, or with too many, raises ``TopicMismatch``: keys would
    hash to other partitions than the records already there, or than the code expects. Any other
    failure raises the broker's error.

    On a cluster with an authorizer, a principal that may not create topics (every service's, on
    ``agentstream dev up --secure``: the administrator creates them) checks that they exist instead and
    leaves their configs to the administrator (it may not read them either).
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth), request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        created, existing, refused = await _create_topics(admin, specs, timeout_ms=timeout_ms)
        visible: list[str] = []
        if refused:  # those this principal may see at all are its own to check; the others are not its business
            errors = {d["topic"]: d["error_code"] for d in await admin.describe_topics(refused)}
            missing = [n for n in refused if errors.get(n) == _UNKNOWN_TOPIC_OR_PARTITION]
            if missing:
                raise TopicsMissing(f"{', '.join(missing)} do(es) not exist and {auth.principal} may not create topics: "
                                    "create them as the cluster's administrator (`agentstream dev up` does)")
            visible = [n for n in refused if errors.get(n) == 0]
        if existing or visible:
            old = [s for s in specs if s.name in existing or s.name in visible]
            await _fit_partitions(admin, bootstrap, old, timeout_ms=timeout_ms, auth=auth)
        if existing:
            await _repair_configs(admin, [s for s in specs if s.name in existing])
        return created
    finally:
        await admin.close()


async def _create_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec], *,
                         timeout_ms: int) -> tuple[list[str], list[str], list[str]]:
    """Ask for every topic; return (created now, existed already, not ours to create)."""
    response = await admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs)) for s in specs],
        timeout_ms=timeout_ms,
    )
    created: list[str] = []
    existing: list[str] = []
    refused: list[str] = []
    for entry in response.topic_errors:
        name, code = entry[0], entry[1]
        if code == 0:
            created.append(name)
        elif code == _TOPIC_ALREADY_EXISTS:
            existing.append(name)
        elif code in (_TOPIC_AUTHORIZATION_FAILED, _CLUSTER_AUTHORIZATION_FAILED):
            refused.append(name)
        else:
            message = entry[2] if len(entry) > 2 else ""
            raise for_code(code)(f"creating topic {name}: {message}")
    return created, existing, refused


async def _fit_partitions(admin: AIOKafkaAdminClient, bootstrap: str, specs: list[TopicSpec], *,
                          timeout_ms: int, auth: KafkaAuth) -> None:
    """Refuse every mismatch that cannot be repaired before repairing anything; then add partitions to
    the empty topics that have too few."""
    descriptions = await _describe_settled(admin, [s.name for s in specs], within_s=timeout_ms / 1000)
    have = {d["topic"]: len(d["partitions"]) for d in descriptions}
    for spec in specs:
        if have[spec.name] > spec.partitions:
            raise TopicMismatch(
                f"topic {spec.name} has {have[spec.name]} partitions, the catalogue says {spec.partitions}, "
                "and Kafka cannot remove partitions: delete the topic (in development; it is recreated from "
                f"the catalogue at the next start) or move its records to a topic with {spec.partitions}")
    short = [s for s in specs if have[s.name] < s.partitions]
    if not short:
        return
    records = await _record_counts(bootstrap, {s.name: have[s.name] for s in short}, auth)
    for spec in short:
        if records[spec.name]:
            raise TopicMismatch(
                f"topic {spec.name} has {have[spec.name]} partitions, the catalogue says {spec.partitions}, "
                f"and it already holds records: adding partitions would send later events of a run to "
                f"another partition than its earlier ones. Delete the topic (in development; it is "
                f"recreated from the catalogue at the next start) or move its records to a topic with "
                f"{spec.partitions}. It was probably created by a broker with auto.create.topics.enable="
                f"true: set it to false")
    await _add_partitions(admin, short, have, within_s=timeout_ms / 1000)


async def _record_counts(bootstrap: str, partitions: Mapping[str, int], auth: KafkaAuth) -> dict[str, int]:
    """How many offsets each topic has handed out (the sum of its end offsets): 0 means no record was
    ever written to it, so its partition count can still change without moving any key."""
    consumer = AIOKafkaConsumer(**kafka_options(bootstrap, auth), enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(
            [TopicPartition(name, p) for name, count in partitions.items() for p in range(count)])
    finally:
        await consumer.stop()
    counts = dict.fromkeys(partitions, 0)
    for tp, end in ends.items():
        counts[tp.topic] += end
    return counts


async def _add_partitions(admin: AIOKafkaAdminClient, specs: list[TopicSpec], have: Mapping[str, int], *,
                          within_s: float) -> None:
    """Grow empty topics to the catalogue's partition count and wait until the broker describes them so
    (a producer started after this must hash keys over all of them). Another worker may be doing the
    same at the same moment: then the broker refuses ours, and the count it reaches is what counts."""
    try:
        await admin.create_partitions({s.name: NewPartitions(s.partitions) for s in specs},
                                      timeout_ms=int(within_s * 1000))
    except InvalidPartitionsError:
        pass  # checked below
    wanted = {s.name: s.partitions for s in specs}
    deadline = time.monotonic() + within_s
    while True:
        now = {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics(list(wanted))}
        if now == wanted:
            break
        if time.monotonic() > deadline:
            name = next(n for n in wanted if now.get(n) != wanted[n])
            raise TopicMismatch(f"topic {name} has {now.get(name)} partitions after adding partitions "
                                f"up to the catalogue's {wanted[name]}")
        await asyncio.sleep(0.1)
    for spec in specs:
        log.warning("topic %s had %d partition(s) and no records; added partitions up to the catalogue's %d "
                    "(it was probably created by a broker with auto.create.topics.enable=true)",
                    spec.name, have[spec.name], spec.partitions)


async def _repair_configs(admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> None:
    """Alter every config that differs from the catalogue's (e.g. ``cleanup.policy=delete`` on an
    auto-created ``agent.runs``, which must be compacted). AlterConfigs replaces all of a topic's own
    settings, so the ones set on the topic outside the catalogue are sent along unchanged."""
    specs = [s for s in specs if s.configs]
    if not specs:
        return
    current = await _topic_configs(admin, [s.name for s in specs])
    repairs: list[tuple[TopicSpec, dict[str, str], dict[str, str | None]]] = []
    for spec in specs:
        values, own = current[spec.name]
        wrong = {k: values.get(k) for k, v in spec.configs.items() if values.get(k) != v}
        if wrong:
            repairs.append((spec, {**own, **spec.configs}, wrong))
    if not repairs:
        return
    responses = await admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, spec.name, configs) for spec, configs, _ in repairs])
    for response in responses:
        for code, message, _type, name in response.resources:
            if code:
                raise for_code(code)(f"altering the configs of topic {name}: {message}")
    for spec, _, wrong in repairs:
        changes = ", ".join(f"{k} {old} → {spec.configs[k]}" for k, old in sorted(wrong.items()))
        log.warning("topic %s did not have the catalogue's configs; repaired: %s", spec.name, changes)


async def _topic_configs(admin: AIOKafkaAdminClient,
                         names: list[str]) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Per topic: (every config value in effect, the ones set on the topic itself)."""
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    out: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for response in responses:
        for code, message, _type, name, entries in response.resources:
            if code:
                raise for_code(code)(f"describing the configs of topic {name}: {message}")
            values: dict[str, str] = {}
            own: dict[str, str] = {}
            for entry in entries:
                key, value, source = entry[0], entry[1], entry[3]
                if value is None:  # sensitive: not readable, so neither compared nor resent
                    continue
                values[key] = value
                set_on_topic = source == _DYNAMIC_TOPIC_CONFIG if response.API_VERSION >= 1 else not source
                if set_on_topic:
                    own[key] = value
            out[name] = (values, own)
    return out


async def _describe_settled(admin: AIOKafkaAdminClient, names: list[str], *,
                            within_s: float) -> list[dict[str, Any]]:
    """The topics' descriptions once the broker knows them all. A topic created a moment ago (by
    another process, e.g. ``dev up`` just before a worker starts) can be described with an error
    and no partitions until the broker's metadata catches up with the controller: ask again."""
    deadline = time.monotonic() + within_s
    while True:
        descriptions = await admin.describe_topics(names)
        unsettled = [d for d in descriptions if d["error_code"] or not d["partitions"]]
        if not unsettled:
            return descriptions
        if time.monotonic() > deadline:
            first = unsettled[0]
            if first["error_code"]:
                raise for_code(first["error_code"])(f"describing topic {first['topic']}")
            raise TopicMismatch(f"topic {first['topic']} has no partitions")
        await asyncio.sleep(0.1)


async def wait_for_group_coordinator(bootstrap: str, *, within_s: float = 30.0,
                                     auth: KafkaAuth) -> None:
    """Return once the cluster can coordinate consumer groups.

    A fresh broker creates ``__consumer_offsets`` on the first FindCoordinator request and answers
    COORDINATOR_NOT_AVAILABLE until it is ready; asked here first, the services' consumers join at once
    instead of logging that error while they retry.
    """
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth), request_timeout_ms=int(within_s * 1000))
    await admin.start()
    try:
        deadline = time.monotonic() + within_s
        while True:
            try:
                await admin.find_coordinator("agentstream-readiness")
                return
            except CoordinatorNotAvailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: Iterable[str], *, timeout_ms: int = 30000,
                        auth: KafkaAuth) -> None:
    """Delete topics (those that do not exist are ignored), so a long-lived development broker does not
    pile up the thousands that tests and benchmarks create."""
    names = list(names)
    if not names:
        return
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth), request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [n for n in names if n in existing]
        if doomed:
            await admin.delete_topics(doomed, timeout_ms=timeout_ms)
    finally:
        await admin.close()


async def missing_topics(bootstrap: str, names: Iterable[str], *, within_s: float = 2.0,
                         optional: Iterable[str] = (), auth: KafkaAuth) -> list[str]:
    """Those of ``names`` and ``optional`` the broker does not know. Asks for the list of all topics, which
    never creates one whatever the broker's settings. A topic another process created a moment ago can be
    missing from the broker's metadata briefly, so a missing one of ``names`` is looked for again for up
    to ``within_s`` (an ``optional`` one only while that goes on)."""
    names = list(dict.fromkeys(names))
    extra = [n for n in dict.fromkeys(optional) if n not in names]
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth))
    await admin.start()
    try:
        deadline = time.monotonic() + within_s
        while True:
            known = set(await admin.list_topics())
            missing = [n for n in names if n not in known]
            if not missing or time.monotonic() >= deadline:
                return missing + [n for n in extra if n not in known]
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def require_topics(bootstrap: str, names: Iterable[str], *, optional: Iterable[str] = (),
                         auth: KafkaAuth) -> list[str]:
    """Raise ``TopicsMissing`` naming the topics of ``names`` that do not exist (workers create them at
    start), so a client started before any worker says so at once instead of timing out on its first
    send. Returns the topics of ``optional`` that do not exist."""
    names = list(names)
    missing = await missing_topics(bootstrap, names, optional=optional, auth=auth)
    extra = [n for n in missing if n not in names]
    missing = [n for n in missing if n in names]
    if not missing:
        return extra
    raise TopicsMissing(
        f"topic(s) {', '.join(missing)} do not exist on the broker at {mask_url(bootstrap)}: start a worker first "
        "(`agentstream worker all`; workers create the catalogue's topics), or run `agentstream dev up`, "
        "with the same AGENTSTREAM_TOPIC_PREFIX as this client")
