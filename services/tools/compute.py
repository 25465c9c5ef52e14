"""A guard for built-in tools that compute: run a pure function where a timeout can stop it.

A computation in Python cannot be interrupted from the event loop: ``asyncio.wait_for`` only cancels at
an ``await``, and one big-integer operation is a single C call that holds the GIL, so a thread does
not help either (other threads, the event loop's included, wait for it). Only a process can be
stopped in the middle. ``ComputeGuard`` keeps a few child processes (``workers``), each a Python
interpreter running ``serve``: one JSON request a line on its stdin, one JSON reply a line on its
stdout. A call takes an idle child, writes the request, and waits for the reply on the event loop
(``add_reader``), so the worker keeps serving other calls meanwhile; past ``timeout_s`` the child is
killed (SIGKILL) and replaced, and the call fails with ``ComputeTimeout``. A call cancelled while its
child computes kills the child too: its state is unknown.

The children only run what their module lists in ``GUARDED`` (services/tools/arithmetic.py), with
JSON arguments; each has an address-space limit (``memory_bytes``), so a memory bomb fails there with
a ``MemoryError`` instead of exhausting the machine. A child that dies (its stdout closes) fails the
call with ``ComputeError`` and is replaced. Children are started on first use and when one is
replaced, and are killed by ``close`` (registered at exit by whoever creates a long-lived guard); a
child whose parent dies reads the end of its stdin and exits.

The cost, measured on a busy two-core machine: a calculator call through a warm child takes 0.08-0.15
ms (a pipe round trip each way), against 5-15 us inline; a child starts in ~0.3 s. So the calculator
evaluates inline what is cheap whatever its numbers, and sends only the rest here.

This module imports nothing of the worker's, so that a child (``python -c`` importing it) starts fast.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: What a child runs: ``serve(module, memory_bytes)``. Where this process found agentstream is appended
#: to the child's path, so that it finds the same package where its own path does not (not prepended:
#: that could put site-packages before the standard library).
_CHILD = ("import sys; sys.path.append(sys.argv[1]); from agentstream.services.tools.compute import serve; "
          "serve(sys.argv[2], int(sys.argv[3]))")
_MAX_REPLY = 1 << 20


class ComputeError(Exception):
    """The guarded call failed: the function's own error (its message), or its child process died."""


class ComputeTimeout(ComputeError):
    """The guarded call ran past its time and its child process was killed."""


