"""``http_get``: fetch a URL for the model, only from hosts an operator listed.

The model chooses the URL, so everything about it is hostile until checked (server-side request
forgery: a model talked into fetching ``http://169.254.169.254/`` or an internal admin page). The tool
is off unless a worker is given an ``HttpGetConfig`` with an allowlist, and every request, the first
and every redirect, must pass:

- scheme ``http`` or ``https``, no user:password part;
- host exactly on the allowlist (lower-cased, trailing dot dropped; no suffix or wildcard matching, so
  ``example.com.evil.net`` and ``evil.net#@example.com`` do not pass);
- an IPv4 address written in another form than a dotted quad (``http://2130706433/``,
  ``http://0x7f.1/``: the system resolver would connect to 127.0.0.1) is refused;
- every address the host resolves to is public (not loopback, private, link-local, multicast,
  reserved or unspecified) unless ``allow_private``; an IPv6 address that carries an IPv4 one (mapped,
  NAT64, 6to4, ISATAP) is judged by that IPv4 address, and Teredo and the deprecated encodings are
  refused (``_refused_address``). The check runs inside the connector's resolver,
  at connection time, on the addresses actually connected to, so a DNS answer that changes between a
  check and the connection (rebinding) cannot slip through; IP literals are checked before;
- redirects are followed by hand (``max_redirects``), each target checked like the first URL;
- the body is read in chunks and the call fails once it passes ``max_bytes`` (after decompression,
  so a compressed bomb is stopped too); the whole call, redirects included, has ``timeout_s``;
- the body is decoded with the charset the response declares only if it is one of the web's common
  text encodings (``_CHARSETS``: UTF-8/16/32, ISO-8859-*, windows-125*, the CJK ones…), whose
  decoders take linear time; anything else is read as UTF-8. The server chooses the charset, and
  some of Python's codecs are no text encodings at all, or slow: CPython's ``punycode`` decoder is
  quadratic, and a 1 MB body declared ``charset=punycode`` held the event loop for 44 s (issue 37).

The result is ``{"url", "status", "content_type", "text", "truncated"}``; ``text`` is cut at
``max_text_chars``. Any HTTP status is a result (the model may want to know about a 404); network
errors and timeouts are retriable ``ToolError``s (a GET is safe to repeat).
"""

from __future__ import annotations

import asyncio
import codecs
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from agentstream.services.tools.registry import Tool, tool
from agentstream.streams.core.errors import ToolError

