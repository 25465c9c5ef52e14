"""The local stack's credentials (``agentstream dev up --secure``): one password per principal and login.

Each Kafka principal of ``agentstream/ops/acls.py`` (and the super user ``admin``) gets a random password in
``<state dir>/secrets/<name>.password``, each PostgreSQL login (``DATABASE_LOGINS``: the superuser that
owns the schema, each service's, the read-only ``client``, the ``operator-reader`` and the
``approver``) one in ``db-<login>.password`` (directory 0700, files 0600), made once and kept across
restarts.
A process on this machine finds its own there through the state file (``config.load_kafka_auth``); a
process elsewhere is given the file (``AGENTSTREAM_KAFKA_PASSWORD_FILE``), never the password on a
command line. The broker learns the clients' SCRAM credentials as salted hashes when its storage is
formatted; a salted password logs in as well as the password (SCRAM's client proof is made from it), so
they reach the storage tool in a 0600 argument file (``devstack/kafka.py``), never on its command line,
which any account can read in ``/proc``. Only the super user's password, used by the brokers among
themselves (PLAIN), is in ``server.properties``, which is 0600.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agentstream.ops.acls import ADMIN, PRINCIPALS, tenant_prefix, tenant_principal
from agentstream.streams.config.kafka_auth import KafkaAuth

_SERVICE_ROLES = ("agentstream_planner", "agentstream_tools", "agentstream_retrieval", "agentstream_inference")
#: PostgreSQL logins of the secure stack and the roles they are members of (migrations 0011, 0012 and
#: 0015, 0023): the superuser (owner of the schema: migrations, ingest), each service's own (``worker`` runs
#: all four), the client's read-only one (the default cell's runs only), the operator's reader (every
#: cell's runs and dead letters: ``status --operator``, ``dlq list|show``, ``replay show|diff``; never a
#: client's), the operator's approver, the operator (``dlq redrive``: re-drive records only) and the
#: replays' (``replay rerun|fork|window``: writes replay pipelines' runs only).
DATABASE_LOGINS: dict[str, tuple[str, ...]] = {
    "postgres": (), "client": ("agentstream_reader",), "operator-reader": ("agentstream_operator_reader",),
    "approver": ("agentstream_approver",), "gateway": ("agentstream_gateway",),
    "operator": ("agentstream_operator",), "replay": ("agentstream_replay",),
    **{role.removeprefix("agentstream_"): (role,) for role in _SERVICE_ROLES}, "worker": _SERVICE_ROLES}
SCRAM_ITERATIONS = 8192
PROTOCOL = "SASL_PLAINTEXT"
MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class StackSecrets:
    """The password files under ``directory``; ``tenants``: each tenant's Kafka principal and database
    logins (``tenant-<name>``, and ``approver-<name>`` in PostgreSQL) too."""

    directory: Path
    tenants: tuple[str, ...] = ()

    @classmethod
    def ensure(cls, directory: Path, tenants: tuple[str, ...] = ()) -> StackSecrets:
        """Create the directory and a password for every principal and login that has none yet."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        made = cls(directory, tenants)
        for path in [made.path(n) for n in made.kafka_principals] + [made.db_path(n) for n in made.database_logins]:
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_urlsafe(24) + "\n")
        return made

    @property
    def kafka_principals(self) -> list[str]:
        return [ADMIN, *PRINCIPALS, *(tenant_principal(t) for t in self.tenants)]

    @property
    def database_logins(self) -> dict[str, tuple[str, ...]]:
        """Each login and its roles (a tenant's also have a row in ``tenant_logins``)."""
        tenants = {login: roles for t in self.tenants for login, roles in tenant_database_logins(t).items()}
        return {**DATABASE_LOGINS, **tenants}

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.password"

    def db_path(self, login: str) -> Path:
        return self.directory / f"db-{login}.password"

    def db_password(self, login: str) -> str:
        return self.db_path(login).read_text().strip()

    def password(self, name: str) -> str:
        return self.path(name).read_text().strip()

    def auth(self, name: str) -> KafkaAuth:
        return KafkaAuth(security_protocol=PROTOCOL, sasl_mechanism=MECHANISM, username=name,
                         password=self.password(name))

    @property
    def admin(self) -> KafkaAuth:
        return self.auth(ADMIN)

    def scram_arguments(self) -> list[str]:
        """``kafka.tools.StorageTool format`` arguments creating every principal's SCRAM credential, as
        salted hashes (RFC 5802: PBKDF2-HMAC over the password with a random salt). Secrets: a salted
        password is enough to log in, so these go in an argument file only (``files.java_argfile``)."""
        args: list[str] = []
        for name in self.kafka_principals:
            salt = os.urandom(16)
            salted = hashlib.pbkdf2_hmac("sha512", self.password(name).encode(), salt, SCRAM_ITERATIONS)
            args += ["--add-scram", f"{MECHANISM}=[name={name},iterations={SCRAM_ITERATIONS},"
                                    f'salt="{base64.b64encode(salt).decode()}",'
                                    f'saltedpassword="{base64.b64encode(salted).decode()}"]']
        return args

    def broker_properties(self, template: Path) -> str:
        """The secure block of ``server.properties`` (``infra/kafka/server-secure.properties.in``)."""
        return string.Template(template.read_text()).substitute(admin_password=self.password(ADMIN))


