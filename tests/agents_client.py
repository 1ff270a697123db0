"""Run by tests/test_agents_sdk.py in a Python that has `openai-agents` (the project's
`.venv-agents`, see scripts/install.sh: openai-agents pins websockets<17, which the server's
environment cannot take). Runs a tool-using agent with the SDK's default model (the
Responses API) against BASE_URL, plainly then streamed; prints one JSON object."""

from __future__ import annotations

import asyncio
import json
import sys

import agents
import openai


async def main(base_url: str, model: str) -> None:
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        seen.append(city)
        return f"{city}: cold"

    agents.set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as client:
        agents.set_default_openai_client(client, use_for_tracing=False)
        agent = agents.Agent(name="weather", model=model, tools=[get_weather], instructions="Use the tool.")
        plain = await agents.Runner.run(agent, "Weather in Oslo?")
        streamed = agents.Runner.run_streamed(agent, "Weather in Bergen?")
        kinds = sorted({ev.type async for ev in streamed.stream_events()})
    print(json.dumps({"plain": plain.final_output, "streamed": streamed.final_output, "kinds": kinds, "seen": seen}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
