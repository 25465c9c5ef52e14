"""Who each pod is, with ``security.enabled``: its own Kafka principal and database login, each password a
file from a Secret of its own; the Secrets; and the setup Jobs that make the broker and the database know
them (docs/deploy.md, "Secure and multi-tenant").

- **Names come from their owners**: the Kafka principals from ``agentstream/ops/acls.py`` (``PRINCIPALS``,
  ``ADMIN``, a cell's principal), the database logins and their roles from ``agentstream/devstack/secure.py``
  (``DATABASE_LOGINS``, ``tenant_database_logins``), the same lists ``dev up --secure`` uses.
- **Passwords are files, never environment values or arguments**: a container gets
  ``AGENTSTREAM_KAFKA_PASSWORD_FILE`` and ``AGENTSTREAM_DATABASE_PASSWORD_FILE`` and a ``DATABASE_URL`` that
  names its login only; ``ps`` and ``kubectl describe`` show no secret.
- **The Secrets are rendered with the passwords of ``security.passwords``, else generated** (random, as
  ``dev up --secure`` makes its own), because the setup Jobs set every login's and principal's password
  from its Secret: a rendering is self-consistent with no hand-made Secret. The broker's super user and
  the schema's owner exist before any of this, so theirs must be given (or their Secrets made by hand,
  ``security.existingSecrets``). Render once and keep the output where Secrets belong: a new rendering
  makes new passwords (which is how to rotate them: docs/deploy.md).
- **Setup** is two Jobs: ``…-setup`` (``agentstream deploy setup``, the image's: each cell's topics, every
  ACL of ``acl_bindings``, the database logins of ``ensure_database_logins``) and ``…-kafka-config``
  (Kafka's ``kafka-configs`` in Kafka's image: each principal's SCRAM credential from its password file,
  each cell's produce quota), both as the super user and the schema's owner.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from agentstream.deploy.cells import Cell, cells
from agentstream.devstack.secure import DATABASE_LOGINS, SCRAM_ITERATIONS, tenant_database_logins
from agentstream.ops.acls import ADMIN, PRINCIPALS
from agentstream.streams.config.stack_state import DEFAULT_DATABASE

if TYPE_CHECKING:
    from agentstream.deploy.manifests import _Context

Obj = dict[str, Any]

KAFKA_SECRET_DIR = "/var/run/secrets/agentstream-kafka"
DATABASE_SECRET_DIR = "/var/run/secrets/agentstream-db"
#: Where the setup Jobs find every password: ``<dir>/<name>/password`` (one Secret volume each).
SETUP_KAFKA_DIR = "/var/run/secrets/agentstream-kafka-all"
SETUP_DATABASE_DIR = "/var/run/secrets/agentstream-db-all"
#: The admin's Secret's second key: ``kafka-configs --command-config``.
CLIENT_PROPERTIES = "client.properties"
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def volume_name(kind: str, name: str) -> str:
    """A pod volume's name for ``name``'s Secret (a DNS label: principals may hold dots)."""
    return f"{kind}-{name}".replace(".", "-").replace("_", "-")[:63]


@dataclass(frozen=True)
class Credentials:
    """Every principal and login of one rendering, their Secrets' names and passwords."""

    ctx: _Context
    cells: tuple[Cell, ...]
    passwords: dict[tuple[str, str], str]

    @classmethod
    def of(cls, ctx: _Context) -> Credentials:
        given = ((ctx.v.get("security") or {}).get("passwords") or {})
        made = cls(ctx, tuple(cells(ctx.v)), {})
        owner = made.owner_url()
        if owner.password:
            made.passwords[("database", str(owner.username))] = owner.password
        for kind, names in (("kafka", made.kafka_principals), ("database", list(made.database_logins))):
            for name in names:
                value = (given.get(kind) or {}).get(name)
                if value:
                    made.passwords[(kind, name)] = str(value)
                else:
                    made.passwords.setdefault((kind, name), secrets.token_urlsafe(24))
        return made

    # -- who ------------------------------------------------------------------------------------------
    @property
    def sasl(self) -> tuple[str, str]:
        """(security protocol, mechanism): ``security.enabled`` is SASL (``kafka.sasl`` says which)."""
        return self.ctx.sasl() or ("SASL_SSL", "SCRAM-SHA-512")

    @property
    def kafka_principals(self) -> list[str]:
        return [ADMIN, *PRINCIPALS, *(c.principal for c in self.cells)]

    @property
    def database_logins(self) -> dict[str, tuple[str, ...]]:
        """Each login and its roles; the schema's owner (the user of ``database.url``) has none."""
        logins = {k: v for k, v in DATABASE_LOGINS.items() if v}
        for cell in self.cells:
            logins.update(tenant_database_logins(cell.name, cell.principal))
        return {self.owner: (), **logins}

    @property
    def owner(self) -> str:
        return str(self.owner_url().username or "postgres")

    def owner_url(self) -> Any:
        url = str((self.ctx.v.get("database") or {}).get("url")
                  or f"postgresql://postgres@postgres:5432/{DEFAULT_DATABASE}")
        return urlsplit(url)

    def url_for(self, login: str) -> str:
        """``database.url`` with ``login`` and no password (its password is a file)."""
        parts = self.owner_url()
        host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        return str(urlunsplit(parts._replace(netloc=f"{login}@{host}")))

    # -- the Secrets ------------------------------------------------------------------------------------
    def kafka_secret(self, principal: str) -> str:
        sasl = (self.ctx.v.get("kafka") or {}).get("sasl") or {}
        return f"{sasl.get('secretPrefix') or self.ctx.name('kafka-')}{principal}"

    def database_secret(self, login: str) -> str:
        return self.ctx.name(f"db-{login}")

    def secrets(self) -> list[Obj]:
        """A Secret per principal and login (key ``password``; the admin's also ``client.properties``);
        none with ``security.existingSecrets`` (you made them, with these names and keys)."""
        if (self.ctx.v.get("security") or {}).get("existingSecrets"):
            return []
        out = []
        for principal in self.kafka_principals:
            data = {"password": self.passwords[("kafka", principal)]}
            if principal == ADMIN:
                data[CLIENT_PROPERTIES] = self.client_properties()
            out.append(self._secret(self.kafka_secret(principal), data))
        for login in self.database_logins:
            out.append(self._secret(self.database_secret(login), {"password": self.passwords[("database", login)]}))
        return out

    def _secret(self, name: str, data: dict[str, str]) -> Obj:
        # ``data`` (base64), not ``stringData``: podman kube play reads a Secret's data only.
        meta = {**self.ctx.meta("credentials", "credentials"), "name": name}
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}

    def client_properties(self) -> str:
        """The super user's client configuration for Kafka's own tools (the password is in this file,
        which is in a Secret, never on their command line)."""
        protocol, mechanism = self.sasl
        password = self.passwords[("kafka", ADMIN)].replace("\\", "\\\\").replace('"', '\\"')
        return (f"security.protocol={protocol}\nsasl.mechanism={mechanism}\n"
                f'sasl.jaas.config={_LOGIN_MODULES[mechanism]} required username="{ADMIN}" password="{password}";\n')

    # -- a container's identity -------------------------------------------------------------------------
    def database_login(self, container: Obj, login: str | None) -> list[Obj]:
        """``container`` connects as ``login`` (None: it uses no database): ``DATABASE_URL`` naming the
        login, its password a file; returns the pod volumes this takes."""
        if login is None:
            return []
        container.setdefault("env", []).extend([
            {"name": "DATABASE_URL", "value": self.url_for(login)},
            {"name": "AGENTSTREAM_DATABASE_PASSWORD_FILE", "value": f"{DATABASE_SECRET_DIR}/password"}])
        container["volumeMounts"].append({"name": "db-credentials", "mountPath": DATABASE_SECRET_DIR, "readOnly": True})
        return [{"name": "db-credentials", "secret": {"secretName": self.database_secret(login), "defaultMode": 0o400}}]

    def all_passwords(self, container: Obj, *, kafka: bool, database: bool) -> list[Obj]:
        """Every principal's (``kafka``) and login's (``database``) Secret mounted at
        ``<SETUP_*_DIR>/<name>/``, for the setup Jobs."""
        volumes: list[Obj] = []
        for wanted, kind, names, secret, root in (
                (kafka, "kafka", self.kafka_principals, self.kafka_secret, SETUP_KAFKA_DIR),
                (database, "db", list(self.database_logins), self.database_secret, SETUP_DATABASE_DIR)):
            for name in names if wanted else ():
                volume = volume_name(kind, name)
                container["volumeMounts"].append({"name": volume, "mountPath": f"{root}/{name}", "readOnly": True})
                volumes.append({"name": volume, "secret": {"secretName": secret(name), "defaultMode": 0o400}})
        return volumes

    # -- the setup Jobs ---------------------------------------------------------------------------------
    def setup_job(self) -> Obj:
        """``agentstream deploy setup``: each cell's topics, the ACLs, the database logins."""
        args = ["deploy", "setup", "--passwords", SETUP_DATABASE_DIR]
        for cell in self.cells:
            args += ["--cell", f"{cell.name}={cell.prefix}={cell.principal}"]
        container = self.ctx.container("setup", {}, args)
        volumes = self.ctx.kafka_principal(container, ADMIN)
        volumes += self.database_login(container, self.owner)
        volumes += self.all_passwords(container, kafka=False, database=True)
        return self._job("setup", container, volumes)

    def kafka_config_job(self) -> Obj:
        """Kafka's ``kafka-configs`` (in Kafka's image, ``security.kafkaTools``): every principal's SCRAM
        credential, made from its password file (unless ``security.scramCredentials: false``: a cluster
        whose users are made elsewhere), then each cell's produce quota. One JVM per command: seconds each."""
        tools = (self.ctx.v.get("security") or {}).get("kafkaTools") or {}
        _, mechanism = self.sasl
        bootstrap = str((self.ctx.v.get("kafka") or {}).get("bootstrapServers") or "")
        config = f'"$dir/{ADMIN}/{CLIENT_PROPERTIES}"'
        lines = ['set -eu', 'bin="${KAFKA_BIN:-/opt/kafka/bin}"; dir="${SECRETS_DIR:-' + SETUP_KAFKA_DIR + '}"',
                 'conf="${TMPDIR:-/tmp}/scram.properties"; trap \'rm -f "$conf"\' EXIT']
        if mechanism.startswith("SCRAM-") and (self.ctx.v.get("security") or {}).get("scramCredentials", True):
            # printf is the shell's own: the password is never an argument of a process.
            for principal in self.kafka_principals[1:]:
                lines.append(f'printf "%s=iterations={SCRAM_ITERATIONS},password=%s\\n" {mechanism} '
                             f'"$(cat "$dir/{principal}/password")" > "$conf"')
                lines.append(f'"$bin/kafka-configs.sh" --bootstrap-server {bootstrap} --command-config {config} '
                             f'--alter --entity-type users --entity-name {principal} --add-config-file "$conf"')
        for cell in self.cells:  # (the path is the shell's to expand: quoted, unescaped)
            arguments = cell.kafka_quota_arguments(bootstrap, config)
            if arguments:
                lines.append('"$bin/kafka-configs.sh" ' + " ".join(arguments))
        image = f"{tools.get('repository') or 'docker.io/apache/kafka'}:{tools.get('tag') or '4.0.2'}"
        container = {**self.ctx.container("kafka-config", {}, ["-c", "\n".join(lines)]), "image": image,
                     "command": ["sh"], "envFrom": []}
        container["env"] = [{"name": "KAFKA_BIN", "value": str(tools.get("bin") or "/opt/kafka/bin")},
                            {"name": "SECRETS_DIR", "value": SETUP_KAFKA_DIR},
                            {"name": "LOG_DIR", "value": "/tmp/kafka-logs"}]  # (the root is read-only)
        volumes = self.all_passwords(container, kafka=True, database=False)
        return self._job("kafka-config", container, volumes)

    def _job(self, suffix: str, container: Obj, volumes: list[Obj]) -> Obj:
        job = self.ctx.v.get("migrations") or {}
        pod = self.ctx.pod_spec([container], restart="OnFailure", extra={"volumes": self.ctx.volumes(volumes)})
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": self.ctx.meta(suffix, suffix),
                "spec": {"backoffLimit": int(job.get("backoffLimit", 6)), "ttlSecondsAfterFinished": 3600,
                         "template": {"metadata": {"labels": self.ctx.labels(suffix)}, "spec": pod}}}


__all__ = ["CLIENT_PROPERTIES", "DATABASE_SECRET_DIR", "KAFKA_SECRET_DIR", "SETUP_DATABASE_DIR", "SETUP_KAFKA_DIR",
           "Credentials", "volume_name"]
