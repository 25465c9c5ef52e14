"""``agentstream deploy setup``: what the rendered ``…-setup`` Job does once the migration Job has made the
schema and the installation's topics (docs/deploy.md, "Secure and multi-tenant"), as the cluster's super
user and the schema's owner, idempotently (a Job may run again; so may a rotation):

- every tenant cell's topics (the catalogue under its prefix);
- the ACLs of every cell: ``acl_bindings`` of the installation's prefix (the client's rights to
  ``client``) and of each cell's (the client's rights to the cell's principal), as ``dev up --secure`` does;
- the database logins of ``DATABASE_LOGINS`` and each cell's (``tenant_database_logins``), their
  passwords from the mounted Secrets (``<passwords>/<login>/password``) and each tenant login's prefix,
  through ``ensure_database_logins`` (``agentstream/devstack/secure.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from agentstream.devstack.secure import DATABASE_LOGINS, ensure_database_logins, tenant_database_logins
from agentstream.ops.acls import acl_bindings, apply_acls
from agentstream.streams.config.identity import read_secret
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.store import migrations


@dataclass(frozen=True)
class CellRef:
    """A cell as the Job's arguments name it: ``NAME=PREFIX=PRINCIPAL``."""

    name: str
    prefix: str
    principal: str

    @classmethod
    def parse(cls, text: str) -> CellRef:
        parts = text.split("=")
        if len(parts) != 3 or not all(parts):
            raise ConfigError(f"--cell {text!r}: expected NAME=PREFIX=PRINCIPAL")
        return cls(*parts)


@dataclass(frozen=True)
class SetupDone:
    """What a setup did (for its log)."""

    acls: int
    cells: int
    logins: int


async def setup(settings: Settings, cells: list[CellRef], passwords: Path) -> SetupDone:
    """The Kafka side and the database side, concurrently (``settings``: as the super user and the owner)."""
    topics = Topics.of(settings)
    admin = settings.kafka_auth
    logins = {k: v for k, v in DATABASE_LOGINS.items() if v}
    prefixes: dict[str, str] = {}
    for cell in cells:
        mine = tenant_database_logins(cell.name, cell.principal)
        logins.update(mine)
        prefixes.update(dict.fromkeys(mine, cell.prefix))

    async def kafka() -> int:
        count = await apply_acls(settings.kafka_bootstrap, admin, acl_bindings(topics))
        for cell in cells:
            own = dataclasses.replace(topics, prefix=cell.prefix)
            await ensure_topics(settings.kafka_bootstrap, own.specs(), auth=admin)
            count += await apply_acls(settings.kafka_bootstrap, admin, acl_bindings(own, client=cell.principal))
        return count

    async def database() -> None:
        await migrations.migrate(settings.database_url)  # (idempotent: the roles the logins join)
        await ensure_database_logins(settings.database_url, logins,
                                     lambda login: read_secret(passwords / login / "password",
                                                               f"the password of the database login {login}"),
                                     prefixes)

    acls, _ = await asyncio.gather(kafka(), database())
    return SetupDone(acls=acls, cells=len(cells), logins=len(logins))


__all__ = ["CellRef", "SetupDone", "setup"]
