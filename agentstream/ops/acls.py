"""Least privilege on Kafka: which principal may do what, derived from the topic contract, and applying it.

Every service and the client authenticate as their own principal (``KafkaAuth``); with Kafka's
``StandardAuthorizer`` and ``allow.everyone.if.no.acl.found=false``, a principal may do only what an ACL
allows. The ACLs are not written by hand: they follow from ``channels.CHANNELS``, the one place that says
which party produces and consumes each topic, so a new topic or a new consumer changes both the contract
document and the permissions. ``acl_bindings`` computes them; ``apply_acls`` creates them (idempotent:
Kafka ignores an ACL that exists). docs/security.md has the resulting table.

The principals (user names), one per party:

- ``planner``, ``inference``, ``tools``, ``retrieval``: the services; ``worker``: a process that runs
  all four (``agentstream worker all``, the demo), with the union of their rights;
- ``client``: ``AgentClient`` and the CLI's submit, cancel, approve, wait and stream;
- ``gateway``: the HTTP gateway (``agentstream worker gateway``): the client's rights in every cell it is
  granted (it acts for each tenant through the tenant's own cell) and the step results its streams show;
- ``alerts``: the alerting app (faust: its own group, changelog topics under its application id);
- ``replay``: ``agentstream replay rerun|fork|window`` (everything under the ``replay.`` prefix, its sessions' own, and
  reading the recorded topics);
- ``operator``: ``agentstream dlq redrive`` (reads dead letters, re-drives them to their source topics);
- ``operator-reader``: the operator's tools that only read (``dlq list|show``, ``replay show``): every
  topic of each cell, read only;
- ``admin``: the cluster's super user (creates topics, writes ACLs); no service runs as it.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest_v1, DescribeAclsRequest
from aiokafka.protocol.api import Request

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.kafka.channels import CHANNELS, GROUPED
from agentstream.streams.kafka.topics import Topics

SERVICES = ("planner", "inference", "tools", "retrieval")
#: Every principal agentstream's own processes use; ``admin`` is the super user.
PRINCIPALS = (*SERVICES, "worker", "client", "gateway", "alerts", "replay", "operator", "operator-reader")
ADMIN = "admin"
#: Parties of the contract that run as another principal: producers in other languages write as clients,
#: ``agentstream dlq`` is the operator.
_PARTY_PRINCIPAL = {"foreign": "client", "dlq-cli": "operator"}
#: The consumer group every process asks a coordinator for at start (``wait_for_group_coordinator``).
READINESS_GROUP = "agentstream-readiness"
REPLAY_PREFIX = "replay."


class Resource(enum.IntEnum):
    TOPIC = 2
    GROUP = 3


class Pattern(enum.IntEnum):
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10


_ALLOW = 3
_ANY = 1  # a DescribeAcls filter's "any" (resource type, pattern type, operation, permission)
_RESOURCES = {int(r) for r in Resource}
_PATTERNS = {int(p) for p in Pattern}
_OPERATIONS = {int(o) for o in Operation}


@dataclass(frozen=True, order=True)
class AclBinding:
    """Allow ``principal`` (a user name) ``operation`` on a resource."""

    principal: str
    resource: Resource
    name: str
    operation: Operation
    pattern: Pattern = Pattern.LITERAL

    def __str__(self) -> str:
        star = "*" if self.pattern is Pattern.PREFIXED else ""
        return f"User:{self.principal} {self.operation.name} {self.resource.name.lower()} {self.name}{star}"


def _principal(party: str) -> str:
    return _PARTY_PRINCIPAL.get(party, party)


def acl_bindings(topics: Topics, *, client: str = "client") -> list[AclBinding]:
    """What each principal may do on the catalogue's topics and groups under ``topics.prefix``. ``client``:
    the principal with the client's rights there — a tenant's own (``tenant_principal``) on its prefix,
    so that it reaches its own topics and no other tenant's."""
    out: set[AclBinding] = set()

    def allow(who: str, operation: Operation, name: str, resource: Resource = Resource.TOPIC,
              pattern: Pattern = Pattern.LITERAL) -> None:
        if who == "client":  # the gateway submits and follows runs in each cell as that cell's client would
            out.add(AclBinding("gateway", resource, name, operation, pattern))
        who = client if who == "client" else who
        out.add(AclBinding(who, resource, name, operation, pattern))
        if who in SERVICES:  # `worker all` is every service at once
            out.add(AclBinding("worker", resource, name, operation, pattern))

    for spec in CHANNELS:
        name = getattr(topics, spec.topic)
        for party in spec.producers:
            if party != "replay":
                allow(_principal(party), Operation.WRITE, name)
        for party in spec.consumers:
            if party != "replay":
                allow(_principal(party), Operation.READ, name)
        if spec.routed:  # the planner forwards a record that came on another partition than its run's
            allow("planner", Operation.WRITE, name)
        if spec.redrivable:
            allow("operator", Operation.WRITE, name)
    allow("client", Operation.READ, topics.runs)  # "the latest state of every run, for anyone to read"
    for results in (topics.inference_results, topics.tool_results, topics.retrieval_results):
        allow("gateway", Operation.READ, results)  # a run's steps, in its SSE stream (services/gateway/hub.py)
    # An operator token's dead-letter page (/v1/dead-letters, services/gateway/routes_dlq.py) reads the cell's
    # letters. Re-driving them would take the operator's WRITE on every redrivable topic (results included),
    # which the gateway is not given: on the secure stack a re-drive through it is refused by the broker.
    allow("gateway", Operation.READ, topics.dlq)
    for service in GROUPED:
        allow(service, Operation.READ, topics.group(service), Resource.GROUP)
    for who in PRINCIPALS:
        allow(who, Operation.DESCRIBE, READINESS_GROUP, Resource.GROUP)
    # A planner's worker samples the inference backlog (streams/telemetry/backlog.py): the prompt tokens
    # of the requests it published that the inference group has not committed yet. Without these, a
    # planner with a metrics port logged GroupAuthorizationFailedError every sample (issue 37).
    allow("planner", Operation.READ, topics.inference_requests)
    allow("planner", Operation.DESCRIBE, topics.group("inference"), Resource.GROUP)
    # The alerting app: faust's group and changelog topics carry its application id; its lag check reads
    # every group's committed offsets and every topic's end offsets.
    app_id = f"{topics.prefix}agentstream-alerts"
    for resource in (Resource.TOPIC, Resource.GROUP):
        allow("alerts", Operation.ALL, app_id, resource, Pattern.PREFIXED)
    allow("alerts", Operation.DESCRIBE, f"{topics.prefix}agent.", Resource.TOPIC, Pattern.PREFIXED)
    allow("alerts", Operation.DESCRIBE, f"{topics.prefix}agentstream.", Resource.GROUP, Pattern.PREFIXED)
    # A replay is a pipeline of its own under a fresh `replay.<id>.` prefix (topics created and deleted
    # by it); it copies the original's tool catalogue.
    for resource in (Resource.TOPIC, Resource.GROUP):
        allow("replay", Operation.ALL, REPLAY_PREFIX, resource, Pattern.PREFIXED)
    allow("replay", Operation.READ, f"{topics.prefix}agent.", Resource.TOPIC, Pattern.PREFIXED)  # catalogues
    # The operator's tools that only read: dead letters (`dlq list|show`) and a timeline's cross-check of
    # every recorded event (`replay show`), in every cell, and nothing written.
    allow("operator-reader", Operation.READ, f"{topics.prefix}agent.", Resource.TOPIC, Pattern.PREFIXED)
    if client != "client":  # a tenant inspects its own cell's dead letters (`AGENTSTREAM_TENANT=… agentstream dlq`)
        out.add(AclBinding(client, Resource.TOPIC, topics.dlq, Operation.READ))
    return sorted(out)


