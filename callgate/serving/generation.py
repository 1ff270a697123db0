"""One round's generation: the engine's token deltas -> the parser's events, batch by batch.

Knows: the round's sampling (from the request and its prompt), where stop strings apply
(stop_filter.py, outside the markup where calls or reasoning may be written), usage and
time-to-token metrics, the engine's finish and budget closing's marks (a cut output ends
`length`, its last call `truncated`), and that leaving early closes the stream and aborts
the request, shielded from cancellation, so its batch slot is always freed.
Does not know: validation, repair rounds, the answer, any wire shape.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

from callgate import parsers
from callgate.decoding import closing_marks
from callgate.serving.conform import call_id_factory, parser_tools, stops_outside_markup
from callgate.serving.engines.engine import Engine, GenerationRequest, SamplingParams
from callgate.serving.metrics import Metrics
from callgate.serving.prompt import Prompt
from callgate.serving.stop_filter import StopFilter
from callgate.serving.turn import Round, Turn
from callgate.serving.turn_events import TurnUsage
from callgate.types import Event


async def generate_round(
    engine: Engine,
    fmt: str,
    metrics: Metrics,
    turn: Turn,
    rnd: Round,
    prompt_of: Callable[[Turn], Awaitable[Prompt]],
) -> AsyncGenerator[list[Event], None]:
    """Parse events of one generation of `rnd` on the prompt `prompt_of(turn)`, delta by
    delta; fills `rnd.result`, its output, finish reason and stop string."""
    prompt = await prompt_of(turn)
    req = turn.req
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
    stream = engine.generate(GenerationRequest(request_id, prompt.text, sampling, constraint, prompt.spans, prompt.ids))
    finished = False
    prefilled = False
    last_s = turn.started_s
    base = turn.usage
    try:
        async for delta in stream:
            now_s = time.monotonic()
            if rnd.index == 0 and last_s == turn.started_s:
                metrics.first_token(now_s - last_s)
            else:
                metrics.inter_token(now_s - last_s)
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
            if events or not prefilled:
                yield events  # the first delta's batch even when empty: the prompt is read (Prefilled)
            prefilled = True
            if stops is not None and stops.stopped:
                break
        if constraint is not None and turn.usage.completion_tokens - base.completion_tokens >= prompt.max_tokens:
            # the output used all of max_tokens: the engine says "stop" for an EOS there
            rnd.finish_reason = "length"
        if closing_marks.take(getattr(engine, "closing_dir", None), request_id):
            rnd.truncated = True  # budget closing cut the output short (decoding/processor.py)
            rnd.finish_reason = "length"
        tail = _finish_parse(parser, stops, rnd)
        if rnd.truncated:
            _mark_last_truncated(rnd)
        if tail:
            yield tail
    finally:
        metrics.tokens(
            turn.usage.prompt_tokens - base.prompt_tokens, turn.usage.completion_tokens - base.completion_tokens
        )
        if rnd.result is None:
            rnd.result = parser.result()
        with anyio.CancelScope(shield=True):
            await _close(stream)
            if not finished:
                await engine.abort(request_id)


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


def _mark_last_truncated(rnd: Round) -> None:
    """Budget closing cut the output short: the last call is the one it closed."""
    result = rnd.result
    if result is not None and result.candidates:
        *kept, last = result.candidates
        rnd.result = dataclasses.replace(result, candidates=(*kept, dataclasses.replace(last, truncated=True)))
