"""Who a process is to Kafka: its security protocol and SASL credentials, and the client options they make.

Every Kafka client agentstream creates (producers, consumers, admin clients, faust) takes its options from
``kafka_options(bootstrap, auth)``, so a cluster with authentication needs nothing but settings: each
service and the client authenticate as their own principal (docs/security.md). The credentials come from
``agentstream.streams.config.identity`` (``load_kafka_auth``, for the identity a process was started as): a
password from a file or the environment, never from the command line, where ``ps`` would show it.

What is supported: ``PLAINTEXT`` (the default, no authentication), ``SASL_PLAINTEXT`` and ``SASL_SSL``
with ``SCRAM-SHA-512`` (the default mechanism), ``SCRAM-SHA-256`` or ``PLAIN``. TLS needs a CA file
(``ssl_cafile``) or the system's trust store.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentstream.streams.config.kafka_defaults import disable_auto_topic_creation
from agentstream.streams.core.errors import ConfigError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
DEFAULT_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class KafkaAuth:
    """One principal's way in. ``KafkaAuth()`` is an unauthenticated PLAINTEXT connection."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = DEFAULT_MECHANISM
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: TLS (``SASL_SSL``): the CA that signed the brokers' certificates; None trusts the system's CAs.
    ssl_cafile: Path | None = None

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"Kafka security protocol {self.security_protocol!r} is not one of "
                              f"{', '.join(SECURITY_PROTOCOLS)}")
        if self.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"SASL mechanism {self.sasl_mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}")
        if self.sasl and not (self.username and self.password):
            raise ConfigError(f"Kafka {self.security_protocol} needs a user name and a password "
                              "(AGENTSTREAM_KAFKA_USERNAME and AGENTSTREAM_KAFKA_PASSWORD_FILE)")

    def __repr__(self) -> str:
        who = f", username={self.username!r}, password=***" if self.sasl else ""
        return f"KafkaAuth({self.security_protocol}{who})"

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def principal(self) -> str:
        """The principal the broker's authorizer sees (ACLs name it)."""
        return f"User:{self.username}" if self.sasl else "User:ANONYMOUS"

    def options(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's producers, consumers and clients (admin included)."""
        if not self.sasl:
            return {}
        opts: dict[str, Any] = {"security_protocol": self.security_protocol, "sasl_mechanism": self.sasl_mechanism,
                                "sasl_plain_username": self.username, "sasl_plain_password": self.password}
        if self.security_protocol == "SASL_SSL":
            opts["ssl_context"] = self.ssl_context()
        return opts

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
        return context

    def faust_credentials(self) -> Any:
        """The same principal for a faust-streaming app (``faust.App(broker_credentials=…)``); None when
        unauthenticated."""
        if not self.sasl:
            return None
        import faust

        return faust.SASLCredentials(username=self.username, password=self.password, mechanism=self.sasl_mechanism,
                                     ssl_context=self.ssl_context() if self.security_protocol == "SASL_SSL" else None)


def kafka_options(bootstrap: str, auth: KafkaAuth) -> dict[str, Any]:
    """``bootstrap_servers`` and ``auth``'s security options: ``AIOKafkaProducer(**kafka_options(...), acks=…)``.
    A process's own principal is its settings' (``Settings.kafka_auth``, from the identity it was started
    as); ``KafkaAuth()`` is an unauthenticated connection.

    Every client's options pass here, so this is where aiokafka's metadata requests are told, once per
    process, never to create a topic (``kafka_defaults``)."""
    disable_auto_topic_creation()
    return {"bootstrap_servers": bootstrap, **auth.options()}