USER_AGENT = "agentstream-http-get/0.1"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: The charsets a body is decoded with (Python's names for them, ``codecs.lookup(name).name``): text
#: encodings whose decoders are linear in the body's size (measured: ~10-60 ms for 1 MB of random
#: bytes each, with errors="replace"). Not punycode, idna, utf-7, nor the bytes-to-bytes codecs.
_CHARSETS = frozenset({
    "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "ascii",
    *(f"iso8859-{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16)),
    *(f"cp{n}" for n in range(1250, 1259)), "cp437", "cp850", "cp866", "cp874", "koi8-r", "koi8-u",
    "mac-roman", "tis-620", "shift_jis", "cp932", "euc_jp", "iso2022_jp", "gb2312", "gbk", "gb18030",
    "big5", "big5hkscs", "euc_kr", "cp949"})


def _normal_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


@dataclass(frozen=True, kw_only=True)
class HttpGetConfig:
    """What ``http_get`` may fetch. ``allowed_hosts`` must not be empty: an empty allowlist means the
    tool is off, which is expressed by not building it at all."""

    allowed_hosts: frozenset[str]
    #: Largest body read, in bytes (decompressed); a larger one fails the call.
    max_bytes: int = 1_000_000
    #: Longest text handed back to the model (the rest is cut, ``truncated`` says so).
    max_text_chars: int = 20_000
    #: For the whole call: connection, redirects and body.
    timeout_s: float = 10.0
    max_redirects: int = 3
    #: Let allowlisted hosts resolve to loopback/private addresses (tests, an internal service you mean).
    allow_private: bool = False
    #: Executions at most for network errors and timeouts (GET is repeatable).
    max_attempts: int = 2
    allowed_schemes: frozenset[str] = field(default_factory=lambda: frozenset({"http", "https"}))

    def __post_init__(self) -> None:
        hosts = frozenset(_normal_host(h) for h in self.allowed_hosts if h.strip())
        if not hosts:
            raise ValueError("HttpGetConfig needs at least one allowed host (leave http_get off otherwise)")
        object.__setattr__(self, "allowed_hosts", hosts)
        if self.max_bytes <= 0 or self.max_text_chars <= 0 or self.timeout_s <= 0 or self.max_redirects < 0:
            raise ValueError("HttpGetConfig: max_bytes, max_text_chars and timeout_s must be positive")

    @classmethod
    def parse_hosts(cls, value: str | Iterable[str], **options: Any) -> HttpGetConfig | None:
        """From a comma-separated list (an environment variable, a CLI flag); None when it is empty."""
        hosts = value.split(",") if isinstance(value, str) else list(value)
        hosts = [h for h in hosts if h.strip()]
        return cls(allowed_hosts=frozenset(hosts), **options) if hosts else None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_ISATAP_IID = 0x00005EFE  # interface identifier 0000:5efe:a.b.c.d (0200:5efe with the u bit)


def _refused_address(address: str) -> str | None:
    """Why connecting to ``address`` is refused, or None for a public address.

    An IPv6 address that carries an IPv4 one reaches that IPv4 host through a translator or tunnel, so
    the IPv4 address is what is checked: IPv4-mapped (``::ffff:a.b.c.d``), NAT64 (``64:ff9b::/96``),
    6to4 (``2002::/16``, bits 16-48) and ISATAP (``…:0:5efe:a.b.c.d``, whose IPv6 prefix is checked
    too). Encodings that are deprecated or whose IPv4 part cannot be trusted are refused outright:
    IPv4-compatible (``::a.b.c.d``), IPv4-translated (``::ffff:0:a.b.c.d``), Teredo (``2001::/32``: the
    client's address is in there, inverted, and the relay is anyone's) and local-use NAT64
    (``64:ff9b:1::/48``: a translator inside some network, by definition)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        problem = _refused_ip(ip)
        return f"{address} is {problem}" if problem else None
    outright = _refused_encoding(ip)
    if outright:
        return f"{address} is {outright}"
    embedded, prefix_matters = _embedded_ipv4(ip)
    if embedded is not None:
        problem = _refused_ip(embedded)
        if problem:
            return f"{address} carries {embedded}, which is {problem}"
        if not prefix_matters:
            return None  # a translator's fixed prefix: the IPv4 host is the destination
    problem = _refused_ip(ip)
    return f"{address} is {problem}" if problem else None


def _refused_encoding(ip: ipaddress.IPv6Address) -> str | None:
    if ip in _IPV4_TRANSLATED:
        return "an IPv4-translated address (deprecated)"
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # :: and ::1 are the ordinary checks' business
        return "an IPv4-compatible address (deprecated)"
    if ip in _NAT64_LOCAL:
        return "a local-use NAT64 address"
    if ip.teredo is not None:
        return "a Teredo address"
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address | None, bool]:
    """The IPv4 address ``ip`` leads to, if any, and whether the IPv6 prefix must be checked as well."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, False
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), False
    if ip.sixtofour is not None:
        return ip.sixtofour, False
    if (int(ip) >> 32) & 0xFCFFFFFF == _ISATAP_IID:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), True
    return None, False


def _refused_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    for attribute in ("is_loopback", "is_link_local", "is_unspecified", "is_multicast", "is_reserved",
                      "is_private"):
        if getattr(ip, attribute):
            return attribute[3:].replace("_", "-")
    if not ip.is_global:
        return "not a public address"
    return None


def _numeric_ipv4(host: str) -> str | None:
    """``host`` as the dotted quad it means when it is an IPv4 address in another form that resolvers
    accept (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``), else None."""
    if not host or not all(c in "0123456789abcdefx." for c in host) or not host[0].isdigit():
        return None
    try:
        quad = socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None
    return quad if quad != host else None


