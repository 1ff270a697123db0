"""The validated requests: a raw body turned into a frozen `ChatRequest` / `QuickRequest`
(messages and tools as OpenAI-style dicts, ready for templates.render), or an
`InvalidRequestError` (400) / `PayloadTooLargeError` (413) naming the offending field.

Knows: the wire models (protocol_wire.py), the checks (protocol_checks.py), the defaults
OpenAI documents, and which OpenAI parameters callgate refuses rather than ignores (logprobs:
400 `unsupported_parameter`). Does not know: the served format (serving/conform.py fits a
request to it) or vocabulary (`check_logit_bias` is told its size), templates, engines,
parsers or validators.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from callgate.call_plan import CallPlan
from callgate.errors import InvalidRequestError
from callgate.serving.settings import Limits
from callgate.serving.surfaces.protocol_checks import (
    ToolChoice,
    check_messages,
    check_response_format,
    check_stop,
    check_tool_choice,
    check_tools,
)
from callgate.serving.surfaces.protocol_wire import (
    CallgateExtensionWire,
    ChatCompletionWire,
    LogitBiasWire,
    QuickWire,
    TemplateKwargsWire,
    read_wire,
)


@dataclass(frozen=True, slots=True)
class ThinkingSwitch:
    """The client's reasoning switch as sent: `chat_template_kwargs.<key>` = `on`. What it
    means depends on the served format (serving/conform.py)."""

    key: str  # "enable_thinking" or its alias "thinking"
    on: bool


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat request, the one internal request every surface builds. Messages and
    tools are OpenAI-style dicts (content as a string, tool_calls[].function.arguments as a
    JSON string), ready for templates.render; `plan` is the call plan built from the checked
    tools and choice (`call_plan`), which templates' callers, the grammar, the parser, the
    recovery and the validator handoff read."""

    model: str | None
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    response_format: Mapping[str, Any] | None
    user: str | None
    max_repairs: int | None
    quick: tuple[str, ...]
    reasoning_effort: str | None
    thinking: bool  # the prompt opens a reasoning block (set from the switch by conform.py)
    # tools, tool_choice, parallel_tool_calls and response_format normalised (CallPlan.of): what
    # everything past the surface reads; the wire fields above stay for the client's echo
    plan: CallPlan
    thinking_switch: ThinkingSwitch | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    logit_bias: Mapping[int, float] | None = None  # token id -> bias; ids not yet checked against a vocabulary
    # Who asks, for the idempotency key (callgate.serving.handoff.idempotency): each surface's own field
    # (here `user`), or the trusted x-callgate-actor header set by the route; None: anonymous.
    actor: str | None = None
    recover_calls: bool | None = None  # `callgate.recover_calls`; None: the server's setting (serving/recovery.py)

    def function_of(self, name: str) -> Mapping[str, Any] | None:
        """The declared `function` object of tool `name`; None when no such tool is declared."""
        for tool in self.tools or ():
            fn: Mapping[str, Any] = tool["function"]
            if fn["name"] == name:
                return fn
        return None

    def schema_of(self, name: str) -> Mapping[str, Any] | None:
        """The declared `parameters` of tool `name`; None when no such tool is declared."""
        fn = self.function_of(name)
        if fn is None:
            return None
        params: Mapping[str, Any] = fn.get("parameters") or {"type": "object", "properties": {}}
        return params

    def is_strict(self, name: str) -> bool:
        """Whether tool `name` was declared with OpenAI's `strict: true`."""
        fn = self.function_of(name)
        return bool(fn and fn.get("strict"))