def tenant_principal(tenant: str) -> str:
    """A tenant's Kafka principal (and its database login): ``tenant-<name>``."""
    return f"tenant-{tenant}"


def tenant_prefix(tenant: str) -> str:
    """A tenant's topic prefix: its cell of the pipeline (docs/security.md, "Tenants")."""
    return f"{tenant}."


def acl_markdown(bindings: Iterable[AclBinding]) -> str:
    """The bindings as the table of docs/security.md (one row per principal; a unit test keeps the page
    in step with the code)."""
    bindings = list(bindings)

    def shown(b: AclBinding) -> str:
        return f"`{b.name}{'*' if b.pattern is Pattern.PREFIXED else ''}`"

    rows = ["| principal | writes | reads | other |", "|---|---|---|---|"]
    for who in PRINCIPALS:
        mine = [b for b in bindings if b.principal == who]
        plain = [b for b in mine if b.resource is Resource.TOPIC and b.pattern is Pattern.LITERAL
                 and b.operation in (Operation.WRITE, Operation.READ)]
        writes = ", ".join(shown(b) for b in plain if b.operation is Operation.WRITE)
        reads = ", ".join(shown(b) for b in plain if b.operation is Operation.READ)
        other = "; ".join(f"{b.operation.name} {b.resource.name.lower()} {shown(b)}" for b in mine if b not in plain)
        rows.append(f"| `{who}` | {writes} | {reads} | {other} |")
    return "\n".join(rows) + "\n"


