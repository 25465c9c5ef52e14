"""Secrets in what is printed: connection strings and settings with their passwords masked."""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

MASK = "***"
_SCHEME = re.compile(r"(?:^|(?<=,))[A-Za-z][A-Za-z0-9+.\-_]*://")  # _: Kafka listeners (SASL_SSL://)
_SECRET_PARAM = re.compile(r"(?i)(?<![A-Za-z0-9_.])([A-Za-z0-9_.]*(?:password|passwd|secret|token)[A-Za-z0-9_.]*)=([^&;\s,]*)")


def mask_url(value: str) -> str:
    """``value`` (a URL, or a comma-separated list of them such as Kafka bootstrap servers) with every
    password replaced by ``***``: what is printed or logged instead of a connection string.

    ``postgresql://user:secret@host/db`` becomes ``postgresql://user:***@host/db``; the user, host, port
    and database stay (they say where, and are not secret). The user information ends at the *last*
    ``@`` before the query, so a password with a raw ``@`` or ``/`` is masked whole; query parameters
    named like a secret (``?password=``, ``sslpassword=``, ``sasl.password=``, ``token=``) are masked
    too. A URL without a password comes back unchanged."""
    return "".join(_mask_token(part) if part and not part.isspace() else part for part in re.split(r"(\s+)", value))


def _mask_token(token: str) -> str:
    starts = [m.start() for m in _SCHEME.finditer(token)]
    if starts:  # one or more URLs: each runs to the next one's scheme (multi-host DSNs keep their commas)
        bounds = sorted({0, *starts, len(token)})
        return "".join(_mask_one(token[a:b]) for a, b in itertools.pairwise(bounds))
    return ",".join(_mask_one(item) for item in token.split(","))  # host:port lists without a scheme


def _mask_one(url: str) -> str:
    match = _SCHEME.match(url)
    head, rest = (url[: match.end()], url[match.end():]) if match else ("", url)
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, query_at)
    if at < 0 and "@" in rest and "/" not in rest[: rest.index("@")]:
        at = rest.index("@")  # a raw ? or # in the password: the first @ still ends the user information
    if at >= 0 and ":" in rest[:at]:
        rest = f"{rest[: rest.index(':')]}:{MASK}{rest[at:]}"
        query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    if not match and at < 0:
        query_at = 0  # not a URL: a libpq ``key=value`` word such as ``password=…``
    return head + rest[:query_at] + _SECRET_PARAM.sub(lambda m: f"{m.group(1)}={MASK}", rest[query_at:])


def masked_repr(obj: Any) -> str:
    """A dataclass's repr with ``mask_url`` applied to its text fields: settings and statuses carry
    connection strings, and a repr ends up in logs and tracebacks."""
    parts = []
    for f in dataclasses.fields(obj):
        if f.repr:
            value = getattr(obj, f.name)
            parts.append(f"{f.name}={mask_url(value)!r}" if isinstance(value, str) else f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"
