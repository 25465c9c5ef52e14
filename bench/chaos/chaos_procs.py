"""The chaos suite's own stack and processes: Kafka + PostgreSQL in a temporary state directory on free
ports, the model server and the workers, each tracked by PID so the suite only ever signals what it
started itself (never the shared dev stack on 17092/17432, never a process found by name).

The stack is a ``agentstream.devstack.private.PrivateStack`` (the launchers ``agentstream dev up`` uses, in a
state directory of its own, on free ports), which can kill and restart either server; ``Supervisor`` runs the model server and
the workers like an orchestrator would: a process that exits without the suite asking is recorded (with
its log's tail) and started again after a backoff, because a real deployment restarts crashed workers and
the question is whether runs still finish, not whether the first crash is fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiokafka.admin import AIOKafkaAdminClient

from agentstream.devstack import process
from agentstream.devstack.private import PrivateStack
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options

#: Environment a worker must not inherit from whoever runs the suite: it would point the worker at
#: another cluster, database, prefix or state directory than the suite's own.
FOREIGN_ENV = ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "AGENTSTREAM_TOPIC_PREFIX", "AGENTSTREAM_STATE_DIR",
               "AGENTSTREAM_KAFKA_PORT", "AGENTSTREAM_PG_PORT", "AGENTSTREAM_METRICS_PORT", "AGENTSTREAM_TRACING",
               "AGENTSTREAM_SCHEMA_REGISTRY_URL")
#: First and largest pause before restarting a process that exited on its own (doubling in between).
RESTART_BACKOFF_S = (1.0, 8.0)
#: A process that ran this long before exiting gets the short backoff again.
RESTART_RESET_AFTER_S = 30.0
#: Lines of a log shown for a process that exited, or for every process when a check fails.
TAIL_LINES = 30
#: Worker and model-server start-up on a loaded 2-core machine: imports, the embedding model, groups.
READY_TIMEOUT_S = 150.0


class SuiteError(Exception):
    """The suite could not carry out its plan (not a finding about agentstream)."""


_PR_SET_PDEATHSIG = 1
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before any fork
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    """Runs in the child before exec (Linux): SIGKILL it when the suite dies, however the suite dies
    (even SIGKILL), so no worker outlives a crashed or killed suite. Processes are only ever started
    from the event loop's thread, which lives as long as the suite."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# -- processes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path


@dataclass(frozen=True)
class ExitRecord:
    """A process that exited without the suite asking: what it returned, when, and its log's end."""

    name: str
    returncode: int
    at: float
    uptime_s: float
    tail: str


@dataclass
class _Slot:
    spec: ProcSpec
    proc: subprocess.Popen | None = None
    started: float = 0.0
    #: Down on purpose (a fault holding it down, or the suite stopping it): not restarted.
    held: bool = False
    paused: bool = False
    backoff: float = RESTART_BACKOFF_S[0]
    restart_at: float | None = None


