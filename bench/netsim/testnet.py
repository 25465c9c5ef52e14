"""Test hosts on this machine: one network namespace per host, joined by a link emulator that delays,
jitters and drops packets.

Each host is a namespace ``<prefix>-<name>`` with one interface, a TUN device with the address
``10.77.0.N/24`` (N from 2); the root namespace gets ``10.77.0.1`` the same way, so the process that
builds the network can reach every host to set things up. A process started with ``exec_argv(name)``
in front of its command lives on that host: it sees only that address (and its own loopback), so all
it says to another part crosses the emulator.

Why not veth and ``tc netem``: this machine's kernel has no ``sch_netem`` (``CONFIG_NET_SCH_NETEM`` is
off; ``tc qdisc add … netem`` answers "Specified qdisc kind is unknown"). So the emulator does in user
space what netem does in the kernel: ``python -m bench.netsim.testnet serve`` holds every TUN device's file
descriptor (the devices themselves are moved into their namespaces), reads each IP packet a host
sends, and writes it to the destination host's device after that host's delay, with optional normal
jitter and random loss. A round trip between hosts a and b therefore takes ``delay(a) + delay(b)``:
"inference 80 ms from everything" is inference's own delay at 80 ms, the others at 0. The root
namespace's packets are not delayed. It costs some CPU per packet (tens of microseconds in Python) and
timers fire within about a millisecond, so "0 ms" is the emulator's own overhead, the same in every
placement.

    net = TestNetwork(["kafka", "client"]).up()      # needs root: namespaces, TUN devices
    subprocess.run([*net.exec_argv("client"), "curl", f"http://{net.hosts['kafka']}:9092"])
    net.shape("kafka", delay_ms=40, jitter_ms=5, loss_pct=0.5)
    net.down()
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The repository root: the emulator runs there as ``python -m bench.netsim.testnet serve``.
ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000


class NetworkError(Exception):
    pass


def available() -> str | None:
    """None when test hosts can be made here; else why not."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing"
    probe = subprocess.run(["ip", "netns", "add", "agentstream-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "agentstream-probe"], capture_output=True)
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _delete_namespaces(prefix: str) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        ns = line.split(" ")[0]
        if ns.startswith(f"{prefix}-"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@dataclass
class TestNetwork:
    """The orchestrator's handle: starts the emulator, knows each host's address, sets delays."""

    __test__ = False  # a name pytest would otherwise try to collect where a test imports it

    names: list[str]
    prefix: str = "as"
    #: The first three octets of the /24 (two networks at once need two prefixes and two subnets).
    subnet: str = SUBNET
    hosts: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _dir: Path | None = None
    _generation: int = 0

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def exec_argv(self, name: str) -> list[str]:
        """Put this in front of a command to run it on host ``name``."""
        return ["ip", "netns", "exec", self.ns(name)]

    def up(self) -> TestNetwork:
        gateway = f"{self.prefix}-gw"[:15]
        if subprocess.run(["ip", "link", "show", gateway], capture_output=True).returncode == 0:
            raise NetworkError(f"a test network with the prefix {self.prefix!r} is up (its emulator holds "
                               f"{gateway}); wait for it to end or choose another prefix")
        _delete_namespaces(self.prefix)  # what a crashed earlier run left behind (its emulator is gone)
        self._dir = Path(tempfile.mkdtemp(prefix="agentstream-testnet-"))
        self._write_shapes({})
        self._proc = subprocess.Popen([sys.executable, "-m", "bench.netsim.testnet", "serve", "--prefix", self.prefix,
                                       "--hosts", ",".join(self.names), "--subnet", self.subnet,
                                       "--control", str(self._dir)],
                                      stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # "ready {json}" once every device is up
        if not line.startswith("ready "):
            self.down()
            raise NetworkError(f"the link emulator did not start: {line!r}")
        self.hosts = json.loads(line[len("ready "):])
        return self

    def shape(self, name: str, delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> None:
        """Every packet host ``name`` sends waits ``delay_ms`` (± ``jitter_ms``); ``loss_pct`` are dropped."""
        assert self._dir is not None and self._proc is not None
        shapes = json.loads((self._dir / "shapes.json").read_text())["shapes"]
        shapes[name] = {"delay_ms": delay_ms, "jitter_ms": jitter_ms, "loss_pct": loss_pct}
        self._write_shapes(shapes)
        self._proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while self._applied() < self._generation:
            if time.monotonic() > deadline:
                raise NetworkError("the link emulator did not take the new delays")
            time.sleep(0.01)

    def _applied(self) -> int:
        assert self._dir is not None
        try:
            return int((self._dir / "applied").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def _write_shapes(self, shapes: dict) -> None:
        assert self._dir is not None
        self._generation += 1
        tmp = self._dir / "shapes.tmp"
        tmp.write_text(json.dumps({"generation": self._generation, "shapes": shapes}))
        os.replace(tmp, self._dir / "shapes.json")

    def down(self) -> None:
        """Stop the emulator (it removes the namespaces); idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        _delete_namespaces(self.prefix)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


# -- the emulator process ----------------------------------------------------------------------------

def _tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


@dataclass
class _Link:
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0


class Emulator:
    """Forwards packets between the hosts' TUN devices, each after its sender's delay."""

    def __init__(self, prefix: str, names: list[str], control: Path, subnet: str = SUBNET) -> None:
        self.prefix, self.control = prefix, control
        self.by_address: dict[bytes, int] = {}
        self.sender: dict[int, str] = {}
        self.links: dict[str, _Link] = {}
        self.addresses: dict[str, str] = {}
        gateway = self._device("gw", f"{subnet}.1", namespace=None)
        self.sender[gateway] = "gw"
        for i, name in enumerate(names, start=2):
            _ip("netns", "add", f"{prefix}-{name}")
            fd = self._device(name, f"{subnet}.{i}", namespace=f"{prefix}-{name}")
            self.sender[fd] = name
            self.addresses[name] = f"{subnet}.{i}"

    def _device(self, name: str, address: str, namespace: str | None) -> int:
        dev = f"{self.prefix}-{name}"[:15]
        fd = _tun(dev)
        where: list[str] = []
        if namespace is not None:
            _ip("link", "set", dev, "netns", namespace)
            where = ["-n", namespace]
            _ip(*where, "link", "set", "lo", "up")
        _ip(*where, "addr", "add", f"{address}/24", "dev", dev)
        _ip(*where, "link", "set", dev, "up")
        self.by_address[bytes(int(x) for x in address.split("."))] = fd
        return fd

    def reload(self) -> None:
        spec = json.loads((self.control / "shapes.json").read_text())
        self.links = {name: _Link(s["delay_ms"] / 1000, s["jitter_ms"] / 1000, s["loss_pct"] / 100)
                      for name, s in spec["shapes"].items()}
        (self.control / "applied").write_text(str(spec["generation"]))

    def _readable(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        link = self.links.get(self.sender[fd])
        while True:
            try:
                packet = os.read(fd, 65535)
            except BlockingIOError:
                return
            if len(packet) < 20 or packet[0] >> 4 != 4:
                continue  # IPv4 only (the test network has no IPv6 addresses)
            target = self.by_address.get(packet[16:20])
            if target is None:
                continue
            if link is None or (link.delay_s <= 0 and link.jitter_s <= 0 and link.loss <= 0):
                _write(target, packet)
                continue
            if link.loss > 0 and random.random() < link.loss:
                continue
            delay = link.delay_s + (random.gauss(0.0, link.jitter_s) if link.jitter_s > 0 else 0.0)
            loop.call_later(max(0.0, delay), _write, target, packet)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self.reload)
        self.reload()
        for fd in self.sender:
            loop.add_reader(fd, self._readable, fd, loop)
        print("ready " + json.dumps(self.addresses), flush=True)
        await stop.wait()


def _write(fd: int, packet: bytes) -> None:
    try:
        os.write(fd, packet)
    except OSError:
        pass  # the device's queue is full or it is gone: the packet is lost, as on a congested link


def _serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="testnet.py serve")
    parser.add_argument("--prefix", default="as")
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--subnet", default=SUBNET)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        emulator = Emulator(args.prefix, args.hosts.split(","), args.control, args.subnet)
        asyncio.run(emulator.run())
    except Exception as exc:
        print(f"failed {exc}", flush=True)
        raise
    finally:
        _delete_namespaces(args.prefix)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        _serve(sys.argv[2:])
    else:
        sys.exit("usage: testnet.py serve --hosts a,b --control DIR (run by TestNetwork)")