class _PublicOnlyResolver(AbstractResolver):
    """The default resolver, refusing a host if any of its addresses is not public (all of them are
    checked, not just the first, since the connector may try any)."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            problem = _refused_address(result["host"])
            if problem:
                raise ToolError(f"refused: {host} resolves to {problem}")
        return results

    async def close(self) -> None:
        await self._inner.close()


def check_url(url: URL, config: HttpGetConfig) -> None:
    """Raise ``ToolError`` unless ``url`` may be fetched (scheme, credentials, allowlist, IP literal)."""
    if url.scheme not in config.allowed_schemes:
        raise ToolError(f"refused: scheme {url.scheme or '(none)'!r}; only "
                        f"{', '.join(sorted(config.allowed_schemes))} URLs are fetched")
    if url.user is not None or url.password is not None:
        raise ToolError("refused: URLs with a user name or password are not fetched")
    host = _normal_host(url.host or "")
    if not host:
        raise ToolError("refused: the URL has no host")
    quad = _numeric_ipv4(host)
    if quad is not None:  # getaddrinfo would connect to it; an allowlist entry is never written that way
        raise ToolError(f"refused: host {host!r} is the IPv4 address {quad} in a non-standard form")
    if host not in config.allowed_hosts:
        raise ToolError(f"refused: host {host!r} is not on this worker's allowlist")
    if not config.allow_private:
        try:
            problem = _refused_address(host.strip("[]"))
        except ValueError:
            problem = None  # a name: checked by the resolver when connecting
        if problem:
            raise ToolError(f"refused: {problem}")


async def fetch(url: str, config: HttpGetConfig) -> dict[str, Any]:
    """GET ``url`` under ``config``'s rules (see the module docstring)."""
    try:
        target = URL(url)
    except (ValueError, TypeError) as exc:
        raise ToolError(f"not a URL: {exc}") from None
    check_url(target, config)
    resolver = None if config.allow_private else _PublicOnlyResolver()
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, limit=4)
    session = aiohttp.ClientSession(connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
                                    headers={"User-Agent": USER_AGENT})
    try:
        async with asyncio.timeout(config.timeout_s), session:
            return await _follow(session, target, config)
    except TimeoutError:
        raise ToolError(f"http_get timed out after {config.timeout_s:g} s", retriable=True) from None
    except aiohttp.InvalidURL as exc:
        raise ToolError(f"refused: invalid URL {exc}") from None
    except aiohttp.ClientConnectorError as exc:
        raise ToolError(f"could not connect to {target.host}: {exc.os_error}", retriable=True) from None
    except aiohttp.ClientError as exc:
        raise ToolError(f"http_get failed: {type(exc).__name__}: {exc}", retriable=True) from None


async def _follow(session: aiohttp.ClientSession, target: URL, config: HttpGetConfig) -> dict[str, Any]:
    for _ in range(config.max_redirects + 1):
        async with session.get(target, allow_redirects=False) as response:
            if response.status in _REDIRECTS and "Location" in response.headers:
                try:
                    target = response.url.join(URL(response.headers["Location"]))
                except ValueError as exc:
                    raise ToolError(f"bad redirect location: {exc}") from None
                check_url(target, config)
                continue
            declared = response.content_length
            if declared is not None and declared > config.max_bytes:
                raise ToolError(f"refused: the body is {declared} bytes, over the limit of {config.max_bytes}")
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > config.max_bytes:
                    raise ToolError(f"refused: the body is over the limit of {config.max_bytes} bytes")
            text = bytes(body).decode(safe_charset(response.charset), errors="replace")  # body <= max_bytes
            return {"url": str(response.url), "status": response.status,
                    "content_type": response.content_type, "text": text[: config.max_text_chars],
                    "truncated": len(text) > config.max_text_chars}
    raise ToolError(f"refused: more than {config.max_redirects} redirects")


def safe_charset(declared: str | None) -> str:
    """The codec a body declared ``declared`` is decoded with: Python's name for it if it is one of
    ``_CHARSETS`` (under any alias: ``latin1``, ``windows-1252``), else ``utf-8``."""
    try:
        name = codecs.lookup(declared or "utf-8").name
    except (LookupError, ValueError):  # unknown, or a name with a NUL byte
        return "utf-8"
    return name if name in _CHARSETS else "utf-8"


def http_get_tool(config: HttpGetConfig) -> Tool:
    """The ``http_get`` tool bound to ``config`` (built only when a worker is given an allowlist)."""
    hosts = ", ".join(sorted(config.allowed_hosts))

    @tool(name="http_get", description=f"Fetch a web page or API response with HTTP GET (allowed hosts: {hosts}); "
                                       "returns status, content type and text.",
          timeout_s=config.timeout_s + 1.0, max_attempts=config.max_attempts, retry_on_timeout=True,
          idempotent=True)  # GET is safe (RFC 9110 9.2.1): no effects to repeat
    async def http_get(url: str) -> dict[str, Any]:
        return await fetch(url, config)

    return http_get
