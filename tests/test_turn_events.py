"""ChatService.events: the typed events of one turn (serving/turn_events.py), in the
documented order, through the real hermes parser, constraint-free, with a scripted
FakeEngine: text deltas per round, accepted calls once, TurnDone last with usage, the
`callgate` block and the stop string; failures raised; closing early aborts and frees."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.serving.chat import ChatFailure, ChatService
from callgate.serving.engines.engine import GenerationRequest, SamplingParams
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.metrics import Metrics
from callgate.serving.settings import Limits
from callgate.serving.surfaces.protocol import parse_chat_request
from callgate.serving.turn_events import (
    CallsAccepted,
    ContentDelta,
    Prefilled,
    RoundStart,
    TurnDone,
    TurnEvent,
)
from tests.test_server_app import ASK, MODEL, WEATHER, SchemaCheck, call_text, make_settings


def _service(replies: list[Any]) -> tuple[ChatService, FakeEngine]:
    engine = FakeEngine(replies=replies)
    return ChatService(make_settings(constrained=False), engine, SchemaCheck(), Metrics()), engine


def _request(**kw: Any) -> Any:
    return parse_chat_request(json.dumps({"model": MODEL, "messages": ASK, **kw}).encode(), Limits())


async def _events(service: ChatService, **kw: Any) -> list[TurnEvent]:
    turn = await service.start(_request(**kw))
    return [ev async for ev in service.events(turn)]


async def test_an_answer_is_round_start_text_then_done() -> None:
    service, _ = _service([["Sun", "ny in ", "Oslo."]])
    events = await _events(service)
    assert events[0] == RoundStart(0)
    assert "".join(ev.text for ev in events if isinstance(ev, ContentDelta)) == "Sunny in Oslo."
    done = events[-1]
    assert isinstance(done, TurnDone) and not any(isinstance(ev, CallsAccepted) for ev in events)
    assert (done.finish_reason, done.content, done.calls, done.stop_sequence) == ("stop", "Sunny in Oslo.", (), None)
    assert done.usage.completion_tokens > 0 and done.usage.prompt_tokens > 0
    assert done.callgate["format"] == "hermes" and done.callgate["repairs"] == 0
    assert service.admission.in_flight == 0


async def test_a_stop_string_is_named_in_done() -> None:
    service, _ = _service([["Sunny", " END", " more"]])
    [*_, done] = await _events(service, tools=[WEATHER], stop=["END", "zzz"])  # filtered by callgate
    assert isinstance(done, TurnDone)
    assert (done.finish_reason, done.content, done.stop_sequence) == ("stop", "Sunny ", "END")


async def test_accepted_calls_come_once_before_done() -> None:
    service, _ = _service([[call_text("get_weather", {"city": "Oslo"})]])
    events = await _events(service, tools=[WEATHER])
    assert [type(ev).__name__ for ev in events] == ["RoundStart", "Prefilled", "CallsAccepted", "TurnDone"]
    accepted, done = events[2], events[3]
    assert isinstance(accepted, CallsAccepted) and isinstance(done, TurnDone)
    [call] = accepted.calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    assert done.calls == accepted.calls and done.finish_reason == "tool_calls"
    assert done.callgate["candidates"][0]["verdict"]["verdict"] == "accepted"


async def test_each_round_says_when_its_prompt_is_read_with_the_usage_then() -> None:
    """Prefilled comes with a round's first token, before its text: the prompt tokens and
    prefix-cache hits (what Anthropic's message_start reports) are known from there."""
    service, _ = _service([["Sunny", " in Oslo."], ["Sunny", " in Oslo."]])
    first = await _events(service)
    again = await _events(service)  # the same prompt: its whole blocks come from the cache
    for events in (first, again):
        assert isinstance(events[0], RoundStart) and isinstance(events[1], Prefilled)
        assert isinstance(events[2], ContentDelta) and isinstance(events[-1], TurnDone)
    start, done = again[1], again[-1]
    assert isinstance(start, Prefilled) and isinstance(done, TurnDone)
    assert start.usage.prompt_tokens == done.usage.prompt_tokens > 0
    assert start.usage.cached_tokens == done.usage.cached_tokens > 0
    assert isinstance(first[1], Prefilled) and first[1].usage.cached_tokens == 0


async def test_a_rejected_round_is_followed_by_a_repair_round() -> None:
    bad = call_text("get_weather", {"city": 7})
    good = call_text("get_weather", {"city": "Oslo"})
    service, _ = _service([[bad], [good]])
    events = await _events(service, tools=[WEATHER])
    assert [ev for ev in events if isinstance(ev, RoundStart)] == [RoundStart(0), RoundStart(1)]
    assert [ev.round for ev in events if isinstance(ev, Prefilled)] == [0, 1]
    [accepted] = [ev for ev in events if isinstance(ev, CallsAccepted)]
    assert accepted.round == 1 and json.loads(accepted.calls[0].arguments) == {"city": "Oslo"}
    done = events[-1]
    assert isinstance(done, TurnDone) and done.callgate["repairs"] == 1


async def test_bad_output_is_raised_and_frees_the_slot() -> None:
    service, _ = _service([["<tool_call>\n{not json\n</tool_call>"]])
    turn = await service.start(_request(tools=[WEATHER]))
    with pytest.raises(ChatFailure) as info:
        async for _ in service.events(turn):
            pass
    assert info.value.error.status == 502 and "raw" in info.value.callgate
    assert service.admission.in_flight == 0


async def test_closing_early_aborts_the_generation_and_frees_the_slot() -> None:
    service, engine = _service([["a", "b", "c", "d", "e"]])
    turn = await service.start(_request())
    assert service.admission.in_flight == 1
    events = service.events(turn)
    async for ev in events:
        if isinstance(ev, ContentDelta):
            break
    await events.aclose()
    assert engine.aborted == [f"{turn.completion_id}-0"]
    assert service.admission.in_flight == 0


async def test_the_fake_engine_names_the_stop_string_that_ended_it() -> None:
    engine = FakeEngine(replies=[["Sun", "ny E", "ND more"]])
    sampling = SamplingParams(max_tokens=50, stop=("zzz", "END"))
    deltas = [d async for d in engine.generate(GenerationRequest("r", "prompt", sampling))]
    assert "".join(d.text for d in deltas) == "Sunny "
    assert (deltas[-1].finish_reason, deltas[-1].stop_string) == ("stop", "END")
