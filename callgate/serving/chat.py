"""The chat service: one validated chat request -> one turn's typed events (turn_events.py),
which each wire surface renders (chat_completions.py renders OpenAI's chat completions).

Knows: the order of work — admission, prompt (prompt.py), constraint (constraints),
generation (Engine), parsing (parsers), the validator handoff and bounded repair rounds
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
  request, shielded from cancellation, so its batch slot is always freed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio

from callgate import parsers
from callgate.call_plan import CallPlan
from callgate.decoding import closing_marks
from callgate.formats import get_format
from callgate.serving import recovery
from callgate.serving.admission import Admission
from callgate.serving.conform import (
    call_id_factory,
    conform_chat,
    parser_tools,
    stops_outside_markup,
)
from callgate.serving.engines.engine import ConstraintRef, Engine, GenerationRequest, SamplingParams
from callgate.serving.engines.tokenizer import special_tokens, writes_reasoning
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
from callgate.serving.stop_filter import StopFilter
from callgate.serving.surfaces import chat_completions
from callgate.serving.surfaces.protocol import ChatRequest, tool_call_dict
from callgate.serving.surfaces.protocol_request import check_logit_bias
from callgate.serving.turn import ChatFailure, Round, Turn
from callgate.serving.turn_events import (
    AcceptedCall,
    CallsAccepted,
    ContentDelta,
    FinishReason,
    ReasoningDelta,
    RoundStart,
    TurnDone,
    TurnEvent,
    TurnUsage,
)
from callgate.types import DiagnosticEvent, Event, TextDelta, arguments_json
from callgate.types import ReasoningDelta as ParsedReasoning

log = logging.getLogger("callgate.chat")
# under `none` no tool enters the grammar or its key
_WARM_PLAN = CallPlan.of([{"type": "function", "function": {"name": "warm_up"}}], "none", None, None)
_WARM_TIMEOUT_S = 600.0

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
        self._vocabulary: dict[bytes, list[int]] | None = None
        self._specials: dict[int, str] = {}
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
            constraint = await self._constraint(req)
            turn = Turn(
                req,
                constraint,
                started_s,
                fmt=self.settings.format,
                model=self.settings.model_name,
                max_repairs=self.settings.max_repairs,
                release=self.admission.release,
            )
            await self._prompt(turn)  # fail fast: 400 for an oversized prompt before streaming
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
                async with contextlib.aclosing(self._generate(turn, rnd)) as batches:
                    async for batch in batches:
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

    async def _generate(self, turn: Turn, rnd: Round) -> AsyncGenerator[list[Event], None]:
        """Parse events of one generation, delta by delta; fills `rnd.result`."""
        prompt = await self._prompt(turn)
        req = turn.req
        fmt = self.settings.format
        parser = parsers.stream_parser(
            fmt,
            parser_tools(req),
            thinking=req.thinking,
            call_ids=call_id_factory(fmt),
            json_answer=req.plan.json_answer,
        )
        request_id = f"{turn.completion_id}-{rnd.index}"
        # Where calls or reasoning may be written, stop strings end only the text (stop_filter.py).
        stops = StopFilter(req.stop) if stops_outside_markup(fmt, req) else None
        engine_stop = () if stops is not None else req.stop
        sampling = SamplingParams(
            prompt.max_tokens,
            req.temperature,
            req.top_p,
            req.seed,
            engine_stop,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            top_k=req.top_k,
            min_p=req.min_p,
            logit_bias=req.logit_bias,
        )
        recovering = turn.recovery_in(rnd.index)
        constraint = turn.constraint if recovering is None else recovering.constraint
        stream = self.engine.generate(
            GenerationRequest(request_id, prompt.text, sampling, constraint, prompt.spans, prompt.ids)
        )
        finished = False
        last_s = turn.started_s
        base = turn.usage
        try:
            async for delta in stream:
                now_s = time.monotonic()
                if rnd.index == 0 and last_s == turn.started_s:
                    self.metrics.first_token(now_s - last_s)
                else:
                    self.metrics.inter_token(now_s - last_s)
                last_s = now_s
                turn.usage = TurnUsage(
                    base.prompt_tokens + delta.prompt_tokens,
                    base.completion_tokens + delta.completion_tokens,
                    base.cached_tokens + delta.cached_tokens,
                )
                if turn.quick is not None:
                    turn.quick.launch()  # the whole conversation is in the prefix cache from here on
                if delta.finish_reason is not None:
                    rnd.finish_reason = delta.finish_reason
                    rnd.stop_string = delta.stop_string
                    finished = True
                rnd.output.append(delta.text)
                events = parser.feed(delta.text)
                if stops is not None:
                    events = stops.feed(events)
                if events:
                    yield events
                if stops is not None and stops.stopped:
                    break
            if constraint is not None and turn.usage.completion_tokens - base.completion_tokens >= prompt.max_tokens:
                # the output used all of max_tokens: the engine says "stop" for an EOS there
                rnd.finish_reason = "length"
            if closing_marks.take(getattr(self.engine, "closing_dir", None), request_id):
                rnd.truncated = True  # budget closing cut the output short (decoding/processor.py)
                rnd.finish_reason = "length"
            tail = _finish_parse(parser, stops, rnd)
            if rnd.truncated:
                _mark_last_truncated(rnd)
            if tail:
                yield tail
        finally:
            self.metrics.tokens(
                turn.usage.prompt_tokens - base.prompt_tokens, turn.usage.completion_tokens - base.completion_tokens
            )
            if rnd.result is None:
                rnd.result = parser.result()
            with anyio.CancelScope(shield=True):
                await _close(stream)
                if not finished:
                    await self.engine.abort(request_id)

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

    async def _grammar_builder(self) -> Any:
        """callgate.constraints' `build_plan_async`, the vocabulary loaded; None when the server
        runs unconstrained (switched off, or callgate.constraints absent: it is optional at
        this seam)."""
        if not self.settings.constrained:
            return None
        build_async = getattr(importlib.import_module("callgate.constraints"), "build_plan_async", None)
        if build_async is not None and self._vocabulary is None:
            self._vocabulary = await anyio.to_thread.run_sync(self.engine.tokenizer.vocabulary)
            self._specials = special_tokens(self.engine.tokenizer)
        return build_async

    async def _constraint(self, req: ChatRequest) -> ConstraintRef | None:
        build_async = await self._grammar_builder()
        if build_async is None:
            return None
        constraint = await build_async(
            self.settings.format,
            req.plan,
            self._vocabulary,
            eos_token_id=self.engine.tokenizer.eos_token_id,
            specials=self._specials,
            actor=req.actor,
            timeout_s=self.settings.limits.grammar_timeout_s,
        )
        ref: ConstraintRef | None = None if constraint is None else constraint.ref()
        return ref

    async def warm_grammars(self) -> None:
        """Compile the format's grammar that holds no schema (tool_choice `none`, as a
        request with default settings asks for it) into the cache, so that the first such
        request does not wait for it (mistral's took seconds before GRAMMAR_VERSION 9). Run
        in the background at start; a failure is logged, never raised."""
        try:
            build_async = await self._grammar_builder()
            if build_async is None:
                return
            start = time.monotonic()
            # the plan a `none` request with default settings gets (its thinking as conform_chat sets it)
            plan = dataclasses.replace(_WARM_PLAN, thinking=None if self.reasons else False)
            await build_async(
                self.settings.format,
                plan,
                self._vocabulary,
                eos_token_id=self.engine.tokenizer.eos_token_id,
                specials=self._specials,
                timeout_s=_WARM_TIMEOUT_S,
            )
            log.info("warmed the %s tool_choice=none grammar in %.2f s", self.settings.format, time.monotonic() - start)
        except Exception:  # a warm-up is an optimisation: each request compiles what it needs
            log.warning("could not warm the %s grammar", self.settings.format, exc_info=True)

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
        rec = await recovery.plan(self.settings, turn.req, found, rnd.index, turn.max_repairs, self._constraint)
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


async def _close(stream: AsyncIterator[Any]) -> None:
    if isinstance(stream, AsyncGenerator):
        await stream.aclose()


def _finish_parse(parser: parsers.StreamParser, stops: StopFilter | None, rnd: Round) -> list[Event]:
    """The last events of a generation; fills `rnd.result`. Output ended by a stop string
    is the output up to it: the parser is not finished (the rest was never generated)."""
    if stops is None:
        tail = parser.finish()
        rnd.result = parser.result()
        return tail
    tail = stops.finish([] if stops.stopped else parser.finish())
    if stops.stopped:
        rnd.finish_reason = "stop"
        rnd.stop_string = stops.matched
    rnd.result = stops.result() if stops.stopped else parser.result()
    return tail


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


def _mark_last_truncated(rnd: Round) -> None:
    """Budget closing cut the output short: the last call is the one it closed."""
    result = rnd.result
    if result is not None and result.candidates:
        *kept, last = result.candidates
        rnd.result = dataclasses.replace(result, candidates=(*kept, dataclasses.replace(last, truncated=True)))
