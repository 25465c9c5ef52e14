"""``http_get``'s address guard against the ways an internal IPv4 address hides: inside IPv6 (mapped,
NAT64, 6to4, ISATAP, Teredo, the deprecated encodings) and in numeric forms other than a dotted quad."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web
from yarl import URL

from agentstream.services.tools.http import (
    HttpGetConfig,
    _PublicOnlyResolver,
    _refused_address,
    check_url,
    fetch,
)
from agentstream.streams.core.errors import ToolError


@pytest.mark.parametrize(("address", "reason"), [
    ("::ffff:127.0.0.1", "carries 127.0.0.1, which is loopback"),           # IPv4-mapped
    ("64:ff9b::7f00:1", "carries 127.0.0.1, which is loopback"),            # NAT64, well-known prefix
    ("64:ff9b::a9fe:a9fe", "carries 169.254.169.254, which is link-local"),  # the metadata service
    ("64:ff9b::a00:1", "carries 10.0.0.1, which is private"),
    ("64:ff9b:1::a00:1", "local-use NAT64"),                                 # RFC 8215: refused outright
    ("2002:7f00:1::1", "carries 127.0.0.1, which is loopback"),             # 6to4: bits 16-48
    ("2002:a9fe:a9fe::1", "carries 169.254.169.254, which is link-local"),
    ("2002:c0a8:101:1::5", "carries 192.168.1.1, which is private"),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo"),                      # client 127.0.0.1, inverted
    ("2001::1", "Teredo"),
    ("::127.0.0.1", "IPv4-compatible"),                                      # deprecated: ::a.b.c.d
    ("::8.8.8.8", "IPv4-compatible"),
    ("::ffff:0:7f00:1", "IPv4-translated"),                                  # ::ffff:0:a.b.c.d
    ("::ffff:0:808:808", "IPv4-translated"),
    ("2600::5efe:a00:1", "carries 10.0.0.1, which is private"),             # ISATAP, global prefix
    ("2600::200:5efe:7f00:1", "carries 127.0.0.1, which is loopback"),      # ISATAP, u bit set
    ("fe80::5efe:808:808", "link-local"),                                    # ISATAP: the prefix counts too
    ("fe80::1%eth0", "link-local"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("100.64.0.1", "not a public address"),
])
def test_internal_addresses_are_refused_however_they_are_encoded(address, reason):
    problem = _refused_address(address)
    assert problem is not None and reason in problem, problem


@pytest.mark.parametrize("address", [
    "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
    "2600::5efe:808:808",
])
def test_public_addresses_pass_also_through_a_translator(address):
    assert _refused_address(address) is None


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "127.0.0.01",
                                  "0x7f.0.0.1"])
def test_numeric_ipv4_hosts_in_other_forms_are_refused_even_when_listed(host):
    assert socket.inet_ntoa(socket.inet_aton(host)) == "127.0.0.1"  # what the system resolver connects to
    config = HttpGetConfig(allowed_hosts=frozenset({host}), allow_private=True)
    with pytest.raises(ToolError, match="non-standard form"):
        check_url(URL(f"http://{host}/"), config)


def test_ordinary_names_and_dotted_quads_are_not_taken_for_numbers():
    config = HttpGetConfig(allowed_hosts=frozenset({"3com.com", "1e100.net", "cafe.be", "8.8.8.8"}))
    for host in ("3com.com", "1e100.net", "cafe.be", "8.8.8.8"):
        check_url(URL(f"http://{host}/"), config)


@pytest.mark.parametrize("host", ["[64:ff9b::7f00:1]", "[2002:7f00:1::1]", "[::127.0.0.1]", "[2001::1]"])
def test_ipv6_literals_carrying_loopback_are_refused_before_connecting(host):
    bare = host.strip("[]")
    config = HttpGetConfig(allowed_hosts=frozenset({bare}))
    with pytest.raises(ToolError, match="refused"):
        check_url(URL(f"http://{host}/"), config)


async def test_a_name_resolving_to_an_embedded_loopback_is_refused_when_connecting():
    resolver = _PublicOnlyResolver()

    class Answers:
        async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
            return [{"hostname": host, "host": "64:ff9b::7f00:1", "port": port, "family": socket.AF_INET6,
                     "proto": 0, "flags": 0}]

        async def close(self) -> None:
            pass

    await resolver.close()
    resolver._inner = Answers()  # type: ignore[assignment]  # a DNS64 answer, as a rebinding server would give
    with pytest.raises(ToolError, match=r"carries 127\.0\.0\.1"):
        await resolver.resolve("rebind.example", 80, socket.AF_INET6)


async def test_a_listed_numeric_host_is_not_fetched_even_with_private_addresses_allowed():
    """``0x7f.1`` on the allowlist with private addresses allowed: the resolver would connect to
    127.0.0.1, where this server answers; the request never leaves."""
    hits: list[str] = []

    async def hello(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="hello")

    app = web.Application()
    app.add_routes([web.get("/hello", hello)])
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        listed = HttpGetConfig(allowed_hosts=frozenset({"0x7f.1", "127.0.0.1"}), allow_private=True, timeout_s=2.0)
        assert (await fetch(f"http://127.0.0.1:{port}/hello", listed))["text"] == "hello"  # the premise
        with pytest.raises(ToolError, match="non-standard form"):
            await fetch(f"http://0x7f.1:{port}/hello", listed)
        assert hits == ["/hello"]
    finally:
        await runner.cleanup()
