"""The official `anthropic` client against `callgate serve` on the real embedded model
(SmolLM2-135M, the server of tests/test_e2e_serving.py): `messages.create` with a tool and
tool_choice any gets a well-formed tool_use block, streamed or not."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_e2e_serving import ASK_WEATHER, MODEL_NAME, WEATHER, check_weather_arguments, server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
__all__ = ["server"]  # the fixture, used by name

TOOL = {
    "name": WEATHER["function"]["name"],  # type: ignore[index]
    "description": WEATHER["function"]["description"],  # type: ignore[index]
    "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
}


def test_tool_choice_any_gets_a_tool_use_block(server: str) -> None:
    import anthropic

    with anthropic.Anthropic(base_url=server, api_key="unused", timeout=300, max_retries=0) as client:
        kwargs: dict[str, Any] = dict(
            model=MODEL_NAME,
            max_tokens=96,
            messages=ASK_WEATHER,
            tools=[TOOL],
            # one call: the grammar then ends the turn (with parallel calls SmolLM2 writes a second
            # one greedily, which max_tokens may cut: a truncated call and stop_reason max_tokens)
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0},  # the 2.x SDK has no temperature argument; the API still takes it
        )
        done = client.messages.create(**kwargs)
        assert done.stop_reason == "tool_use"
        uses = [b for b in done.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
        check_weather_arguments(uses[0].input)
        with client.messages.stream(**kwargs) as stream:
            streamed = stream.get_final_message()
    streamed_uses = [(b.name, b.input) for b in streamed.content if b.type == "tool_use"]
    assert streamed_uses == [(u.name, u.input) for u in uses]
