"""The OpenAI Responses wire (`POST /v1/responses`) as pydantic models.

Knows: the request body's shape and the shape of each input item, content part, function
tool, tool choice and text format that callgate reads. `input` items, `tools` and
`tool_choice` are kept as plain JSON here and read one by one (responses_input.py,
responses_request.py), so an error names the item (`input[2].call_id`) rather than a
union member pydantic happened to try. Unknown fields are ignored, as OpenAI-compatible
servers do. Does not know: limits, chat requests, the store, HTTP.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from callgate.serving.surfaces.protocol_wire import WIRE_CONFIG, CallgateExtensionWire, TemplateKwargsWire

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class _Wire(BaseModel):
    model_config = WIRE_CONFIG


class ReasoningWire(_Wire):
    effort: Effort | None = None
    summary: str | None = None


class TextFormatWire(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextWire(_Wire):
    format: TextFormatWire | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesWire(_Wire):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: TextWire | None = None
    reasoning: ReasoningWire | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    top_logprobs: int | None = None  # accepted only as null / 0: callgate returns no logprobs
    stream: bool = False
    chat_template_kwargs: TemplateKwargsWire | None = None  # callgate's (vLLM's) reasoning switch
    callgate: CallgateExtensionWire | None = None


# ---- input items (read one at a time) ----------------------------------------------------


class MessageItemWire(_Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    id: str | None = None


class FunctionCallItemWire(_Wire):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None


class FunctionCallOutputItemWire(_Wire):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]
    id: str | None = None


class SummaryTextWire(_Wire):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningTextWire(_Wire):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItemWire(_Wire):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryTextWire] = Field(default_factory=list)
    content: list[ReasoningTextWire] | None = None
    encrypted_content: str | None = None


class TextPartWire(_Wire):
    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalPartWire(_Wire):
    type: Literal["refusal"]
    refusal: str


# ---- tools ---------------------------------------------------------------------------------


class FunctionToolWire(_Wire):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedChoiceWire(_Wire):
    type: Literal["function"]
    name: str


class AllowedToolWire(_Wire):
    type: str
    name: str | None = None


class AllowedToolsChoiceWire(_Wire):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolWire]
