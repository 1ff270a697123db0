"""The chat service: one validated chat request -> one turn's typed events (turn_events.py),
which each wire surface renders (chat_completions.py renders OpenAI's chat completions).

Knows: the order of work — admission, prompt (prompt.py), constraint (grammars.py),
generation and parsing (generation.py), the validator handoff and bounded repair rounds
(handoff/candidates.py), the answer — and which failures become which errors.
Does not know: the web framework, pydantic, vllm, or any format's syntax.

Policy:
* A diagnostic other than the advisory ones (`unknown_tool`, whose candidate still goes to
  the validator and is rejected there; `call_outside_markup`, below) means the output held
  a call block that could not be read: 502 `model_output_error` with the diagnostic's code;
  streaming ends with an `error` event. Either body's `callgate` block has `raw`: the
  failed round's output as the parser read it (bounded, protocol_response.RAW_TEXT_MAX_CHARS),
  which the diagnostics' spans index.
  So does output that breaks what the grammar would have enforced (no call under
  tool_choice required/named, another tool than the named one, several calls with
  parallel_tool_calls=false): codes `missing_tool_call`, `wrong_tool`, `too_many_calls`.
* Every candidate gets a verdict before anything about it is sent. A round whose verdicts
  are all `accepted` is the answer; otherwise the calls and the validator's errors are fed
  back as tool results and the model tries again, at most `max_repairs` times; then 422.
  Streaming sends text as it is generated and a round's tool calls only once all of that
  round's verdicts are in (a rejected round's calls are never sent).
* Under tool_choice `auto`, an answer that is wholly a call to a declared tool written as
  JSON outside the format's markup gets the advisory diagnostic `call_outside_markup` and
  one recovery round under that tool's named grammar (recovery.py), a round of the repair
  budget; streaming has already sent the first round's text.
* Leaving early (client gone, task cancelled) closes the engine stream and aborts the
  request, shielded from cancellation, so its batch slot is always freed (generation.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from callgate.formats import get_format
from callgate.serving import recovery
from callgate.serving.admission import Admission
from callgate.serving.conform import conform_chat
from callgate.serving.engines.engine import Engine
from callgate.serving.engines.tokenizer import writes_reasoning
from callgate.serving.generation import generate_round
from callgate.serving.grammars import Grammars
from callgate.serving.handoff.audit import AuditLog
from callgate.serving.handoff.candidates import (
    ADVISORY_CODES,
    Validator,
    final_arguments,
)
from callgate.serving.metrics import Metrics
from callgate.serving.prompt import Prompt, build_prompt
from callgate.serving.quick.service import Conversation, QuickConfig, QuickService
from callgate.serving.round_review import RoundReview
from callgate.serving.settings import Settings
from callgate.serving.surfaces import chat_completions
from callgate.serving.surfaces.protocol import ChatRequest, tool_call_dict
from callgate.serving.surfaces.protocol_request import check_logit_bias
from callgate.serving.turn import ChatFailure, Round, Turn
from callgate.serving.turn_events import (
    AcceptedCall,
    CallsAccepted,
    ContentDelta,
    FinishReason,
    Prefilled,
    ReasoningDelta,
    RoundStart,
    TurnDone,
    TurnEvent,
)
from callgate.types import DiagnosticEvent, Event, TextDelta, arguments_json
from callgate.types import ReasoningDelta as ParsedReasoning

__all__ = ["Admission", "ChatFailure", "ChatService", "Turn"]


class ChatService:
    """Runs chat completions against one engine and one validator."""

    def __init__(self, settings: Settings, engine: Engine, validator: Validator, metrics: Metrics) -> None:
        self.settings = settings
        self.engine = engine
        self.validator = validator
        self.metrics = metrics
        self.admission = Admission(settings.max_num_seqs, settings.max_queue, metrics)
        self.audit = (
            None if settings.audit_log is None else AuditLog(settings.audit_log, max_bytes=settings.audit_log_max_bytes)
        )
        self.review = RoundReview(settings.format, settings.model_name, validator, metrics, self.audit)
        self.grammars = Grammars(settings, engine)
        opening = get_format(settings.format).reasoning_open
        # a format without a reasoning block has nothing to keep out (its grammar key unchanged)
        known = settings.reasoning if settings.reasoning is not None else writes_reasoning(engine.tokenizer, opening)
        self.reasons = known or opening is None
        self.quick = QuickService(engine, settings.format, QuickConfig(constrained=settings.constrained))

    # ---- entry points -----------------------------------------------------------------

    async def start(self, req: ChatRequest) -> Turn:
        """Fit the request to the format (400 when it cannot be), admit it (429 when full)
        and compile its constraint; the caller must `close()` the returned turn (the
        response functions do it themselves)."""
        req = conform_chat(self.settings.format, req, reasons=self.reasons)
        check_logit_bias(req, self.engine.tokenizer.vocab_size)
        self.admission.acquire()
        started_s = time.monotonic()
        try:
            constraint = await self.grammars.constraint(req)
            turn = Turn(
                req,
                constraint,
                started_s,
                fmt=self.settings.format,
                model=self.settings.model_name,
                max_repairs=self.settings.max_repairs,
                release=self.admission.release,
            )
            prompt = await self._prompt(turn)  # fail fast: 400 for an oversized prompt before streaming
            await self.grammars.check_budget(constraint, prompt.max_tokens)  # and a call that cannot fit
            if req.quick:  # heads placed after the user turn start beside the main generation
                conversation = Conversation(req.messages, req.plan.shown, req.thinking, req.reasoning_effort)
                turn.quick = self.quick.beside(conversation, req.quick, turn.completion_id)
            return turn
        except BaseException:
            self.admission.release()
            raise

    def events(self, turn: Turn) -> AsyncGenerator[TurnEvent, None]:
        """The turn's typed events, as turn_events.py orders them; raises ChatFailure /
        CallgateError. Output that is already unusable (a fatal diagnostic) stops its
        generation at once. Closing the generator early aborts the generation and frees the
        turn's slot; the turn is closed when the generator ends, however it ends."""
        return self._events(turn, cut_when_broken=True)

    async def complete(self, turn: Turn) -> dict[str, Any]:
        """The non-streaming chat completion. Raises ChatFailure / CallgateError."""
        # Generated to its end even when broken: the 502 body's `raw` is the whole output.
        return await chat_completions.completion(turn, self._events(turn, cut_when_broken=False))

    def stream(self, turn: Turn) -> AsyncGenerator[bytes, None]:
        """SSE bytes of a streamed chat completion, ending with `[DONE]`; errors become a
        terminal `error` event. Closing the generator early aborts the generation."""
        return chat_completions.stream(turn, self.events(turn))

    # ---- rounds -------------------------------------------------------------------------

    async def _events(self, turn: Turn, *, cut_when_broken: bool) -> AsyncGenerator[TurnEvent, None]:
        try:
            while True:
                rnd = Round(len(turn.rounds))
                turn.rounds.append(rnd)
                yield RoundStart(rnd.index)
                generation = generate_round(self.engine, self.settings.format, self.metrics, turn, rnd, self._prompt)
                async with contextlib.aclosing(generation) as batches:
                    prefilled = False
                    async for batch in batches:
                        if not prefilled:  # the round's first batch comes with its first token
                            prefilled = True
                            yield Prefilled(rnd.index, turn.usage)
                        for ev in _text_events(batch, rnd.index):
                            yield ev
                        if cut_when_broken and any(
                            isinstance(ev, DiagnosticEvent) and ev.diagnostic.code not in ADVISORY_CODES for ev in batch
                        ):
                            break  # the output is already unusable: stop generating
                self.review.check_output(turn, rnd)
                await self.review.validate(turn, rnd)
                if rnd.accepted:
                    if await self._recover(turn, rnd):
                        continue  # the same prompt again, held to the named tool's grammar
                    await self._finish_quick(turn, rnd)
                    calls = self._accepted_calls(rnd)
                    if calls:
                        yield CallsAccepted(rnd.index, calls)
                    yield self._done(turn, rnd, calls)
                    return
                self.review.next_round_or_reject(turn, rnd)
        finally:
            turn.close()

    async def _prompt(self, turn: Turn) -> Prompt:
        """The prompt of the turn's current messages (built once per round)."""
        if turn.prompt is None or turn.prompt.messages != len(turn.messages):
            turn.prompt = await anyio.to_thread.run_sync(  # tokenising is CPU work: off the event loop
                build_prompt,
                self.settings.format,
                turn.req,
                turn.messages,
                self.engine.tokenizer,
                self.engine.max_model_len,
                self.settings.limits.default_max_tokens,
            )
        return turn.prompt

    async def warm_grammars(self) -> None:
        """Compile the format's schema-free grammar ahead of the first request (grammars.py);
        run in the background at start, a failure logged, never raised."""
        await self.grammars.warm(self.reasons)

    async def _recover(self, turn: Turn, rnd: Round) -> bool:
        """Whether the next round is a recovery round asking again for the call that `rnd`'s
        answer wrote outside the markup (recovery.py). When the answer is such a call, it
        gets its diagnostic and its audit record either way."""
        assert rnd.result is not None
        output = "".join(rnd.output)
        found = recovery.find_outside_call(self.settings.format, turn.req, output, rnd.result, rnd.finish_reason)
        if found is None:
            return False
        rnd.result = recovery.with_diagnostic(rnd.result, found)
        self.metrics.diagnostic(found.diagnostic.code)
        rec = await recovery.plan(self.settings, turn.req, found, rnd.index, turn.max_repairs, self.grammars.constraint)
        turn.recoveries.append(rec)
        self.metrics.recovery(rec.outcome)
        record = recovery.audit_record(
            rec, found, output, rnd.result, request_id=turn.completion_id, settings=self.settings
        )
        await self.review.write_audit([record])
        return rec.round is not None

    async def _finish_quick(self, turn: Turn, rnd: Round) -> None:
        """Await the heads (answer-position ones run now, on the conversation plus the answer)."""
        if turn.quick is None:
            return
        assert rnd.result is not None
        answer: dict[str, Any] = {"role": "assistant", "content": rnd.result.content or ""}
        calls = self._accepted_calls(rnd)
        if calls:
            answer["tool_calls"] = [tool_call_dict(c.call_id, c.name, c.arguments) for c in calls]
        result = await turn.quick.finish(answer)
        turn.quick_block = {
            "quick": result.results(),
            "quick_usage": result.usage(),
            "quick_prefix_cache": result.prefix_cache(),
        }

    # ---- the answer ---------------------------------------------------------------------

    def _accepted_calls(self, rnd: Round) -> tuple[AcceptedCall, ...]:
        assert rnd.result is not None
        return tuple(
            AcceptedCall(c.call_id, c.name, arguments_json(final_arguments(c, v)))
            for c, v in zip(rnd.result.candidates, rnd.verdicts, strict=True)
        )

    def _done(self, turn: Turn, rnd: Round, calls: tuple[AcceptedCall, ...]) -> TurnDone:
        assert rnd.result is not None
        stopped = rnd.finish_reason == "stop" and not calls
        return TurnDone(
            finish_reason=_finish(rnd.finish_reason, bool(calls)),
            content=rnd.result.content or "",
            reasoning=rnd.result.reasoning or None,
            calls=calls,
            usage=turn.usage,
            callgate=turn.callgate_block(),
            stop_sequence=rnd.stop_string if stopped else None,
        )


def _text_events(batch: list[Event], round_index: int) -> list[TurnEvent]:
    out: list[TurnEvent] = []
    for ev in batch:
        if isinstance(ev, TextDelta) and ev.text:
            out.append(ContentDelta(ev.text, round_index))
        elif isinstance(ev, ParsedReasoning) and ev.text:
            out.append(ReasoningDelta(ev.text, round_index))
    return out


def _finish(reason: str, calls: bool) -> FinishReason:
    """OpenAI's finish_reason: "length" whenever the output was cut (calls or not)."""
    if reason == "length":
        return "length"
    return "tool_calls" if calls else "stop"
