"""The local stack's Kafka credentials (``agentstream dev up --secure``): one password per principal.

Each principal of ``streams/acls.py`` (and the super user ``admin``) gets a random password in
``<state dir>/secrets/<name>.password`` (directory 0700, files 0600), made once and kept across restarts.
A process on this machine finds its own there through the state file (``config.load_kafka_auth``); a
process elsewhere is given the file (``AGENTSTREAM_KAFKA_PASSWORD_FILE``), never the password on a
command line. The broker learns the clients' SCRAM credentials as salted hashes when its storage is
formatted, so no password is on the formatting command's line either; only the super user's, used by
the brokers among themselves (PLAIN), is in ``server.properties``, which is 0600.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import string
from dataclasses import dataclass
from pathlib import Path

from agentstream.streams.acls import ADMIN, PRINCIPALS
from agentstream.streams.kafka_auth import KafkaAuth

SCRAM_ITERATIONS = 8192
PROTOCOL = "SASL_PLAINTEXT"
MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class KafkaSecrets:
    """The password files under ``directory``."""

    directory: Path

    @classmethod
    def ensure(cls, directory: Path) -> KafkaSecrets:
        """Create the directory and a password for every principal that has none yet."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        made = cls(directory)
        for name in (ADMIN, *PRINCIPALS):
            path = made.path(name)
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_urlsafe(24) + "\n")
        return made

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.password"

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
        salted hashes (RFC 5802: PBKDF2-HMAC over the password with a random salt)."""
        args: list[str] = []
        for name in (ADMIN, *PRINCIPALS):
            salt = os.urandom(16)
            salted = hashlib.pbkdf2_hmac("sha512", self.password(name).encode(), salt, SCRAM_ITERATIONS)
            args += ["--add-scram", f"{MECHANISM}=[name={name},iterations={SCRAM_ITERATIONS},"
                                    f'salt="{base64.b64encode(salt).decode()}",'
                                    f'saltedpassword="{base64.b64encode(salted).decode()}"]']
        return args

    def broker_properties(self, template: Path) -> str:
        """The secure block of ``server.properties`` (``infra/kafka/server-secure.properties.in``)."""
        return string.Template(template.read_text()).substitute(admin_password=self.password(ADMIN))
