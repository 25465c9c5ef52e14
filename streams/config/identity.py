"""Who a process is: the Kafka principal it authenticates as and the PostgreSQL login it connects with,
and the credentials they resolve to.

A process's ``Identity`` is a value decided once, where the process starts (the ``agentstream`` command
that runs it: ``worker planner`` is the planner, ``approve`` the approver), and handed to
``Settings.load(identity=…)``; everything after reads it from the settings. What the environment
configures still wins: ``AGENTSTREAM_KAFKA_USERNAME`` (with its password) and ``DATABASE_URL`` are a
user's own cluster and database, where the local stack's secrets play no part. On the local stack
started with ``--secure`` (its state file records ``secrets_dir``), the identity picks the principal's
and the login's password file there (docs/security.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentstream.streams.config import env
from agentstream.streams.config.kafka_auth import DEFAULT_MECHANISM, KafkaAuth
from agentstream.streams.core.errors import ConfigError

#: The principals with a database login of their own on the local secure stack: each service, ``worker``
#: (all four), the client and the HTTP gateway. Any other (``admin``, ``operator``, ``alerts``, ``replay``)
#: connects as the schema owner unless its identity names a login.
OWN_LOGINS = ("client", "planner", "tools", "retrieval", "inference", "worker", "gateway")


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Who this process is on the local secure stack. ``Identity()`` is the client.

    ``principal``: ``client``, a service (``planner``, ``inference``, ``retrieval``, ``tools``, or ``worker``
    for all four), ``admin`` (creates topics), ``operator`` (dead letters), ``alerts`` or ``replay``.
    ``database_login``: a login other than the principal's (``postgres``, the schema owner, for
    ``agentstream ingest``; ``approver``; ``operator-reader``); None is the principal's own where it has
    one (``OWN_LOGINS``), else the schema owner's.

    Both are the names of a process working for no tenant; ``kafka_user`` and ``login`` give the names for
    the tenant it works for (``AGENTSTREAM_TENANT``).
    """

    principal: str = "client"
    database_login: str | None = None

    def kafka_user(self, tenant: str) -> str:
        """The Kafka user name: a tenant's client is the tenant's own (``tenant-<T>``)."""
        if self.principal == "client" and tenant:
            return f"tenant-{tenant}"
        return self.principal

    def login(self, tenant: str) -> str | None:
        """The PostgreSQL login; None: the schema owner's (the URL the state file records)."""
        login = self.database_login or (self.kafka_user(tenant) if self.principal in OWN_LOGINS else None)
        if login == "approver" and tenant:
            login = f"approver-{tenant}"  # a tenant's approver decides on its own tenant's runs only
        return login


#: The identity of any process that names none: the client.
CLIENT = Identity()


def load_kafka_auth(recorded: dict[str, Any], *, identity: Identity = CLIENT, external: bool = False) -> KafkaAuth:
    """``AGENTSTREAM_KAFKA_SECURITY_PROTOCOL`` (PLAINTEXT, SASL_PLAINTEXT, SASL_SSL),
    ``AGENTSTREAM_KAFKA_SASL_MECHANISM`` (SCRAM-SHA-512 by default), ``AGENTSTREAM_KAFKA_USERNAME`` and
    the password from ``AGENTSTREAM_KAFKA_PASSWORD_FILE`` (or ``AGENTSTREAM_KAFKA_PASSWORD``),
    ``AGENTSTREAM_KAFKA_SSL_CAFILE``. Without them, on the local stack started with ``--secure`` (its
    state file, ``recorded``, names ``kafka_security`` and ``secrets_dir``; not when ``external``, a
    cluster named in the environment): ``identity``'s principal with its password file there."""
    protocol = os.environ.get("AGENTSTREAM_KAFKA_SECURITY_PROTOCOL", "").strip().upper()
    username = os.environ.get("AGENTSTREAM_KAFKA_USERNAME", "").strip() or None
    password_file = os.environ.get("AGENTSTREAM_KAFKA_PASSWORD_FILE", "").strip()
    password = os.environ.get("AGENTSTREAM_KAFKA_PASSWORD") or None
    secrets = recorded.get("secrets_dir") if not external else None
    if not protocol:  # a user name alone means SASL; else the local stack's own, else none
        protocol = "SASL_PLAINTEXT" if username else str((secrets and recorded.get("kafka_security")) or "PLAINTEXT")
    if protocol != "PLAINTEXT" and not username and secrets:
        username = identity.kafka_user(env.tenant())
    if password_file:
        password = read_secret(Path(password_file).expanduser(), "AGENTSTREAM_KAFKA_PASSWORD_FILE")
    elif password is None and username and secrets:
        password = read_secret(Path(secrets) / f"{username}.password", f"the local stack's secret of {username}")
    cafile = os.environ.get("AGENTSTREAM_KAFKA_SSL_CAFILE", "").strip()
    return KafkaAuth(security_protocol=protocol,
                     sasl_mechanism=os.environ.get("AGENTSTREAM_KAFKA_SASL_MECHANISM", "").strip().upper()
                     or DEFAULT_MECHANISM,
                     username=username, password=password, ssl_cafile=Path(cafile) if cafile else None)


def login_url(recorded: dict[str, Any], identity: Identity) -> str | None:
    """On the local secure stack: the recorded (owner's) URL with ``identity``'s own login instead, when
    it has one (a service's has only its tables, the client's is read-only); else None."""
    login = identity.login(env.tenant())
    owner, secrets = recorded.get("database_url"), recorded.get("secrets_dir")
    if not (login and owner and secrets):
        return None
    password = read_secret(Path(secrets) / f"db-{login}.password", f"the local stack's database login {login}")
    parts = urlsplit(owner)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    netloc = f"{login}:{password}@{host}"
    return str(urlunsplit(parts._replace(netloc=netloc)))


def env_database_url() -> str:
    """``DATABASE_URL`` from the environment ('' when unset), with the password of
    ``AGENTSTREAM_DATABASE_PASSWORD_FILE`` put in when that is set: a deployment mounts each login's
    password as a file (``agentstream deploy render``, docs/deploy.md) and names only the login in the
    URL, so that no password is in a process's environment. A password in the URL itself is replaced."""
    url = os.environ.get("DATABASE_URL", "").strip()
    password_file = os.environ.get("AGENTSTREAM_DATABASE_PASSWORD_FILE", "").strip()
    if not (url and password_file):
        return url
    from urllib.parse import quote

    password = read_secret(Path(password_file).expanduser(), "AGENTSTREAM_DATABASE_PASSWORD_FILE")
    parts = urlsplit(url)
    if not parts.username:
        raise ConfigError("AGENTSTREAM_DATABASE_PASSWORD_FILE needs a login in DATABASE_URL (postgresql://LOGIN@HOST/DB)")
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname or "")
    return str(urlunsplit(parts._replace(netloc=f"{parts.username}:{quote(password, safe='')}@{host}")))


def read_secret(path: Path, what: str) -> str:
    """A secret file's content, stripped; ``ConfigError`` naming ``what`` when it is unreadable or empty."""
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} ({path}): {exc.strerror or exc}") from None
    if not secret:
        raise ConfigError(f"{what} ({path}) is empty")
    return secret
