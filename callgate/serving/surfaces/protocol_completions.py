"""The OpenAI legacy completions wire (`POST /v1/completions`, as vLLM serves it): the request
body (pydantic, as every wire model), its validated form `CompletionRequest`, and the
`text_completion` objects answered and streamed.

Knows: OpenAI's / vLLM's request fields (with vLLM's `top_k`, `min_p`, `repetition_penalty`,
`ignore_eos`) and which of them callgate refuses rather than
ignores: more than one prompt, `echo: true`, `n` or `best_of` other than 1, `logprobs` other
than null / 0, a `suffix` (400 `unsupported_parameter`); the limits that apply to every
request. Does not know: the vocabulary (`CompletionService` checks token ids against it),
tokenising, engines, HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field

from callgate.errors import InvalidRequestError
from callgate.serving.settings import Limits
from callgate.serving.surfaces.protocol_checks import check_stop
from callgate.serving.surfaces.protocol_request import parse_logit_bias
from callgate.serving.surfaces.protocol_wire import WIRE_CONFIG, LogitBiasWire, StreamOptionsWire, read_wire

TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionWire(BaseModel):
    model_config = WIRE_CONFIG

    model: str | None = None
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptionsWire | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1, lt=2**31)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    logit_bias: LogitBiasWire | None = Field(default=None, max_length=300)
    ignore_eos: bool = False  # vLLM's: generate max_tokens whatever the model says (benchmarks)
    echo: bool | None = None  # accepted only as false / null
    n: int = 1
    best_of: int | None = None  # accepted only as 1 / null
    logprobs: int | None = None  # accepted only as null / 0
    suffix: str | None = None  # accepted only as null
    user: str | None = None


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated completion request: exactly one of `prompt` (text, tokenised as written:
    special-token text is the special token, nothing is added) and `prompt_ids` (token ids,
    not yet checked against a vocabulary) is set."""

    model: str | None
    prompt: str | None
    prompt_ids: tuple[int, ...] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    ignore_eos: bool = False


def parse_completion_request(body: bytes, limits: Limits) -> CompletionRequest:
    """Raw body -> CompletionRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    wire = read_wire(CompletionWire, body, limits.max_body_bytes)
    _refuse_unsupported(wire)
    if wire.max_tokens is not None and wire.max_tokens > limits.max_tokens:
        raise InvalidRequestError(
            f"max_tokens: {wire.max_tokens} exceeds the limit {limits.max_tokens}", param="max_tokens"
        )
    text, ids = _one_prompt(wire.prompt)
    return CompletionRequest(
        model=wire.model,
        prompt=text,
        prompt_ids=ids,
        max_tokens=wire.max_tokens,
        temperature=1.0 if wire.temperature is None else wire.temperature,
        top_p=1.0 if wire.top_p is None else wire.top_p,
        seed=wire.seed,
        stop=check_stop(wire.stop, limits),
        stream=wire.stream,
        include_usage=bool(wire.stream_options and wire.stream_options.include_usage),
        presence_penalty=wire.presence_penalty or 0.0,
        frequency_penalty=wire.frequency_penalty or 0.0,
        repetition_penalty=1.0 if wire.repetition_penalty is None else wire.repetition_penalty,
        top_k=max(0, wire.top_k or 0),
        min_p=wire.min_p or 0.0,
        logit_bias=parse_logit_bias(wire.logit_bias),
        ignore_eos=wire.ignore_eos,
    )


def _refuse_unsupported(wire: CompletionWire) -> None:
    refused = [
        ("n", wire.n != 1, "only n=1 is supported"),
        ("best_of", wire.best_of not in (None, 1), "only best_of=1 is supported"),
        ("echo", bool(wire.echo), "the prompt is not echoed; only false is accepted"),
        ("logprobs", wire.logprobs not in (None, 0), "log probabilities are not returned by callgate"),
        ("suffix", wire.suffix is not None, "insertion (a suffix) is not supported"),
    ]
    for param, bad, why in refused:
        if bad:
            raise InvalidRequestError(f"{param}: {why}", param=param, code="unsupported_parameter")


def _one_prompt(prompt: str | list[str] | list[int] | list[list[int]]) -> tuple[str | None, tuple[int, ...] | None]:
    """(text, None) or (None, ids) of the request's single prompt; 400 for none, several or an empty one."""
    if isinstance(prompt, str):
        return _text(prompt), None
    if not prompt:
        raise InvalidRequestError("prompt: must not be empty", param="prompt")
    first = prompt[0]
    if isinstance(first, int):
        return None, tuple(i for i in prompt if isinstance(i, int))  # the wire made them all ints
    if len(prompt) != 1:
        raise InvalidRequestError(
            f"prompt: {len(prompt)} prompts in one request; send one prompt per request",
            param="prompt",
            code="unsupported_parameter",
        )
    if isinstance(first, str):
        return _text(first), None
    if not first:
        raise InvalidRequestError("prompt[0]: must not be empty", param="prompt[0]")
    return None, tuple(first)


def _text(prompt: str) -> str:
    if not prompt:
        raise InvalidRequestError("prompt: must not be empty", param="prompt")
    return prompt


# ---- response shapes ------------------------------------------------------------------------


def text_completion_dict(
    *,
    completion_id: str,
    created: int,
    model: str,
    text: str | None,
    finish_reason: str | None,
    usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `text_completion` object: the whole answer, or (streaming) one chunk of it; text None
    gives the usage-only chunk (empty choices)."""
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    out: dict[str, Any] = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = dict(usage)
    return out
