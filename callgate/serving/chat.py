"""The chat service: one validated chat request -> an OpenAI response or SSE stream.

Knows: the order of work — admission, prompt (prompt.py), constraint (constraints),
generation (Engine), parsing (parsers), the validator handoff and bounded repair rounds
(handoff.py), the answer — and which failures become which errors.
Does not know: the web framework, pydantic, vllm, or any format's syntax.

Policy:
* A diagnostic other than `unknown_tool` (whose candidate still goes to the validator and
  is rejected there) means the output held a call block that could not be read: 502
  `model_output_error` with the diagnostic's code; streaming ends with an `error` event.
  Either body's `callgate` block has `raw`: the failed round's output as the parser read
  it (bounded, protocol_response.RAW_TEXT_MAX_CHARS), which the diagnostics' spans index.
  So does output that breaks what the grammar would have enforced (no call under
  tool_choice required/named, another tool than the named one, several calls with
  parallel_tool_calls=false): codes `missing_tool_call`, `wrong_tool`, `too_many_calls`.
* Every candidate gets a verdict before anything about it is sent. A round whose verdicts
  are all `accepted` is the answer; otherwise the calls and the validator's errors are fed
  back as tool results and the model tries again, at most `max_repairs` times; then 422.
  Streaming sends text as it is generated and a round's tool calls only once all of that
  round's verdicts are in (a rejected round's calls are never sent).
* Leaving early (client gone, task cancelled) closes the engine stream and aborts the
  request, shielded from cancellation, so its batch slot is always freed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from callgate import parsers
from callgate.errors import (
    CallgateError,
    ModelOutputError,
    RateLimitError,
    ToolCallRejectedError,
    ValidatorUnavailableError,
)
from callgate.serving import audit, sse
from callgate.serving.audit import AuditLog
from callgate.serving.conform import (
    call_id_factory,
    conform_call_ids,
    conform_chat,
    grammar_thinking,
    parser_tools,
    stops_outside_markup,
)
from callgate.serving.engine import ConstraintRef, Engine, GenerationRequest, SamplingParams
from callgate.serving.handoff import (
    ADVISORY_CODES,
    Validator,
    Verdict,
    choice_violation,
    fatal,
    final_arguments,
    repair_messages,
    validate_all,
    verdict_dict,
)
from callgate.serving.idempotency import ANONYMOUS, conversation_scope, idempotency_key
from callgate.serving.metrics import Metrics
from callgate.serving.prompt import Prompt, build_prompt
from callgate.serving.protocol import (
    ChatRequest,
    candidate_dict,
    chunk_dict,
    completion_dict,
    diagnostic_dict,
    raw_output_dict,
    tool_call_dict,
    usage_dict,
)
from callgate.serving.protocol_request import check_logit_bias
from callgate.serving.quick import Conversation, QuickBeside, QuickConfig, QuickService
from callgate.serving.settings import Settings
from callgate.serving.stop_filter import StopFilter
from callgate.serving.tokenizer import special_tokens
from callgate.types import Diagnostic, DiagnosticEvent, Event, ParseResult, ReasoningDelta, TextDelta, arguments_json

log = logging.getLogger("callgate.chat")
_WARM_TOOL = {"type": "function", "function": {"name": "warm_up"}}
_WARM_TIMEOUT_S = 600.0


class ChatFailure(Exception):
    """A typed error plus the `callgate` block that explains it (raw output, verdicts)."""

    def __init__(self, error: CallgateError, callgate: Mapping[str, Any]) -> None:
        super().__init__(error.message)
        self.error = error
        self.callgate = dict(callgate)

    def body(self) -> dict[str, Any]:
        return {**self.error.to_body(), "callgate": self.callgate}


class Admission:
    """At most `running + queue` chat requests in flight; beyond that 429 at once."""

    def __init__(self, running: int, queue: int, metrics: Metrics) -> None:
        self._running = running
        self._limit = running + queue
        self._in_flight = 0
        self._metrics = metrics

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def acquire(self) -> None:
        if self._in_flight >= self._limit:
            raise RateLimitError(f"server busy: {self._in_flight} requests in flight, queue full; retry later")
        self._in_flight += 1
        self._report()

    def release(self) -> None:
        self._in_flight -= 1
        self._report()

    def _report(self) -> None:
        self._metrics.admitted(self._in_flight, max(0, self._in_flight - self._running))


@dataclass(slots=True)
class _Usage:
    prompt: int = 0
    completion: int = 0
    cached: int = 0

    def dict(self) -> dict[str, Any]:
        return usage_dict(self.prompt, self.completion, self.cached)


@dataclass(slots=True)
class _Round:
    """One generation: its output as the parser read it, its parse result, finish reason
    and verdicts once known."""

    index: int
    output: list[str] = field(default_factory=list)  # kept for an error body's `raw`
    result: ParseResult | None = None
    finish_reason: str = "stop"
    verdicts: list[Verdict] = field(default_factory=list)

    def raw(self, focus: int) -> dict[str, Any]:
        assert self.result is not None
        return raw_output_dict(self.index, "".join(self.output), self.result, focus)

    @property
    def accepted(self) -> bool:
        return all(v.verdict == "accepted" for v in self.verdicts)


class _Turn:
    """The per-request state of one chat completion; created admitted, `close` frees it."""

    def __init__(
        self, service: ChatService, req: ChatRequest, constraint: ConstraintRef | None, started_s: float
    ) -> None:
        self.service = service
        self.req = req
        self.constraint = constraint
        self.completion_id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.started_s = started_s  # admission time: time to first token includes the grammar compile
        self.usage = _Usage()
        self.rounds: list[_Round] = []
        self.messages: list[Mapping[str, Any]] = list(req.messages)
        self.prompt: Prompt | None = None
        self.quick: QuickBeside | None = None  # heads asked for in `callgate.quick`
        self.quick_block: dict[str, Any] = {}
        self._closed = False

    @functools.cached_property
    def scope(self) -> str:
        """What the turn's calls answer (callgate.serving.idempotency): the request's messages,
        the same in every repair round, so a repaired call is still the same action."""
        return conversation_scope(self.req.messages)

    @property
    def actor(self) -> str:
        return self.req.actor or ANONYMOUS

    @property
    def max_repairs(self) -> int:
        return self.service.settings.max_repairs if self.req.max_repairs is None else self.req.max_repairs

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.quick is not None:
                self.quick.cancel()
            self.service.admission.release()

    def callgate_block(self) -> dict[str, Any]:
        candidates: list[dict[str, Any]] = []
        diagnostics: list[dict[str, Any]] = []
        for rnd in self.rounds:
            if rnd.result is None:
                continue
            verdicts: list[dict[str, Any] | None] = [verdict_dict(v) for v in rnd.verdicts]
            verdicts += [None] * (len(rnd.result.candidates) - len(verdicts))  # a failed round's: never judged
            for c, v in zip(rnd.result.candidates, verdicts, strict=True):
                candidates.append({**candidate_dict(c), "round": rnd.index, "verdict": v})
            diagnostics += [{**diagnostic_dict(d), "round": rnd.index} for d in rnd.result.diagnostics]
        return {
            "format": self.service.settings.format,
            "constrained": self.constraint is not None,
            "repairs": max(0, len(self.rounds) - 1),
            "candidates": candidates,
            "diagnostics": diagnostics,
            **self.quick_block,
        }


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
        self._vocabulary: dict[bytes, list[int]] | None = None
        self._specials: dict[int, str] = {}
        self.quick = QuickService(engine, settings.format, QuickConfig(constrained=settings.constrained))

    # ---- entry points -----------------------------------------------------------------

    async def start(self, req: ChatRequest) -> _Turn:
        """Fit the request to the format (400 when it cannot be), admit it (429 when full)
        and compile its constraint; the caller must `close()` the returned turn (the
        response functions do it themselves)."""
        req = conform_chat(self.settings.format, req)
        check_logit_bias(req, self.engine.tokenizer.vocab_size)
        self.admission.acquire()
        started_s = time.monotonic()
        try:
            constraint = await self._constraint(req)
            turn = _Turn(self, req, constraint, started_s)
            await self._prompt(turn)  # fail fast: 400 for an oversized prompt before streaming
            if req.quick:  # heads placed after the user turn start beside the main generation
                tools = None if req.tool_choice == "none" else req.tools
                conversation = Conversation(req.messages, tools, req.thinking, req.reasoning_effort)
                turn.quick = self.quick.beside(conversation, req.quick, turn.completion_id)
            return turn
        except BaseException:
            self.admission.release()
            raise

    async def complete(self, turn: _Turn) -> dict[str, Any]:
        """The non-streaming response. Raises ChatFailure / CallgateError."""
        try:
            while True:
                rnd = _Round(len(turn.rounds))
                turn.rounds.append(rnd)
                async with contextlib.aclosing(self._generate(turn, rnd)) as events:
                    async for _ in events:
                        pass
                self._raise_on_bad_output(turn, rnd)
                await self._validate(turn, rnd)
                if rnd.accepted:
                    await self._finish_quick(turn, rnd)
                    return self._response(turn, rnd)
                self._next_round_or_reject(turn, rnd)
        finally:
            turn.close()

    async def stream(self, turn: _Turn) -> AsyncGenerator[bytes, None]:
        """SSE bytes of a streamed response, ending with `[DONE]`; errors become a terminal
        `error` event. Closing the generator early aborts the generation."""
        try:
            yield sse.data_event(self._chunk(turn, {"role": "assistant", "content": ""}))
            async with contextlib.aclosing(self._stream_rounds(turn)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except ChatFailure as exc:
            yield sse.error_event(exc.body())
        except CallgateError as exc:
            yield sse.error_event(exc.to_body())
        except Exception:  # headers are sent: the client still gets an error event and [DONE]
            log.exception("stream %s failed", turn.completion_id)
            yield sse.error_event(CallgateError("internal server error", code="internal_error").to_body())
        finally:
            turn.close()
        yield sse.DONE

    # ---- rounds -------------------------------------------------------------------------

    async def _stream_rounds(self, turn: _Turn) -> AsyncGenerator[bytes, None]:
        while True:
            rnd = _Round(len(turn.rounds))
            turn.rounds.append(rnd)
            async with contextlib.aclosing(self._generate(turn, rnd)) as events:
                async for batch in events:
                    for delta in _visible_deltas(batch):
                        yield sse.data_event(self._chunk(turn, delta))
                    if any(
                        isinstance(ev, DiagnosticEvent) and ev.diagnostic.code not in ADVISORY_CODES for ev in batch
                    ):
                        break  # the output is already unusable: stop generating
            self._raise_on_bad_output(turn, rnd)
            await self._validate(turn, rnd)
            if rnd.accepted:
                await self._finish_quick(turn, rnd)
                for chunk in self._final_chunks(turn, rnd):
                    yield chunk
                return
            self._next_round_or_reject(turn, rnd)

    async def _generate(self, turn: _Turn, rnd: _Round) -> AsyncGenerator[list[Event], None]:
        """Parse events of one generation, delta by delta; fills `rnd.result`."""
        prompt = await self._prompt(turn)
        req = turn.req
        fmt = self.settings.format
        parser = parsers.stream_parser(
            fmt,
            parser_tools(req),
            thinking=req.thinking,
            call_ids=call_id_factory(fmt),
            json_answer=req.response_format is not None and req.tool_choice == "auto",
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
        stream = self.engine.generate(
            GenerationRequest(request_id, prompt.text, sampling, turn.constraint, prompt.spans, prompt.ids)
        )
        finished = False
        last_s = turn.started_s
        base = (turn.usage.prompt, turn.usage.completion, turn.usage.cached)
        try:
            async for delta in stream:
                now_s = time.monotonic()
                if rnd.index == 0 and last_s == turn.started_s:
                    self.metrics.first_token(now_s - last_s)
                else:
                    self.metrics.inter_token(now_s - last_s)
                last_s = now_s
                turn.usage = _Usage(
                    base[0] + delta.prompt_tokens, base[1] + delta.completion_tokens, base[2] + delta.cached_tokens
                )
                if turn.quick is not None:
                    turn.quick.launch()  # the whole conversation is in the prefix cache from here on
                if delta.finish_reason is not None:
                    rnd.finish_reason = delta.finish_reason
                    finished = True
                rnd.output.append(delta.text)
                events = parser.feed(delta.text)
                if stops is not None:
                    events = stops.feed(events)
                if events:
                    yield events
                if stops is not None and stops.stopped:
                    break
            if turn.constraint is not None and turn.usage.completion - base[1] >= prompt.max_tokens:
                # Budget closing (constraints/budget.py) ends a call it had to cut short with
                # EOS at exactly max_tokens: the engine says "stop", but the output was cut.
                rnd.finish_reason = "length"
            tail = _finish_parse(parser, stops, rnd)
            if tail:
                yield tail
        finally:
            self.metrics.tokens(turn.usage.prompt - base[0], turn.usage.completion - base[1])
            if rnd.result is None:
                rnd.result = parser.result()
            with anyio.CancelScope(shield=True):
                await _close(stream)
                if not finished:
                    await self.engine.abort(request_id)

    async def _prompt(self, turn: _Turn) -> Prompt:
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
        """callgate.constraints' `build_async`, the vocabulary loaded; None when the server
        runs unconstrained (switched off, or callgate.constraints absent: it is optional at
        this seam)."""
        if not self.settings.constrained:
            return None
        build_async = getattr(importlib.import_module("callgate.constraints"), "build_async", None)
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
            req.tools or (),
            req.tool_choice,
            req.parallel_tool_calls,
            req.response_format,
            self._vocabulary,
            eos_token_id=self.engine.tokenizer.eos_token_id,
            specials=self._specials,
            thinking=grammar_thinking(self.settings.format, req),
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
            await build_async(
                self.settings.format,
                [_WARM_TOOL],  # under `none` no tool enters the grammar or its key
                "none",
                None,
                None,
                self._vocabulary,
                eos_token_id=self.engine.tokenizer.eos_token_id,
                specials=self._specials,
                timeout_s=_WARM_TIMEOUT_S,
            )
            log.info("warmed the %s tool_choice=none grammar in %.2f s", self.settings.format, time.monotonic() - start)
        except Exception:  # a warm-up is an optimisation: each request compiles what it needs
            log.warning("could not warm the %s grammar", self.settings.format, exc_info=True)

    # ---- validation and repair ----------------------------------------------------------

    def _raise_on_bad_output(self, turn: _Turn, rnd: _Round) -> None:
        assert rnd.result is not None
        for d in rnd.result.diagnostics:
            self.metrics.diagnostic(d.code)
        broken = fatal(rnd.result.diagnostics)
        if broken is not None and _reasoning_cut_short(turn.req, rnd, broken):
            broken = None  # it ended inside its reasoning: a reasoning-only answer, not bad output
        if broken is not None:
            error = ModelOutputError(f"model output is not a well-formed call: {broken.message}", code=broken.code)
            raise ChatFailure(error, {**turn.callgate_block(), "raw": rnd.raw(broken.span[0])})
        violation = choice_violation(turn.req, rnd.result)
        if violation is not None:
            self.metrics.diagnostic(violation.code)
            block = turn.callgate_block()
            block["diagnostics"].append({**diagnostic_dict(violation), "round": rnd.index})
            error = ModelOutputError(f"model output breaks the request: {violation.message}", code=violation.code)
            raise ChatFailure(error, {**block, "raw": rnd.raw(violation.span[0])})

    async def _validate(self, turn: _Turn, rnd: _Round) -> None:
        """Verdicts for the round's candidates; each is in the audit log (fsynced) before
        this returns, so before any response that carries it. No verdict: audited, raised."""
        assert rnd.result is not None
        started_s = time.monotonic()
        try:
            rnd.verdicts = await validate_all(
                self.validator,
                turn.req,
                rnd.result.candidates,
                request_id=turn.completion_id,
                model=self.settings.model_name,
                fmt=self.settings.format,
                constrained=turn.constraint is not None,
                actor=turn.actor,
                scope=turn.scope if rnd.result.candidates else "",  # hashed only when there is a call
            )
        except ValidatorUnavailableError as exc:
            await self._audit(
                turn, rnd, [{"verdict": "unavailable", "error": exc.message}] * len(rnd.result.candidates)
            )
            raise
        finally:
            if rnd.result.candidates:
                self.metrics.validator_latency(time.monotonic() - started_s)
        for v in rnd.verdicts:
            self.metrics.verdict(v.verdict)
            for e in v.errors:
                self.metrics.rejection(str(e.get("kind", "unspecified")))
        await self._audit(turn, rnd, [verdict_dict(v) for v in rnd.verdicts])

    async def _audit(self, turn: _Turn, rnd: _Round, verdicts: Sequence[Mapping[str, Any]]) -> None:
        if self.audit is None or rnd.result is None or not rnd.result.candidates:
            return
        diagnostics = [diagnostic_dict(d) for d in rnd.result.diagnostics]
        validator = str(getattr(self.validator, "name", type(self.validator).__name__))
        records = [
            audit.candidate_record(
                request_id=turn.completion_id,
                round_index=rnd.index,
                model=self.settings.model_name,
                fmt=self.settings.format,
                call_id=c.call_id,
                tool=c.name,
                arguments=c.arguments,
                raw=c.raw,
                diagnostics=diagnostics,
                verdict=v,
                validator=validator,
                constrained=turn.constraint is not None,
                idempotency_key=idempotency_key(turn.actor, c.name, c.arguments, turn.scope),
            )
            for c, v in zip(rnd.result.candidates, verdicts, strict=True)
        ]
        try:
            with anyio.CancelScope(shield=True):  # a record, once begun, is finished
                await anyio.to_thread.run_sync(self.audit.write, records)
        except OSError as exc:  # no record, no call: the candidates are withheld
            log.error("audit log %s: %s", self.audit.path, exc)
            raise CallgateError(
                "the audit log cannot be written; no tool call is returned", code="audit_log_failed"
            ) from exc

    def _next_round_or_reject(self, turn: _Turn, rnd: _Round) -> None:
        assert rnd.result is not None
        if rnd.index >= turn.max_repairs:
            rejected = sum(v.verdict != "accepted" for v in rnd.verdicts)
            error = ToolCallRejectedError(
                f"{rejected} tool call(s) rejected by the validator after {rnd.index} repair round(s)",
                code="tool_call_rejected",
            )
            raise ChatFailure(error, turn.callgate_block())
        self.metrics.repair()
        messages = [*turn.messages, *repair_messages(rnd.result, rnd.verdicts)]
        turn.messages = list(conform_call_ids(self.settings.format, messages))

    async def _finish_quick(self, turn: _Turn, rnd: _Round) -> None:
        """Await the heads (answer-position ones run now, on the conversation plus the answer)."""
        if turn.quick is None:
            return
        assert rnd.result is not None
        answer: dict[str, Any] = {"role": "assistant", "content": rnd.result.content or ""}
        calls = self._accepted_calls(rnd)
        if calls:
            answer["tool_calls"] = calls
        result = await turn.quick.finish(answer)
        turn.quick_block = {
            "quick": result.results(),
            "quick_usage": result.usage(),
            "quick_prefix_cache": result.prefix_cache(),
        }

    # ---- response shapes ----------------------------------------------------------------

    def _accepted_calls(self, rnd: _Round) -> list[dict[str, Any]]:
        assert rnd.result is not None
        return [
            tool_call_dict(c.call_id, c.name, arguments_json(final_arguments(c, v)))
            for c, v in zip(rnd.result.candidates, rnd.verdicts, strict=True)
        ]

    def _response(self, turn: _Turn, rnd: _Round) -> dict[str, Any]:
        assert rnd.result is not None
        calls = self._accepted_calls(rnd)
        message: dict[str, Any] = {"role": "assistant", "content": rnd.result.content or (None if calls else "")}
        if rnd.result.reasoning:
            message["reasoning_content"] = rnd.result.reasoning
        if calls:
            message["tool_calls"] = calls
        return completion_dict(
            completion_id=turn.completion_id,
            created=turn.created,
            model=self.settings.model_name,
            message=message,
            finish_reason=_finish(rnd.finish_reason, bool(calls)),
            usage=turn.usage.dict(),
            callgate=turn.callgate_block(),
        )

    def _final_chunks(self, turn: _Turn, rnd: _Round) -> list[bytes]:
        calls = self._accepted_calls(rnd)
        out: list[bytes] = []
        for i, call in enumerate(calls):
            head = {
                "index": i,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            out.append(sse.data_event(self._chunk(turn, {"tool_calls": [head]})))
            args = {"index": i, "function": {"arguments": call["function"]["arguments"]}}
            out.append(sse.data_event(self._chunk(turn, {"tool_calls": [args]})))
        finish = _finish(rnd.finish_reason, bool(calls))
        out.append(sse.data_event(self._chunk(turn, {}, finish_reason=finish, callgate=turn.callgate_block())))
        if turn.req.include_usage:
            out.append(sse.data_event(self._chunk(turn, None, usage=turn.usage.dict())))
        return out

    def _chunk(
        self,
        turn: _Turn,
        delta: Mapping[str, Any] | None,
        *,
        finish_reason: str | None = None,
        usage: Mapping[str, Any] | None = None,
        callgate: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return chunk_dict(
            completion_id=turn.completion_id,
            created=turn.created,
            model=self.settings.model_name,
            delta=delta,
            finish_reason=finish_reason,
            usage=usage,
            callgate=callgate,
        )


async def _close(stream: AsyncIterator[Any]) -> None:
    if isinstance(stream, AsyncGenerator):
        await stream.aclose()


def _finish_parse(parser: parsers.StreamParser, stops: StopFilter | None, rnd: _Round) -> list[Event]:
    """The last events of a generation; fills `rnd.result`. Output ended by a stop string
    is the output up to it: the parser is not finished (the rest was never generated)."""
    if stops is None:
        tail = parser.finish()
        rnd.result = parser.result()
        return tail
    tail = stops.finish([] if stops.stopped else parser.finish())
    if stops.stopped:
        rnd.finish_reason = "stop"
    rnd.result = stops.result() if stops.stopped else parser.result()
    return tail


def _reasoning_cut_short(req: ChatRequest, rnd: _Round, broken: Diagnostic) -> bool:
    """The output ended inside the reasoning block (the only fatal diagnostic): `max_tokens`
    ran out, or the model ended its turn there (possible only where no grammar holds it, as
    without tools). As OpenAI answers a reasoning model out of tokens, the reply is the
    reasoning so far, no content, finish_reason "length" or "stop" — unless tool_choice
    needed a call (then a 502, as documented)."""
    assert rnd.result is not None
    forced = req.tool_choice == "required" or isinstance(req.tool_choice, Mapping)
    others = [d for d in rnd.result.diagnostics if d is not broken and d.code not in ADVISORY_CODES]
    ended = rnd.finish_reason in ("length", "stop")
    return broken.code == "missing_think_end" and ended and not forced and not others


def _visible_deltas(batch: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ev in batch:
        if isinstance(ev, TextDelta) and ev.text:
            out.append({"content": ev.text})
        elif isinstance(ev, ReasoningDelta) and ev.text:
            out.append({"reasoning_content": ev.text})
    return out


def _finish(reason: str, calls: bool) -> str:
    """OpenAI's finish_reason: "length" whenever the output was cut (calls or not)."""
    if reason == "length":
        return reason
    return "tool_calls" if calls else "stop"
