"""The typed events of one internal turn: what every wire surface renders.

Knows: what a client of any surface (OpenAI chat completions, OpenAI Responses, Anthropic
Messages) may see of a turn while it runs and when it ends. Does not know: any wire shape.

A turn (ChatService.events) yields, in order:

    RoundStart(0)
    Prefilled(0)                              the engine has read round 0's prompt
    (ContentDelta | ReasoningDelta)*          text of round 0, as generated
    [RoundStart(1) Prefilled(1) (ContentDelta | ReasoningDelta)* ...]   a repair or recovery round
    CallsAccepted                             only when the final round holds calls, all accepted
    TurnDone                                  always last

A rejected round's calls are never yielded; its text was already yielded, as was the text
of an answer that was a call written outside the markup before its recovery round asked
for the call again (serving/recovery.py). A surface that cannot take back text, like a
stream, shows it; a non-streaming surface shows only the final round's text, which
TurnDone carries. Failures are raised, not yielded: ChatFailure (an
error plus its `callgate` block) or CallgateError. Closing the generator early aborts the
generation in the engine and frees the turn's slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True, slots=True)
class RoundStart:
    round: int


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str
    round: int


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str
    round: int


@dataclass(frozen=True, slots=True)
class AcceptedCall:
    """A call the validator accepted: `arguments` is the JSON text of its normalised arguments."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class CallsAccepted:
    round: int
    calls: tuple[AcceptedCall, ...]


@dataclass(frozen=True, slots=True)
class TurnUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Prefilled:
    """The engine has read the round's prompt and written its first token: `usage` is the
    turn's so far, its prompt tokens and prefix-cache hits now known (Anthropic's
    message_start reports them)."""

    round: int
    usage: TurnUsage


@dataclass(frozen=True, slots=True)
class TurnDone:
    """The end of a turn. `finish_reason` is OpenAI chat's ("length" whenever the output was
    cut, calls or not); `stop_sequence` is the stop string that ended the text, if one did;
    `content` / `reasoning` / `calls` are the final round's; `callgate` is the extension
    block (format, constrained, repairs, candidates with verdicts, diagnostics, quick)."""

    finish_reason: FinishReason
    content: str
    reasoning: str | None
    calls: tuple[AcceptedCall, ...]
    usage: TurnUsage
    callgate: Mapping[str, Any] = field(default_factory=dict)
    stop_sequence: str | None = None


TurnEvent = RoundStart | Prefilled | ContentDelta | ReasoningDelta | CallsAccepted | TurnDone