class _CreateAcls(Request[CreateAclsRequest_v1]):
    """CreateAcls v1 with many ACLs in one request (aiokafka's builder sends one)."""

    API_KEY = 30

    def __init__(self, bindings: list[AclBinding]) -> None:
        self.bindings = bindings

    def build(self, request_struct_class: type[CreateAclsRequest_v1]) -> CreateAclsRequest_v1:
        return request_struct_class([(int(b.resource), b.name, int(b.pattern), f"User:{b.principal}", "*",
                                      int(b.operation), _ALLOW) for b in self.bindings])


async def apply_acls(bootstrap: str, admin: KafkaAuth, bindings: Iterable[AclBinding], *,
                     within_s: float = 30.0) -> int:
    """Create ``bindings`` as ``admin`` (a super user) and wait until every broker enforces them (each
    learns them from the metadata log, a moment after the controller accepted them); return how many."""
    bindings = list(bindings)
    client = AIOKafkaClient(**kafka_options(bootstrap, admin))
    await client.bootstrap()
    try:
        response = await client.send(client.get_random_node(), _CreateAcls(bindings))
        for binding, (code, message) in zip(bindings, response.creation_responses, strict=True):
            if code:
                raise for_code(code)(f"creating the ACL {binding}: {message}")
        deadline = time.monotonic() + within_s
        for broker in client.cluster.brokers():
            while not set(bindings) <= await _described(client, int(broker.nodeId)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"broker {broker.nodeId} did not list the new ACLs within {within_s:.0f} s")
                await asyncio.sleep(0.05)
    finally:
        await client.close()
    return len(bindings)


async def _described(client: AIOKafkaClient, node: int) -> set[AclBinding]:
    """The ALLOW ACLs of agentstream's principals that ``node`` knows."""
    response = await client.send(node, DescribeAclsRequest(_ANY, None, _ANY, None, None, _ANY, _ANY))
    if response.error_code:
        raise for_code(response.error_code)(f"describing ACLs: {response.error_message}")
    known: set[AclBinding] = set()
    for resource_type, name, pattern, acls in response.resources:
        for principal, _host, operation, permission in acls:
            if permission == _ALLOW and principal.startswith("User:") and resource_type in _RESOURCES \
                    and pattern in _PATTERNS and operation in _OPERATIONS:
                known.add(AclBinding(principal[5:], Resource(resource_type), name, Operation(operation),
                                     Pattern(pattern)))
    return known
