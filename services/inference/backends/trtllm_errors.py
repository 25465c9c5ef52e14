"""Which TensorRT-LLM failures end one request, and which end the engine.

The LLM API has no typed overload error: requests beyond ``max_batch_size`` wait in the engine's own
queue, so nothing it raises means "try again shortly" and no engine error is retriable here. A word
match on "capacity" or "busy" (what this file once did) also matched permanent errors, which the
runtime then waited out as an outage for ever. What is told apart instead:

* **fatal** — the engine is gone and nothing in this process brings it back: after an internal error the
  executor shuts down and every ``generate_async`` raises ``RuntimeError("LLM is shutting down")``
  (``llmapi/llm.py``); a CUDA error (illegal memory access, launch failure) is sticky for the CUDA
  context, so every later step fails too. The service then stops and the worker exits non-zero for its
  supervisor (a pod restart reloads the engine), instead of failing or dead-lettering every request;
* everything else — a ``RequestError`` for one request (invalid grammar, a prompt the engine refuses),
  a ``ValueError`` from the argument checks — fails that request only (non-retriable).
"""

from __future__ import annotations

import re

from agentstream.streams.core.errors import BackendError

#: Messages that mean the engine itself is gone (exact phrases, not words that permanent errors share).
FATAL_MESSAGES = re.compile(r"LLM is shutting down|CUDA error: ")


def engine_error(exc: BaseException, *, closing: bool = False) -> BackendError:
    """A ``BackendError`` for an exception from the engine. ``closing``: our own ``close()`` shut the engine
    down, so "shutting down" is expected and the request is left to be redelivered (retriable)."""
    message = f"TensorRT-LLM {type(exc).__name__}: {exc}"
    if FATAL_MESSAGES.search(str(exc)):
        if closing:
            return BackendError(message, retriable=True)
        return BackendError(f"the engine is dead: {message}", fatal=True)
    return BackendError(message)