@dataclass
class Supervisor:
    """The suite's processes, by name. Only processes started here are ever signalled."""

    slots: dict[str, _Slot] = field(default_factory=dict)
    exits: list[ExitRecord] = field(default_factory=list)
    restarts: Counter = field(default_factory=Counter)

    def add(self, spec: ProcSpec) -> None:
        self.slots[spec.name] = _Slot(spec)

    def start(self, name: str) -> None:
        slot = self.slots[name]
        if slot.proc is not None and slot.proc.poll() is None:
            return
        spec = slot.spec
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log, "ab") as log, open(os.devnull, "rb") as devnull:
            log.write(f"\n===== chaos: starting {name} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            slot.proc = subprocess.Popen(spec.argv, env=spec.env, stdin=devnull, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        slot.started, slot.held, slot.paused, slot.restart_at = time.time(), False, False, None

    def alive(self, name: str) -> bool:
        proc = self.slots[name].proc
        return proc is not None and proc.poll() is None

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to a process the suite started (and still runs)."""
        slot = self.slots[name]
        if slot.proc is None or slot.proc.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        slot.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            slot.paused = True
        elif sig == signal.SIGCONT:
            slot.paused = False

    async def kill(self, name: str) -> None:
        """SIGKILL and hold down (no restart until ``start``)."""
        slot = self.slots[name]
        slot.held = True
        if slot.proc is not None and slot.proc.poll() is None:
            slot.proc.kill()
            await self._wait_exit(slot, None)

    async def stop(self, name: str, grace_s: float) -> int | None:
        """SIGTERM (after SIGCONT if paused), SIGKILL after ``grace_s``; hold down. Returns the exit code."""
        slot = self.slots[name]
        slot.held = True
        proc = slot.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        if slot.paused:
            proc.send_signal(signal.SIGCONT)
            slot.paused = False
        proc.terminate()
        return await self._wait_exit(slot, grace_s)

    @staticmethod
    async def _wait_exit(slot: _Slot, grace_s: float | None) -> int | None:
        proc = slot.proc
        assert proc is not None
        deadline = None if grace_s is None else time.monotonic() + grace_s
        while proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                deadline = None
            await asyncio.sleep(0.05)
        return proc.returncode

    async def stop_all(self, grace_s: float) -> None:
        await asyncio.gather(*(self.stop(name, grace_s) for name in self.slots))

    async def watch(self, stop: asyncio.Event, poll_s: float = 0.25) -> None:
        """Restart what exits on its own, after a backoff; record every such exit."""
        while not stop.is_set():
            now = time.time()
            for name, slot in self.slots.items():
                self._check(name, slot, now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)

    def _check(self, name: str, slot: _Slot, now: float) -> None:
        if slot.held or slot.proc is None:
            return
        if slot.restart_at is not None:
            if now >= slot.restart_at:
                self.restarts[name] += 1
                self.start(name)
            return
        code = slot.proc.poll()
        if code is None:
            return
        uptime = now - slot.started
        self.exits.append(ExitRecord(name, code, now, round(uptime, 2), process.log_tail(slot.spec.log, TAIL_LINES)))
        if uptime > RESTART_RESET_AFTER_S:
            slot.backoff = RESTART_BACKOFF_S[0]
        slot.restart_at = now + slot.backoff
        slot.backoff = min(RESTART_BACKOFF_S[1], slot.backoff * 2)

    def tails(self, lines: int = TAIL_LINES) -> dict[str, str]:
        return {name: process.log_tail(slot.spec.log, lines) for name, slot in self.slots.items()}


def worker_argv(service: str, model_url: str, tools_module: str) -> list[str]:
    """``agentstream worker SERVICE`` with what the suite needs for that service."""
    argv = [sys.executable, "-m", "agentstream.cli", "worker", service, "--log-level", "INFO"]
    if service in ("inference", "all"):
        argv += ["--backend", "openai", "--base-url", model_url, "--model", "scripted"]
    if service in ("tools", "all"):
        argv += ["--tools", "agentstream.services.tools.builtin", "--tools", tools_module]
    return argv


def model_server_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "agentstream.services.inference.scripted_server", "--port", str(port)]


def child_env(stack: PrivateStack, extra: dict[str, str], principal: str | None = None) -> dict[str, str]:
    """The parent's environment without anything that points elsewhere, plus the stack's (on a secure stack
    as Kafka ``principal`` and its own database login, when it has one) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    env.update(stack.env(principal))
    env.update({"AGENTSTREAM_TOPIC_PREFIX": "", "AGENTSTREAM_TRACING": "off", "AGENTSTREAM_METRICS_PORT": "off",
                "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


# -- readiness ------------------------------------------------------------------------------------------
async def model_ready(port: int, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the model server answers ``/health`` (after a start or a restart)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise SuiteError("the model server did not answer /health")
            await asyncio.sleep(0.2)


def terminate_all(procs: list[subprocess.Popen], grace_s: float = 30.0) -> None:
    """SIGTERM every process first (they shut down in parallel), then wait for each; SIGKILL after
    ``grace_s``."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()


async def groups_ready(bootstrap: str, expected: dict[str, int], sup: Supervisor | None = None,
                       auth: KafkaAuth | None = None) -> None:
    """Until each consumer group is stable with the expected number of members."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth or KafkaAuth()))
    await admin.start()
    try:
        while True:
            members: dict[str, int] = {}
            for name in expected:  # one group per request: aiokafka misreads a reply describing several
                with contextlib.suppress(Exception):
                    (response,) = await admin.describe_consumer_groups([name])
                    _error, _group, state, _protocol_type, _protocol, group_members, *_ = response.groups[0]
                    members[name] = len(group_members) if state == "Stable" else 0
            if all(members.get(g, 0) >= n for g, n in expected.items()):
                return
            if time.monotonic() > deadline:
                exits = [(e.name, e.returncode) for e in sup.exits] if sup is not None else "-"
                raise SuiteError(f"consumer groups not ready: {members} (want {expected}); exits so far: {exits}")
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
