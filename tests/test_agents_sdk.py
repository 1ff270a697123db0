"""The OpenAI Agents SDK (its default model: the Responses API) running a tool-using agent
against a real callgate server on a scripted FakeEngine, plain and streamed.

Skipped where `openai-agents` is not installed: it is not in the dev extras, since
openai-agents 0.24.0 pins `websockets<17` and would downgrade the environment's websockets
17.4. Checked by hand with openai-agents 0.24.0 on its own path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests import test_server_openai
from tests.test_server_app import MODEL, call_text
from tests.test_server_openai import Server

agents: Any = pytest.importorskip("agents")

serve = test_server_openai.serve  # the real-server fixture


def test_an_agent_calls_its_function_tool_and_answers(serve: Callable[..., Server]) -> None:
    import openai

    replies = [
        call_text("get_weather", {"city": "Oslo"}),
        "Oslo is at -3 C.",
        call_text("get_weather", {"city": "Bergen"}),
        "Bergen is at 2 C.",
    ]
    server = serve(replies=replies)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        seen.append(city)
        return f"{city}: cold"

    async def run() -> tuple[str, str, set[str]]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = agents.Agent(name="weather", model=model, tools=[get_weather], instructions="Use the tool.")
            plain = await agents.Runner.run(agent, "Weather in Oslo?")
            streamed = agents.Runner.run_streamed(agent, "Weather in Bergen?")
            kinds = {ev.type async for ev in streamed.stream_events()}
        return plain.final_output, streamed.final_output, kinds

    agents.set_tracing_disabled(True)
    plain, streamed, kinds = asyncio.run(run())
    assert (plain, streamed) == ("Oslo is at -3 C.", "Bergen is at 2 C.")
    assert seen == ["Oslo", "Bergen"]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    prompts = [r.prompt for r in server.engine.requests]
    assert "Oslo: cold" in prompts[1] and "Bergen: cold" in prompts[3]