class _Child:
    """One child process and what has been read from it but not consumed yet."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.stdin = process.stdin.fileno()
        self.stdout = process.stdout.fileno()
        os.set_blocking(self.stdout, False)
        self.buffer = bytearray()
        self.ready = False  # it has said so (its imports are done)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()  # SIGKILL cannot be ignored: this returns at once
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class ComputeGuard:
    """Runs ``module.GUARDED[function](*args)`` in a child process that ``timeout_s`` stops.

    ``module`` should import nothing heavy (a child imports it when it starts) and must not print (its
    stdout is the replies' channel). Used from one event loop at a time: on another loop (a test's next
    one) the children are replaced.
    """

    def __init__(self, module: str, *, workers: int = 2, timeout_s: float = 1.0,
                 memory_bytes: int = 256 * 1024 * 1024, start_timeout_s: float = 30.0) -> None:
        if workers < 1 or timeout_s <= 0 or memory_bytes < 32 * 1024 * 1024:
            raise ValueError("ComputeGuard: workers and timeout_s must be positive, memory_bytes at least 32 MiB")
        self.module = module
        self.workers = workers
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.start_timeout_s = start_timeout_s
        self._children: set[_Child] = set()
        self._idle: list[_Child] = []
        self._waiting: collections.deque[asyncio.Future[_Child | None]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Children killed because a call ran out of time or was cancelled mid-computation (for tests).
        self.killed = 0

    async def call(self, function: str, *args: Any) -> Any:
        """``GUARDED[function](*args)``'s value, or ``ComputeError`` (its message is the function's
        error, or says the child died), or ``ComputeTimeout`` after ``timeout_s`` of computation."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self.close()
            self._loop = loop
        request = json.dumps([function, list(args)]).encode() + b"\n"
        child = await self._take()
        sent = False
        try:
            if not child.ready:  # (its start-up is not the computation's time)
                try:
                    async with asyncio.timeout(self.start_timeout_s):
                        await self._line(child)
                except TimeoutError:
                    raise ComputeError(f"the guarded computation's process did not start within "
                                       f"{self.start_timeout_s:g} s") from None
                child.ready = True
            try:
                os.write(child.stdin, request)  # small, and the child is waiting for it: does not block
            except OSError as exc:
                raise ComputeError(f"the guarded computation's process is gone ({exc})") from None
            sent = True
            try:
                async with asyncio.timeout(self.timeout_s):
                    reply = json.loads(await self._line(child))
            except TimeoutError:
                raise ComputeTimeout(f"stopped after {self.timeout_s:g} s of computation") from None
            except json.JSONDecodeError:
                raise ComputeError("the guarded computation's reply is not JSON") from None
        except asyncio.CancelledError:
            if sent:  # it computes something nobody waits for: stop it
                self._discard(child)
            else:  # cancelled while the child was starting: it is still good
                self._give_back(child)
            raise
        except BaseException:
            self._discard(child)
            raise
        self._give_back(child)
        if "error" in reply:
            raise ComputeError(reply["error"])
        return reply["value"]

    def close(self) -> None:
        """Kill every child (the guard starts new ones when it is called again)."""
        for child in list(self._children):
            child.kill()
        self._children.clear()
        self._idle.clear()
        for waiter in self._waiting:
            with contextlib.suppress(RuntimeError):  # (a future of a loop that is closed now)
                waiter.cancel()
        self._waiting.clear()

    async def _take(self) -> _Child:
        """An idle child, a new one while there are fewer than ``workers``, else the next one given back
        (a waiter woken with None may start one: a child was discarded)."""
        while True:
            while self._idle:
                child = self._idle.pop()
                if child.process.poll() is None:
                    return child
                self._discard(child)  # died while idle (killed from outside): not this call's business
            if len(self._children) < self.workers:
                return self._start()
            waiter: asyncio.Future[_Child | None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # handed something just as the caller gave up
                    handed = waiter.result()
                    if handed is not None:
                        self._give_back(handed)
                    else:
                        self._wake()
                raise
            if handed is not None:
                return handed

    def _give_back(self, child: _Child) -> None:
        for waiter in self._pending():
            waiter.set_result(child)
            return
        self._idle.append(child)

    def _discard(self, child: _Child) -> None:
        self.killed += child.process.poll() is None
        child.kill()
        self._children.discard(child)
        self._wake()

    def _wake(self) -> None:
        """A child's place is free: the first caller waiting may start one."""
        for waiter in self._pending():
            waiter.set_result(None)
            return

    def _pending(self) -> Iterator[asyncio.Future[_Child | None]]:
        """The callers waiting for a child, first come first; each taken out as it is yielded."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                yield waiter

    def _start(self) -> _Child:
        if not sys.executable:
            raise ComputeError("no Python interpreter to run the guarded computation with")
        root = str(Path(__file__).parents[3])  # where the package agentstream is, for this process
        try:
            process = subprocess.Popen([sys.executable, "-c", _CHILD, root, self.module, str(self.memory_bytes)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        except OSError as exc:  # out of processes or file descriptors
            raise ComputeError(f"cannot start the guarded computation's process: {exc}") from None
        child = _Child(process)
        self._children.add(child)
        return child

    async def _line(self, child: _Child) -> bytes:
        """The child's next line, read as the event loop says it can be."""
        loop = asyncio.get_running_loop()
        while True:
            end = child.buffer.find(b"\n")
            if end >= 0:
                line = bytes(child.buffer[:end])
                del child.buffer[: end + 1]
                return line
            if len(child.buffer) > _MAX_REPLY:
                raise ComputeError("the guarded computation's reply is too long")
            try:
                chunk = os.read(child.stdout, 65536)
            except BlockingIOError:
                readable: asyncio.Future[None] = loop.create_future()
                loop.add_reader(child.stdout, _set_once, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(child.stdout)
                continue
            if not chunk:
                raise ComputeError(f"the guarded computation's process ended (exit code {child.process.wait()})")
            child.buffer += chunk


def _set_once(future: asyncio.Future[None]) -> None:
    """A reader callback: the loop may call it again before the waiting task removes the reader."""
    if not future.done():
        future.set_result(None)


def serve(module: str, memory_bytes: int) -> None:
    """A child's loop: ``[function, args]`` a line in, ``{"value": …}`` or ``{"error": …}`` a line out."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):  # not on this system: the timeout still holds
        pass
    functions = importlib.import_module(module).GUARDED
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        try:
            function, args = json.loads(line)
            reply = json.dumps({"value": functions[function](*args)})
        except MemoryError:
            reply = json.dumps({"error": "the computation needs more memory than it may have"})
        except ValueError as exc:  # the function's refusals (and JSON it cannot encode)
            reply = json.dumps({"error": str(exc)})
        except Exception as exc:
            reply = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        out.write(reply.encode() + b"\n")
        out.flush()
