"""The OpenAI Chat Completions API's shapes, as much of them as an agent can honour.

Requests are read leniently (unknown fields are ignored, as OpenAI-compatible servers do, since SDKs send
new optional fields before servers know them); what cannot be honoured is refused with a clear 422 rather
than silently dropped: ``n`` above 1, client-side ``tools`` (an agent's tools run on the server), content
that is not text. Responses carry exactly the fields the OpenAI SDKs read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentstream.services.gateway.problems import Problem


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; 422 for a part that is not text (an image, audio)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise Problem(422, f"a {self.role} message has a {part.type!r} part; only text is supported",
                              slug="unsupported-content")
            parts.append(part.text)
        return "".join(parts)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "output"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """``model`` names the agent (GET /v1/models); the last message is the user's and is the task. An
    agentstream extension: ``session`` (or the header ``Agentstream-Session``) makes it a turn of that
    conversation, whose transcript then stands for the earlier messages."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    session: str | None = Field(None, description="agentstream: make this a turn of that conversation.")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    """A chat completion; ``id`` is ``chatcmpl-<run id>`` (the run's details: GET /v1/runs/{run id})."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` line of a streamed completion; the stream ends with ``data: [DONE]``."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "agentstream"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


__all__ = ["ChatCompletion", "ChatCompletionChunk", "ChatCompletionRequest", "ChatMessage", "Choice",
           "ChunkChoice", "ContentPart", "Delta", "Model", "ModelList", "ResponseFormat", "Usage"]
