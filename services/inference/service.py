"""The inference service: InferenceRequested in, TokenChunks while generating, InferenceCompleted out.

It consumes with concurrency equal to the backend's slots, so the engine always has a full batch and
never more than it can run. Tokens go to ``agent.tokens`` (key: run_id) as they are made: the first
delta at once (time to first token), later ones coalesced every ``token_flush_s`` so a fast engine does
not turn every token into a Kafka record. A request whose deadline has passed is answered with an error
at once; a generation that outlives it is cancelled, and so is one whose run ends meanwhile (cancelled
by its user, failed elsewhere): ``run_ended`` is called from an ``OutcomeWatcher`` on ``agent.outcomes``.

Instrumentation (when the worker has metrics / tracing): each finished step observes its duration (the
model's "thinking time"), time to first token, decode tokens/s and prompt / cached / completion tokens,
and the same figures go on the step's span.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime

from agentstream.services.inference.backends.base import Backend, ChatMessage, Delta, Final, GenerationRequest
from agentstream.streams.client.outcomes import RunResult
from agentstream.streams.core.errors import BackendError
from agentstream.streams.core.events import Event, InferenceCompleted, InferenceRequested, TokenChunk
from agentstream.streams.core.signals import Abandoned
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner

SERVICE = "inference"


class InferenceService:
    def __init__(self, runtime: Runtime, backend: Backend, *, token_flush_s: float = 0.02) -> None:
        self.runtime = runtime
        self.backend = backend
        self.token_flush_s = token_flush_s
        self._generating: dict[str, set[asyncio.Task]] = {}
        #: The runner of ``service()``: stopped when the backend reports its engine dead.
        self._runner: ServiceRunner | None = None
        metrics = getattr(runtime, "metrics", None)  # None: no metrics (or a stand-in runtime in tests)
        self._metrics = metrics
        if metrics is not None:
            self._step_seconds = metrics.step_seconds.labels("model")
            metrics.generations.set_function(lambda: sum(len(t) for t in self._generating.values()))

    def run_ended(self, result: RunResult) -> None:
        """Abort the run's generations: nobody will use their output."""
        for task in self._generating.get(result.run_id, ()):
            task.cancel()

    def service(self, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        slots = self.backend.slots
        config = ServiceConfig(name=SERVICE, topics=[topics.inference_requests],
                               group_id=topics.group(SERVICE), concurrency=slots,
                               max_in_flight=max(4 * slots, 16), **overrides)
        self._runner = ServiceRunner(self.runtime, config, self.handle)
        return self._runner

    async def handle(self, event: Event, ctx: Context) -> None:
        if not isinstance(event, InferenceRequested):
            raise TypeError(f"the inference service does not handle {type(event).__name__}")
        started = time.perf_counter()
        if event.deadline is not None and event.deadline <= datetime.now(UTC):
            await self._complete(ctx, event, _nothing("error"), started, error="deadline_exceeded")
            return
        request = GenerationRequest(
            request_id=event.step_id,
            messages=tuple(ChatMessage(role=m.role, content=m.content, name=m.name, tool_calls=tuple(m.tool_calls),
                                       tool_call_id=m.tool_call_id) for m in event.messages),
            max_tokens=event.max_tokens, temperature=event.temperature,
            response_schema=json.loads(event.response_schema) if event.response_schema else None,
            cache_key=event.session or event.run_id, model=event.model, stop=tuple(event.stop), top_p=event.top_p, seed=event.seed,
            tools=json.loads(event.tools) if event.tools else None,
        )
        timeout = (event.deadline - datetime.now(UTC)).total_seconds() if event.deadline else None
        generation = asyncio.create_task(self._generate(request, event, ctx))
        running = self._generating.setdefault(event.run_id, set())
        running.add(generation)
        try:
            final = await asyncio.wait_for(generation, timeout)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this handler itself is being cancelled (shutdown, revocation)
            await self._complete(ctx, event, _nothing("cancelled"), started, error="run_ended")
            return
        except TimeoutError:
            await self._complete(ctx, event, _nothing("error"), started, error="deadline_exceeded")
            return
        except BackendError as exc:
            if exc.fatal:
                # The engine is gone for this process: stop and exit for the supervisor (a restart
                # reloads it); the request stays uncommitted for whoever owns its partition next.
                if self._runner is not None:
                    self._runner.fail(exc)
                raise Abandoned(f"the model engine died: {exc}") from exc
            if exc.retriable:
                raise  # the model server is having an outage: the runtime waits it out
            await self._complete(ctx, event, _nothing("error"), started, error=str(exc))
            return
        finally:
            running.discard(generation)
            if not running:
                self._generating.pop(event.run_id, None)
        await self._complete(ctx, event, final, started)

    async def _generate(self, request: GenerationRequest, event: InferenceRequested, ctx: Context) -> Final:
        seq = 0
        buffer: list[str] = []
        last_flush = 0.0
        final: Final | None = None

        async def flush() -> None:
            nonlocal seq, last_flush
            if buffer:
                await ctx.emit(self.runtime.topics.tokens, TokenChunk.build(
                    run_id=event.run_id, step=event.step_id, service=SERVICE, part=str(seq), seq=seq,
                    text="".join(buffer)))
                buffer.clear()
                seq += 1
                last_flush = time.perf_counter()

        # aclosing: if this task is cancelled (deadline, shutdown), the engine aborts at once rather
        # than when the generator is garbage-collected.
        async with contextlib.aclosing(self.backend.generate(request)) as stream:
            async for item in stream:
                if isinstance(item, Delta):
                    buffer.append(item.text)
                    if seq == 0 or time.perf_counter() - last_flush >= self.token_flush_s:
                        await flush()
                else:
                    final = item
        await flush()
        if final is None:
            raise BackendError(f"{self.backend.name} ended without a final record")
        return final

    async def _complete(self, ctx: Context, event: InferenceRequested, final: Final, started: float,
                        error: str | None = None) -> None:
        duration_s = time.perf_counter() - started
        await ctx.emit(self.runtime.topics.inference_results, InferenceCompleted.build(
            run_id=event.run_id, step=event.step_id, service=SERVICE, attempt=event.attempt,
            parent_step_id=event.parent_step_id, text=final.text,
            finish_reason=final.finish_reason, prompt_tokens=final.prompt_tokens,
            # The event's field is an int (schema default 0): "unknown" shows in the metrics and span.
            completion_tokens=final.completion_tokens, cached_prompt_tokens=final.cached_prompt_tokens or 0,
            ttft_ms=final.ttft_ms, duration_ms=duration_s * 1000,
            model=final.model, backend=self.backend.name, error=error, tool_calls=list(final.tool_calls)))
        if self._metrics is not None:
            self._observe(final, duration_s, error)
        span = getattr(ctx, "span", None)
        if span is not None:
            span.set_attributes({
                "gen_ai.request.model": final.model or (event.model or ""), "agentstream.backend": self.backend.name,
                "gen_ai.usage.input_tokens": final.prompt_tokens, "gen_ai.usage.output_tokens": final.completion_tokens,
                "agentstream.ttft_ms": final.ttft_ms,
                "agentstream.step_ms": duration_s * 1000, "agentstream.finish_reason": final.finish_reason})
            if final.cached_prompt_tokens is not None:  # absent, not 0, when the engine does not say
                span.set_attribute("agentstream.cached_prompt_tokens", final.cached_prompt_tokens)
            if error is not None:
                span.set_attribute("agentstream.error", error)

    def _observe(self, final: Final, duration_s: float, error: str | None) -> None:
        m = self._metrics
        assert m is not None
        self._step_seconds.observe(duration_s)
        if error is not None:
            m.inference_errors.labels(error if error in ("deadline_exceeded", "run_ended") else "backend_error").inc()
            return
        ttft_s = final.ttft_ms / 1000
        if ttft_s > 0:
            m.ttft.observe(ttft_s)
        if final.completion_tokens > 1 and duration_s > ttft_s:
            m.tokens_per_s.observe((final.completion_tokens - 1) / (duration_s - ttft_s))
        m.prompt_tokens.inc(final.prompt_tokens)
        if final.cached_prompt_tokens is not None:
            m.cached_prompt_tokens.inc(final.cached_prompt_tokens)
        m.completion_tokens.inc(final.completion_tokens)


def _nothing(finish_reason: str) -> Final:
    """The final record of a generation that produced nothing usable."""
    return Final(text="", finish_reason=finish_reason, prompt_tokens=0, completion_tokens=0)
