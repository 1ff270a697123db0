"""One constrained request in a batch: its spec, read from `SamplingParams.extra_args`, and
its per-row decoding state.

Knows: the `extra_args["callgate"]` mapping (a ConstraintRef's fields, plus the request id
closing marks name), which SamplingParams leave vLLM's sampler taking the argmax
(`argmax_sampled`), and what a row keeps between steps. Does not know: matchers' insides,
masks, vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EXTRA_ARGS_KEY = "callgate"


@dataclass(frozen=True, slots=True)
class RowSpec:
    """The per-request arguments, read from `extra_args["callgate"]`."""

    key: str
    grammar: str
    plain: str = ""  # the grammar with markers as plain text: budget closing's byte twin reads it
    trigger: str | None = None
    budget_closing: bool = True
    needs_call: bool = False  # required / named: an accepting state holds a whole call
    request_id: str = ""  # for closing_marks


def row_spec(extra_args: Mapping[str, Any] | None) -> RowSpec | None:
    """The spec of a request, None when unconstrained. Raises ValueError when malformed."""
    raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"] must be a mapping, got {type(raw).__name__}')
    key, grammar, trigger = raw.get("key"), raw.get("grammar"), raw.get("trigger")
    if not isinstance(key, str) or not key or not isinstance(grammar, str) or not grammar:
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"] needs non-empty string "key" and "grammar"')
    if trigger is not None and not isinstance(trigger, str):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"]["trigger"] must be a string or null')
    plain = raw.get("plain")
    mode = raw.get("mode")
    closing = raw.get("budget_closing") is not False
    request_id = raw.get("request_id")
    return RowSpec(
        key,
        grammar,
        str(plain or grammar),
        trigger or None,
        closing,
        mode in ("required", "named"),
        request_id if isinstance(request_id, str) else "",
    )


@dataclass(frozen=True, slots=True)
class KeptPlan:
    """A closing plan and the state it was made from."""

    data: bytes  # the bytes that end the grammar
    tokens: list[int]  # the same in the vocabulary's tokens
    text_at: int  # output bytes read at that state
    output_at: int  # output tokens consumed at that state


@dataclass(slots=True)
class Row:
    spec: RowSpec
    matcher: Any
    output: list[int]  # vLLM's live list of the request's output ids
    max_tokens: int | None
    consumed: int = 0
    failed: bool = False
    twin: Any = None  # the byte-vocabulary matcher budget closing plans on
    twin_bytes: int = 0  # output tokens fed to the twin
    text: bytearray = field(default_factory=bytearray)  # output bytes (special tokens as their text)
    called: bool = False  # a call trigger was written
    call_cost: int | None = None  # tokens of the first call from its trigger on (planned)
    plan: list[int] | None = None  # tokens to follow to the end of the grammar, the next one first
    plan_at: int = 0  # output tokens written when `plan` was last brought up to date
    growth: int = 0  # the most one free token has added to the plan
    checked_at: int = 0  # output tokens when budget closing last made or checked a plan
    check_at: int = 0  # output tokens from which it looks again (a free row far from its budget)
    # before check_at, also looked at once its output bytes from `watch_from` hold the byte
    # `watch` (-1: none): the last byte of the value closer its plan starts with (budget.py)
    watch: int = -1
    watch_from: int = 0
    kept: KeptPlan | None = None  # the plan in use (budget.py)
    kept_reused: bool = False  # this step's plan is the kept one, made at an earlier state
    forced: list[int] = field(default_factory=list)  # the grammar's forced tokens from here, the next one first
    # vLLM takes the argmax of the logits the processor returns (a greedy request that nothing
    # after the processor changes): a step where the grammar admits that argmax needs no mask
    argmax_sampled: bool = False

    def remaining(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens - len(self.output)


def argmax_sampled(params: Any) -> bool:
    """Whether vLLM samples the argmax of the logits the processor returns for a request
    with these SamplingParams: greedy (temperature below vLLM's 1e-5) and none of what its
    sampler applies after a non-argmax-invariant processor (penalties, a thinking budget),
    and no logprobs (a `processed_*` logprobs mode would show the row as returned)."""

    def value(name: str, default: Any) -> Any:
        found = getattr(params, name, default)
        return default if found is None else found

    return (
        isinstance(value("temperature", 1.0), (int, float))
        and value("temperature", 1.0) < 1e-5
        and value("repetition_penalty", 1.0) == 1.0
        and value("presence_penalty", 0.0) == 0.0
        and value("frequency_penalty", 0.0) == 0.0
        and getattr(params, "thinking_token_budget", None) is None
        and getattr(params, "logprobs", None) is None
    )
