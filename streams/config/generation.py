"""Generation settings: what a run's model steps may generate when its task does not say, and the bounds a
task's own settings must keep (streams/core/task_rules.py, ``generation_problem``).

Read once from the environment (``GenerationSettings.load``, part of ``Settings``) and passed down: the
planner resolves a run's settings when the run starts and keeps them in its state, so every model request
of the run (and a republished one, after a crash or a restart with other settings) carries the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentstream.streams.config import env
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.task_rules import MAX_TOKENS_CEILING


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """Defaults and bounds for a run's model steps.

    - ``max_tokens`` (``AGENTSTREAM_MODEL_MAX_TOKENS``, 256): the tokens one model step may generate when
      the task gives no ``max_tokens``;
    - ``max_tokens_limit`` (``AGENTSTREAM_MAX_TOKENS_LIMIT``, 4096): the most a task may ask for (at most
      ``task_rules.MAX_TOKENS_CEILING``); a task over it is refused;
    - ``max_answer_chars`` (``AGENTSTREAM_MAX_ANSWER_CHARS``, 2000): a text answer's length in the action
      schema that engines enforce (a structured answer is bounded by its schema and the step's tokens);
    - ``output_retries`` (``AGENTSTREAM_OUTPUT_RETRIES``, 2): how many times an answer that does not match
      the task's output schema goes back to the model, with the reason, before the run fails with
      ``invalid_output``.
    """

    max_tokens: int = 256
    max_tokens_limit: int = 4096
    max_answer_chars: int = 2000
    output_retries: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens_limit <= MAX_TOKENS_CEILING:
            raise ConfigError(f"AGENTSTREAM_MAX_TOKENS_LIMIT={self.max_tokens_limit} must be from 1 to "
                              f"{MAX_TOKENS_CEILING}")
        if not 1 <= self.max_tokens <= self.max_tokens_limit:
            raise ConfigError(f"AGENTSTREAM_MODEL_MAX_TOKENS={self.max_tokens} must be from 1 to "
                              f"AGENTSTREAM_MAX_TOKENS_LIMIT ({self.max_tokens_limit})")
        if self.max_answer_chars < 1 or self.output_retries < 0:
            raise ConfigError("AGENTSTREAM_MAX_ANSWER_CHARS must be positive and AGENTSTREAM_OUTPUT_RETRIES "
                              "0 or more")

    @classmethod
    def load(cls) -> GenerationSettings:
        """From the environment; raises ``ConfigError`` naming a variable that is malformed or out of bounds."""
        return cls(max_tokens=env.positive_int("AGENTSTREAM_MODEL_MAX_TOKENS", 256),
                   max_tokens_limit=env.positive_int("AGENTSTREAM_MAX_TOKENS_LIMIT", 4096),
                   max_answer_chars=env.positive_int("AGENTSTREAM_MAX_ANSWER_CHARS", 2000),
                   output_retries=env.non_negative_int("AGENTSTREAM_OUTPUT_RETRIES", 2))


__all__ = ["GenerationSettings"]