def parse_chat_request(body: bytes, limits: Limits) -> ChatRequest:
    """Raw body -> ChatRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    wire = read_wire(ChatCompletionWire, body, limits.max_body_bytes)
    return _to_request(wire, limits)


def _to_request(wire: ChatCompletionWire, limits: Limits) -> ChatRequest:
    if wire.n != 1:
        raise InvalidRequestError("n: only n=1 is supported", param="n")
    _refuse_logprobs(wire)
    tools = check_tools(wire.tools, limits)
    tool_choice = check_tool_choice(wire.tool_choice, tools)
    messages = check_messages(wire.messages, limits)
    max_tokens = wire.max_completion_tokens or wire.max_tokens
    if max_tokens is not None and max_tokens > limits.max_tokens:
        field = "max_completion_tokens" if wire.max_completion_tokens else "max_tokens"
        raise InvalidRequestError(f"{field}: {max_tokens} exceeds the limit {limits.max_tokens}", param=field)
    ext = wire.callgate or CallgateExtensionWire()
    if len(ext.quick) > limits.max_quick_tasks:
        raise InvalidRequestError(f"callgate.quick: at most {limits.max_quick_tasks} tasks", param="callgate.quick")
    kwargs = wire.chat_template_kwargs or TemplateKwargsWire()
    response_format = check_response_format(wire.response_format, limits)
    return ChatRequest(
        model=wire.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=wire.parallel_tool_calls,
        max_tokens=max_tokens,
        temperature=1.0 if wire.temperature is None else wire.temperature,
        top_p=1.0 if wire.top_p is None else wire.top_p,
        seed=wire.seed,
        stop=check_stop(wire.stop, limits),
        stream=wire.stream,
        include_usage=bool(wire.stream_options and wire.stream_options.include_usage),
        response_format=response_format,
        user=wire.user,
        max_repairs=ext.max_repairs,
        quick=tuple(ext.quick),
        reasoning_effort=wire.reasoning_effort,
        thinking=bool(kwargs.enable_thinking or kwargs.thinking),
        plan=call_plan(tools, tool_choice, wire.parallel_tool_calls, response_format),
        thinking_switch=thinking_switch(kwargs),
        presence_penalty=wire.presence_penalty or 0.0,
        frequency_penalty=wire.frequency_penalty or 0.0,
        repetition_penalty=1.0 if wire.repetition_penalty is None else wire.repetition_penalty,
        top_k=max(0, wire.top_k or 0),  # vLLM's -1 and 0 both mean off
        min_p=wire.min_p or 0.0,
        logit_bias=parse_logit_bias(wire.logit_bias),
        actor=wire.user or None,
        recover_calls=ext.recover_calls,
    )


def call_plan(
    tools: tuple[Mapping[str, Any], ...] | None,
    tool_choice: ToolChoice,
    parallel_tool_calls: bool,
    response_format: Mapping[str, Any] | None,
) -> CallPlan:
    """The call plan of a surface's checked tools, tool_choice (check_tool_choice's),
    parallel_tool_calls and response_format (check_response_format's): every surface builds
    its ChatRequest's plan here, once. Its `thinking` is set by serving/conform.py, which
    knows the served format. Raises nothing for checked values (the checks refused what
    CallPlan.of would)."""
    return CallPlan.of(tools, tool_choice, parallel_tool_calls, response_format)


def _refuse_logprobs(wire: ChatCompletionWire) -> None:
    """`logprobs: true` or any `top_logprobs` is a 400: silently dropping them would answer a
    question the client did not ask. false / null are what clients send by default."""
    param = "logprobs" if wire.logprobs else "top_logprobs" if wire.top_logprobs is not None else None
    if param is not None:
        raise InvalidRequestError(
            f"{param}: log probabilities are not returned by callgate", param=param, code="unsupported_parameter"
        )


_TOKEN_ID = re.compile(r"0|[1-9][0-9]*")  # canonical: "7" and "007" would name one token twice


def parse_logit_bias(bias: LogitBiasWire | None) -> Mapping[int, float] | None:
    """OpenAI's string keys as token ids; None when there is no bias."""
    if not bias:
        return None
    for key in bias:
        if not _TOKEN_ID.fullmatch(key):
            raise InvalidRequestError(
                f"logit_bias: key {key[:32]!r} is not a token id (a decimal integer)",
                param="logit_bias",
                code="invalid_value",
            )
    return {int(key): value for key, value in bias.items()}


def check_logit_bias(req: ChatRequest, vocab_size: int) -> None:
    """400 (param `logit_bias`) when `req` biases a token id outside the served vocabulary
    [0, vocab_size); the caller knows the tokenizer."""
    check_token_ids(req.logit_bias or (), vocab_size, "logit_bias")


def check_token_ids(ids: Iterable[int], vocab_size: int, param: str) -> None:
    """400 (naming `param`) when an id lies outside the served vocabulary [0, vocab_size)."""
    unknown = sorted({i for i in ids if not 0 <= i < vocab_size})
    if unknown:
        shown = ", ".join(map(str, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
        raise InvalidRequestError(
            f"{param}: token id(s) {shown} outside the model's vocabulary of {vocab_size} tokens",
            param=param,
            code="invalid_value",
        )


def thinking_switch(kwargs: TemplateKwargsWire | None) -> ThinkingSwitch | None:
    """`chat_template_kwargs`' thinking switch (`enable_thinking` or `thinking`; 400 when both
    are given and disagree); None when neither is."""
    if kwargs is None:
        return None
    if kwargs.enable_thinking is not None and kwargs.thinking is not None and kwargs.enable_thinking != kwargs.thinking:
        raise InvalidRequestError(
            "chat_template_kwargs: enable_thinking and thinking disagree", param="chat_template_kwargs"
        )
    if kwargs.enable_thinking is not None:
        return ThinkingSwitch("enable_thinking", kwargs.enable_thinking)
    if kwargs.thinking is not None:
        return ThinkingSwitch("thinking", kwargs.thinking)
    return None


@dataclass(frozen=True, slots=True)
class QuickRequest:
    """A validated /v1/quick request; task names are checked by the quick service."""

    model: str | None
    messages: tuple[Mapping[str, Any], ...]
    tasks: tuple[str, ...]
    tools: tuple[Mapping[str, Any], ...] | None
    labels: Mapping[str, tuple[str, ...]]
    reasoning_effort: str | None
    thinking: bool
    thinking_switch: ThinkingSwitch | None = None


_LABEL_TASKS = ("authority", "domain")


def parse_quick_request(body: bytes, limits: Limits) -> QuickRequest:
    """Raw body -> QuickRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    wire = read_wire(QuickWire, body, limits.max_body_bytes)
    if len(wire.tasks) > limits.max_quick_tasks:
        raise InvalidRequestError(f"tasks: at most {limits.max_quick_tasks} tasks", param="tasks")
    labels: dict[str, tuple[str, ...]] = {}
    for task, words in (wire.labels or {}).items():
        if task not in _LABEL_TASKS or not words or not all(w.strip() for w in words):
            raise InvalidRequestError(
                f"labels.{task}: label sets are non-empty lists of words for {' / '.join(_LABEL_TASKS)}",
                param=f"labels.{task}",
            )
        labels[task] = tuple(dict.fromkeys(words))
    kwargs = wire.chat_template_kwargs or TemplateKwargsWire()
    return QuickRequest(
        model=wire.model,
        messages=check_messages(wire.messages, limits),
        tasks=tuple(wire.tasks),
        tools=check_tools(wire.tools, limits),
        labels=labels,
        reasoning_effort=wire.reasoning_effort,
        thinking=bool(kwargs.enable_thinking or kwargs.thinking),
        thinking_switch=thinking_switch(kwargs),
    )
