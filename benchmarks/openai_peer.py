"""One chat completion against a running OpenAI-compatible server, through the `openai` client.

Knows: how to send a BFCL case (messages, tools, tool_choice; greedy, `max_tokens`) and
keep what a client sees: content, the tool calls as (name, arguments text), the finish
reason, completion tokens, wall time, or the error. Does not know: scoring (the
benchmark judges the reply), which server it talks to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reply:
    content: str
    tool_calls: tuple[tuple[str, str], ...]  # (name, arguments as the server sent them)
    finish: str | None
    completion_tokens: int
    elapsed_s: float
    error: str | None = None


def client(base_url: str, timeout_s: float = 600.0) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=timeout_s, max_retries=0)


async def ask(
    api: Any,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any,
    max_tokens: int,
) -> Reply:
    """One non-streamed greedy completion; an HTTP error is a Reply with `error`."""
    from openai import APIError

    started = time.perf_counter()
    try:
        r = await api.chat.completions.create(
            model=model,
            messages=list(messages),
            tools=list(tools),
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=0.0,
        )
    except APIError as e:
        return Reply("", (), None, 0, time.perf_counter() - started, error=f"{type(e).__name__}: {e}"[:300])
    elapsed = time.perf_counter() - started
    choice = r.choices[0]
    calls = tuple((c.function.name, c.function.arguments) for c in (choice.message.tool_calls or ()))
    tokens = r.usage.completion_tokens if r.usage else 0
    return Reply(choice.message.content or "", calls, choice.finish_reason, tokens, elapsed)


async def ask_all(
    api: Any, model: str, requests: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], Any]],
    max_tokens: int, concurrency: int,
) -> tuple[list[Reply], float]:  # fmt: skip
    """Every (messages, tools, tool_choice), at most `concurrency` in flight; replies in order
    and the wall time of the whole set."""
    gate = asyncio.Semaphore(concurrency)

    async def one(messages: Any, tools: Any, choice: Any) -> Reply:
        async with gate:
            return await ask(api, model, messages, tools, choice, max_tokens)

    started = time.perf_counter()
    replies = await asyncio.gather(*(one(m, t, c) for m, t, c in requests))
    return list(replies), time.perf_counter() - started