def tenant_database_logins(tenant: str, principal: str | None = None) -> dict[str, tuple[str, ...]]:
    """A tenant's database logins and their roles: its client's (named as its Kafka principal,
    ``tenant-<name>`` unless ``principal`` says otherwise) and its approver's (``approver-<name>``)."""
    return {principal or tenant_principal(tenant): ("agentstream_tenant",),
            f"approver-{tenant}": ("agentstream_tenant_approver",)}


async def create_database_logins(owner_url: str, secrets: StackSecrets) -> None:
    """The non-superuser logins of ``DATABASE_LOGINS`` with their passwords and group roles (which the
    migrations create), made or brought up to date; run as the schema's owner after the migrations."""
    cells = {login: tenant_prefix(t) for t in secrets.tenants for login in tenant_database_logins(t)}
    await ensure_database_logins(owner_url, secrets.database_logins, secrets.db_password, cells)


async def ensure_database_logins(owner_url: str, logins: Mapping[str, tuple[str, ...]],
                                 password: Callable[[str], str], tenant_prefixes: Mapping[str, str]) -> None:
    """Each of ``logins`` with roles (a login without any is the owner's: left alone) made or brought up to
    date with ``password(login)`` and its group roles, and each tenant login's prefix recorded
    (``tenant_prefixes``: login -> topic prefix). ``dev up --secure`` and a deployment's setup Job
    (``agentstream deploy setup``) both come here."""
    import asyncpg

    conn = await asyncpg.connect(owner_url)
    try:
        for login, roles in logins.items():
            if not roles:
                continue
            verb = "ALTER" if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", login) else "CREATE"
            # DDL takes no parameters: the statement is quoted by the server's format() (%I, %L).
            await conn.execute(await conn.fetchval("SELECT format('%s ROLE %I LOGIN PASSWORD %L', $1::text, $2::text, "
                                                   "$3::text)", verb, login, password(login)))
            for role in roles:
                await conn.execute(await conn.fetchval("SELECT format('GRANT %I TO %I', $1::text, $2::text)", role,
                                                       login))
        for login, prefix in tenant_prefixes.items():  # which prefix each tenant login may see (migration 0013)
            await conn.execute("INSERT INTO tenant_logins (login, topic_prefix) VALUES ($1, $2) ON CONFLICT (login) "
                               "DO UPDATE SET topic_prefix = EXCLUDED.topic_prefix", login, prefix)
    finally:
        await conn.close()
