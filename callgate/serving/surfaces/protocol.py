"""The OpenAI wire, as one import: request validation and the exact JSON shapes of
responses, chunks and model lists. The pieces live in one module per noun:

* protocol_wire.py — the pydantic request models and the OpenAPI request-body document;
* protocol_checks.py — the request limits and OpenAI's rules beyond shape;
* protocol_request.py — a raw body -> a frozen `ChatRequest` / `QuickRequest`, or a 400/413;
* protocol_response.py — completion, chunk, usage, tool-call and model-list shapes.

Does not know: templates, engines, parsers or validators.
"""

from __future__ import annotations

from callgate.serving.surfaces.protocol_checks import ToolChoice
from callgate.serving.surfaces.protocol_request import (
    ChatRequest,
    QuickRequest,
    ThinkingSwitch,
    parse_chat_request,
    parse_quick_request,
)
from callgate.serving.surfaces.protocol_response import (
    candidate_dict,
    chunk_dict,
    completion_dict,
    diagnostic_dict,
    models_dict,
    raw_output_dict,
    tool_call_dict,
    tool_names,
    usage_dict,
)
from callgate.serving.surfaces.protocol_wire import (
    CallgateExtensionWire,
    ChatCompletionWire,
    FunctionCallWire,
    FunctionWire,
    MessageWire,
    NamedFunctionWire,
    NamedToolChoiceWire,
    QuickWire,
    ResponseFormatWire,
    StreamOptionsWire,
    TemplateKwargsWire,
    TextPartWire,
    ToolCallWire,
    ToolWire,
    openapi_body,
)

__all__ = [
    "CallgateExtensionWire",
    "ChatCompletionWire",
    "ChatRequest",
    "FunctionCallWire",
    "FunctionWire",
    "MessageWire",
    "NamedFunctionWire",
    "NamedToolChoiceWire",
    "QuickRequest",
    "QuickWire",
    "ResponseFormatWire",
    "StreamOptionsWire",
    "TemplateKwargsWire",
    "TextPartWire",
    "ThinkingSwitch",
    "ToolCallWire",
    "ToolChoice",
    "ToolWire",
    "candidate_dict",
    "chunk_dict",
    "completion_dict",
    "diagnostic_dict",
    "models_dict",
    "openapi_body",
    "parse_chat_request",
    "parse_quick_request",
    "raw_output_dict",
    "tool_call_dict",
    "tool_names",
    "usage_dict",
]
