"""Tenant cells in the deploy values (``tenants:``): each a pipeline of its own under its topic prefix, with
its own workers, its client principal and its quotas (docs/security.md, "Tenants"; docs/deploy.md,
"Secure and multi-tenant").

Why a cell gets Deployments of its own rather than a shared pool: a worker serves one topic prefix, and
the tenant of a run is the prefix it arrived under (which only the tenant's principal may write). So a
tenant's quotas are its cell's planners' settings, and its Kafka produce quota is on its principal.
The prefix and principal default to ``tenant_prefix`` and ``tenant_principal`` (``agentstream/ops/acls.py``),
the names ``dev up --secure --tenant`` gives.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.ops.client_quotas import DEFAULT_PRODUCER_BYTE_RATE, TenantKafkaQuota, kafka_configs_args
from agentstream.streams.config.quotas import Quotas
from agentstream.streams.core.errors import ConfigError

Obj = dict[str, Any]

#: The quotas a cell's planners enforce: ``Quotas`` fields, and the budgets over time being added beside
#: them (issue 36, item 4). Each is ``AGENTSTREAM_QUOTA_<FIELD>``; in the values, the field in camelCase.
QUOTA_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    [*(f.name for f in dataclasses.fields(Quotas)), "tokens_per_hour", "tokens_per_day", "tasks_per_second"]))
#: A Kubernetes object name's part: what a cell's name becomes in its objects' names.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")


def camel(field_name: str) -> str:
    head, *rest = field_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def quota_variable(field_name: str) -> str:
    return f"AGENTSTREAM_QUOTA_{field_name.upper()}"


@dataclass(frozen=True)
class Cell:
    """One tenant's cell: ``name`` (in its objects' names), its topic ``prefix``, its client ``principal``
    (Kafka user and database login), its planners' ``quotas`` (environment variable -> value), the produce
    rate its principal may use (bytes per second per broker, a Kafka client quota; unset: the default of
    ``dev up``, ``DEFAULT_PRODUCER_BYTE_RATE``; 0: none) and its services' values over the installation's
    (``services``: e.g. ``{planner: {replicas: 1}}``)."""

    name: str
    prefix: str
    principal: str
    quotas: dict[str, str] = field(default_factory=dict)
    producer_byte_rate: int | None = DEFAULT_PRODUCER_BYTE_RATE
    services: Obj = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Obj, index: int) -> Cell:
        where = f"tenants[{index}]"
        name = str(spec.get("name") or "")
        if not _NAME.match(name):
            raise ConfigError(f"{where}.name={name!r}: lower-case letters, digits and '-', at most 32")
        quotas: dict[str, str] = {}
        known = {camel(f): f for f in QUOTA_FIELDS}
        for key, value in (spec.get("quotas") or {}).items():
            if key not in known:
                raise ConfigError(f"{where}.quotas.{key}: not a quota (one of {', '.join(known)})")
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{where}.quotas.{key}={value!r}: a positive number")
            quotas[quota_variable(known[key])] = str(value)
        rate = spec.get("producerByteRate", DEFAULT_PRODUCER_BYTE_RATE)
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 0):
            raise ConfigError(f"{where}.producerByteRate={rate!r}: bytes per second (0: no quota)")
        return cls(name=name, prefix=str(spec.get("prefix") or tenant_prefix(name)),
                   principal=str(spec.get("principal") or tenant_principal(name)), quotas=quotas,
                   producer_byte_rate=rate or None, services=dict(spec.get("services") or {}))

    def kafka_quota_arguments(self, bootstrap: str, command_config: str) -> list[str] | None:
        """``kafka-configs`` arguments setting the principal's produce quota (None: the cell has none):
        ``agentstream/ops/client_quotas.py``'s, for the principal of this cell (a quota set before and now
        left out of the values is removed by hand: docs/deploy.md)."""
        if self.producer_byte_rate is None:
            return None
        return kafka_configs_args(self.name, TenantKafkaQuota(producer_byte_rate=self.producer_byte_rate),
                                  bootstrap=bootstrap, command_config=command_config, principal=self.principal)

    @property
    def approver(self) -> str:
        """The cell's approver's database login (``devstack/secure.py``, ``tenant_database_logins``)."""
        return f"approver-{self.name}"


def cells(values: Obj) -> list[Cell]:
    """The ``tenants`` of the values, checked: names, prefixes and principals distinct."""
    out = [Cell.of(dict(spec or {}), i) for i, spec in enumerate(values.get("tenants") or [])]
    if out and not (values.get("security") or {}).get("enabled"):
        raise ConfigError("tenants need security.enabled: a cell is a tenant's own only where the broker decides "
                          "who may write its prefix (its principal, its ACLs)")
    for what in ("name", "prefix", "principal"):
        seen = [getattr(c, what) for c in out]
        if len(seen) != len(set(seen)):
            raise ConfigError(f"tenants: two cells with the same {what}")
    own = str((values.get("kafka") or {}).get("topicPrefix") or "")
    if any(c.prefix == own for c in out):
        raise ConfigError(f"tenants: a cell's prefix {own!r} is the installation's own (kafka.topicPrefix)")
    return out


__all__ = ["QUOTA_FIELDS", "Cell", "camel", "cells", "quota_variable"]
