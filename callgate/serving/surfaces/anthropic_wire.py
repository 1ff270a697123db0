"""The Anthropic Messages wire as pydantic models: the `POST /v1/messages` and
`/v1/messages/count_tokens` request bodies.

Knows: Anthropic's request shapes (system as a string or text blocks; content as a string or
blocks: text, tool_use, tool_result, thinking, redacted_thinking; tools with input_schema;
tool_choice auto / any / tool / none with disable_parallel_tool_use; thinking enabled /
disabled / adaptive / between_tools; output_config effort and json_schema format;
metadata.user_id; temperature / top_p / top_k, which SDK 2.x no longer sends but older
clients do) and its ranges (temperature 0..1, max_tokens >= 1,
budget_tokens >= 1024), plus callgate's `callgate` extension. Unknown fields
(`cache_control`, `citations`, `service_tier`, ...) are ignored. Does not know: the internal
request (anthropic_request.py) or limits.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from callgate.serving.surfaces.protocol_wire import WIRE_CONFIG, CallgateExtensionWire


class _Wire(BaseModel):
    model_config = WIRE_CONFIG


class TextBlockWire(_Wire):
    type: Literal["text"]
    text: str


class ThinkingBlockWire(_Wire):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockWire(_Wire):
    type: Literal["redacted_thinking"]
    data: str


class ToolUseBlockWire(_Wire):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ImageBlockWire(_Wire):
    """Accepted at the wire so that the refusal is a clear 400, not a shape error."""

    type: Literal["image", "document", "search_result"]


class ToolResultBlockWire(_Wire):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlockWire | ImageBlockWire, Field(discriminator="type")]] | None = None
    is_error: bool = False


ContentBlockWire = Annotated[
    TextBlockWire
    | ThinkingBlockWire
    | RedactedThinkingBlockWire
    | ToolUseBlockWire
    | ToolResultBlockWire
    | ImageBlockWire,
    Field(discriminator="type"),
]


class MessageParamWire(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlockWire]


class ToolParamWire(_Wire):
    """A client tool (`type` absent or `custom`, with `input_schema`), or one of Anthropic's
    server tools (`web_search_20250305`, `bash_20250124`, ...), which callgate cannot run."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    strict: bool | None = None


class ToolChoiceWire(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingWire(_Wire):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1024)


class OutputFormatWire(_Wire):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigWire(_Wire):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormatWire | None = None


class MetadataWire(_Wire):
    user_id: str | None = None


class CountTokensWire(_Wire):
    """The /v1/messages/count_tokens body: a Messages request without the sampling fields."""

    model: str
    messages: list[MessageParamWire]
    system: str | list[TextBlockWire] | None = None
    tools: list[ToolParamWire] | None = None
    tool_choice: ToolChoiceWire | None = None
    thinking: ThinkingWire | None = None
    output_config: OutputConfigWire | None = None


class MessagesWire(CountTokensWire):
    """The /v1/messages body."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: MetadataWire | None = None
    stream: bool = False
    callgate: CallgateExtensionWire | None = None
