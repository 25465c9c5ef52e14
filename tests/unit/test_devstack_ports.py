"""How the local stack decides a port is taken (agentstream/devstack/process.port_in_use) and where its
default ports sit (issue 36: a free port that only a TIME_WAIT socket held was refused, and the old
defaults lay in Linux's ephemeral range, where outgoing connections take ports)."""

from __future__ import annotations

import socket
from pathlib import Path

from agentstream.devstack.process import port_in_use
from agentstream.streams.config.stack_state import DEFAULT_KAFKA_PORT, DEFAULT_POSTGRES_PORT


def _ephemeral_range() -> range:
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low, high = (int(x) for x in path.read_text().split()) if path.exists() else (32768, 60999)
    return range(low, high + 1)


def test_a_listening_port_is_in_use() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert port_in_use("127.0.0.1", listener.getsockname()[1])


def test_a_port_held_only_by_time_wait_is_free() -> None:
    """The server's side closes first, so its end of the connection (on the listening port) waits in
    TIME_WAIT after the listener is gone: Kafka and PostgreSQL bind there with SO_REUSEADDR, so must the check."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()          # the server closes first: its socket goes to TIME_WAIT
        client.recv(1)            # the FIN arrives
        client.close()
    with socket.socket() as plain:  # without SO_REUSEADDR the port would still look taken
        try:
            plain.bind(("127.0.0.1", port))
            time_wait_blocks_plain_bind = False
        except OSError:
            time_wait_blocks_plain_bind = True
    assert time_wait_blocks_plain_bind, "no TIME_WAIT socket was made: the test would prove nothing"
    assert not port_in_use("127.0.0.1", port)


def test_default_ports_sit_below_the_ephemeral_range() -> None:
    ephemeral = _ephemeral_range()
    for port in (DEFAULT_KAFKA_PORT, DEFAULT_KAFKA_PORT + 1, DEFAULT_KAFKA_PORT + 5, DEFAULT_POSTGRES_PORT):
        assert port not in ephemeral, port
