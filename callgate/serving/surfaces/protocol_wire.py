"""The OpenAI wire as pydantic models (pydantic is used only in the protocol modules; the
legacy completions body is in protocol_completions.py): the chat-completions and /v1/quick
request bodies, how a pydantic error becomes an `InvalidRequestError` naming
the field, and the OpenAPI request-body document built from the models.

Knows: OpenAI's request shapes and callgate's extensions (`callgate`: max_repairs, quick, recover_calls;
`reasoning_effort`; `chat_template_kwargs`; vLLM's sampling extensions `repetition_penalty`,
`top_k`, `min_p`) and the ranges OpenAI / vLLM give sampling parameters. Does not know:
limits, the validated request (protocol_request.py), templates, engines, parsers or
validators.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from callgate.errors import InvalidRequestError, PayloadTooLargeError

# Every surface's request models: strict ("5" is not an int); unknown fields ignored, as
# OpenAI-compatible servers do; NaN and infinities refused as what they are (not JSON
# numbers), where a range check would have said "less than or equal to 2".
WIRE_CONFIG = ConfigDict(strict=True, extra="ignore", frozen=True, allow_inf_nan=False)


class _Wire(BaseModel):
    model_config = WIRE_CONFIG


class FunctionCallWire(_Wire):
    name: str
    arguments: str


class ToolCallWire(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallWire


class TextPartWire(_Wire):
    type: Literal["text"]
    text: str


class MessageWire(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPartWire] | None = None
    name: str | None = None
    tool_calls: list[ToolCallWire] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionWire(_Wire):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolWire(_Wire):
    type: Literal["function"]
    function: FunctionWire


class NamedFunctionWire(_Wire):
    name: str


class NamedToolChoiceWire(_Wire):
    type: Literal["function"]
    function: NamedFunctionWire


class StreamOptionsWire(_Wire):
    include_usage: bool = False


class ResponseFormatWire(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class TemplateKwargsWire(_Wire):
    enable_thinking: bool | None = None
    thinking: bool | None = None


class CallgateExtensionWire(_Wire):
    max_repairs: int | None = Field(default=None, ge=0, le=8)
    quick: list[str] = Field(default_factory=list)
    recover_calls: bool | None = None  # None: the server's --no-recover-calls decides


LogitBiasWire = dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]  # token id (a string) -> bias


class ChatCompletionWire(_Wire):
    model: str | None = None
    messages: list[MessageWire] = Field(min_length=1)
    tools: list[ToolWire] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoiceWire | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1, lt=2**31)  # -1 / 0: off; vLLM keeps it in an int32
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    logit_bias: LogitBiasWire | None = Field(default=None, max_length=300)
    logprobs: bool | None = None  # accepted only as false / null: callgate returns no logprobs
    top_logprobs: int | None = None  # accepted only as null
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptionsWire | None = None
    response_format: ResponseFormatWire | None = None
    user: str | None = None
    n: int = 1
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    chat_template_kwargs: TemplateKwargsWire | None = None
    callgate: CallgateExtensionWire | None = None


class QuickWire(_Wire):
    model: str | None = None
    messages: list[MessageWire] = Field(min_length=1)
    tasks: list[str] = Field(min_length=1)
    tools: list[ToolWire] | None = None
    labels: dict[str, list[str]] | None = None  # label sets of authority / domain for this request
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    chat_template_kwargs: TemplateKwargsWire | None = None


W = TypeVar("W", bound=BaseModel)


def read_wire(model: type[W], body: bytes, max_body_bytes: int) -> W:
    """A raw request body as `model`, every surface's first step: 413 over `max_body_bytes`,
    400 (`wire_error`) when it does not validate."""
    if len(body) > max_body_bytes:
        raise PayloadTooLargeError(f"request body is {len(body)} bytes; the limit is {max_body_bytes}")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise wire_error(exc) from None


def wire_error(exc: ValidationError) -> InvalidRequestError:
    """The first error of a pydantic validation as a 400 naming the field (`invalid_json` for
    a body that is not JSON, `invalid_type` for one that is not an object)."""
    err = exc.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return InvalidRequestError(f"body is not valid JSON: {err['msg']}", code="invalid_json")
    param = _dotted(p for p in err["loc"] if not _is_union_tag(p)) or None
    if err["type"] == "model_type" and not err["loc"]:
        return InvalidRequestError("body must be a JSON object", code="invalid_type")
    return InvalidRequestError(f"{param}: {err['msg']}", param=param, code="invalid_value")


def _dotted(parts: Iterable[int | str]) -> str:
    """A pydantic location as an OpenAI-style `param`, as callgate's other errors name
    places: `.name` for a field, `[i]` for an index (`messages[0].tool_calls[1].id`)."""
    out = ""
    for part in parts:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else str(part))
    return out


def _is_union_tag(part: int | str) -> bool:
    """pydantic puts the union member it tried into `loc` (`str`, `literal[...]`, a model name)."""
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "list", "dict"} or "[" in part or part.endswith("Wire")
    )


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """An operation's `requestBody` for FastAPI's `openapi_extra`: the wire model's JSON
    Schema with its definitions inlined (the routes read raw bodies, so FastAPI cannot
    infer one; the document serves clients and API fuzzers)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node
