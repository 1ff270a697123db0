"""`POST /v1/completions` with the official `openai` client (`client.completions.create`)
against a real uvicorn server backed by a scripted FakeEngine: the prompt forms reach the
engine as written, answers and streams, the refused parameters and limits, admission shared
with chat completions, auth, metrics and disconnects."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from callgate.errors import EngineError
from callgate.serving.engines.engine import GenerationRequest
from callgate.serving.engines.fake_engine import FakeReply, FakeTokenizer
from callgate.serving.settings import Limits
from tests import test_server_openai
from tests.test_server_app import MODEL
from tests.test_server_openai import Server, _wait_for

serve = test_server_openai.serve  # the real-server fixture

# A prompt with its chat template already applied, as BFCL's self-hosted handlers send it.
PROMPT = "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n"
IDS = FakeTokenizer().encode(PROMPT)


def test_every_prompt_form_reaches_the_engine_as_written(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["It ", "is ", "cold."])
    client = server.client()
    assert IDS.count(257) == 2 and IDS.count(256) == 1  # special-token text is the special token
    for prompt in (PROMPT, [PROMPT], IDS, [IDS]):
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0, top_p=0.5, seed=3)
        assert done.object == "text_completion" and done.id.startswith("cmpl-") and done.model == MODEL
        [choice] = done.choices
        assert (choice.index, choice.text, choice.finish_reason, choice.logprobs) == (0, "It is cold.", "stop", None)
        assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(IDS), 4)
        sent = server.engine.requests[-1]
        assert sent.prompt_ids == tuple(IDS) and sent.prompt == PROMPT and sent.constraint is None
        s = sent.sampling
        assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.stop, s.ignore_eos) == (7, 0.0, 0.5, 3, (), False)
    assert len(server.engine.requests) == 4 and server.in_flight() == 0
    vllm_extras = {"top_k": 5, "min_p": 0.2, "repetition_penalty": 1.1, "ignore_eos": True}
    client.completions.create(model=MODEL, prompt=PROMPT, presence_penalty=0.5, extra_body=vllm_extras)
    s = server.engine.sampling[-1]
    assert (s.top_k, s.min_p, s.repetition_penalty, s.ignore_eos, s.presence_penalty) == (5, 0.2, 1.1, True, 0.5)


def test_defaults_stop_and_length(serve: Callable[..., Server]) -> None:
    server = serve(
        respond=lambda req: "one two END three four", max_model_len=512, limits=Limits(default_max_tokens=64)
    )
    client = server.client()
    plain = client.completions.create(model=MODEL, prompt="Count:")
    assert plain.choices[0].text == "one two END three four" and server.engine.sampling[-1].max_tokens == 64
    assert server.engine.sampling[-1].temperature == 1.0  # OpenAI's default, as chat's
    stopped = client.completions.create(model=MODEL, prompt="Count:", stop="END")
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == ("one two ", "stop")
    cut = client.completions.create(model=MODEL, prompt="Count:", max_tokens=5)
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("one t", "length")
    short = serve(respond=lambda req: "x" * 600, max_model_len=512).client()
    filled = short.completions.create(model=MODEL, prompt="abc")  # no max_tokens: what the context leaves
    assert filled.choices[0].finish_reason == "length" and filled.usage is not None
    assert filled.usage.prompt_tokens + filled.usage.completion_tokens == 512


def test_streamed_answer_equals_the_whole_one(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["Oslo ", "", "is ", "cold", "."])
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt=PROMPT)
    parts = list(
        client.completions.create(model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True})
    )
    assert all(p.object == "text_completion" and p.id == parts[0].id for p in parts)
    assert parts[0].id.startswith("cmpl-") and parts[0].id != whole.id
    text = "".join(c.text for p in parts for c in p.choices)
    assert text == whole.choices[0].text == "Oslo is cold."
    assert [c.finish_reason for p in parts for c in p.choices if c.finish_reason] == ["stop"]
    usage, whole_usage = parts[-1].usage, whole.usage
    assert parts[-1].choices == [] and usage is not None and whole_usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        whole_usage.prompt_tokens,
        whole_usage.completion_tokens,
        whole_usage.total_tokens,
    )
    assert (
        usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 32
    )  # the fake's cache
    raw = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "stream": True}, timeout=10)
    lines = [ln for ln in raw.text.split("\n") if ln.startswith("data: ")]
    assert raw.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"
    assert all("usage" not in json.loads(ln[6:]) for ln in lines[:-1])  # usage only when asked for


def test_refused_parameters_and_limits(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: "ok", max_model_len=64, limits=Limits(max_body_bytes=20_000, max_tokens=100))
    client = server.client()
    vocab = FakeTokenizer().vocab_size
    bad: list[tuple[dict[str, Any], str | None, str | None]] = [
        ({"prompt": PROMPT, "echo": True}, "echo", "unsupported_parameter"),
        ({"prompt": PROMPT, "n": 2}, "n", "unsupported_parameter"),
        ({"prompt": PROMPT, "best_of": 3}, "best_of", "unsupported_parameter"),
        ({"prompt": PROMPT, "logprobs": 1}, "logprobs", "unsupported_parameter"),
        ({"prompt": PROMPT, "suffix": "end"}, "suffix", "unsupported_parameter"),
        ({"prompt": ["one", "two"]}, "prompt", "unsupported_parameter"),
        ({"prompt": [[1, 2], [3]]}, "prompt", "unsupported_parameter"),
        ({"prompt": ""}, "prompt", None),
        ({"prompt": []}, "prompt", None),
        ({"prompt": [[]]}, "prompt[0]", None),
        ({"prompt": [1, vocab, vocab + 7]}, "prompt", "invalid_value"),
        ({"prompt": [1, -2]}, None, "invalid_value"),
        ({"prompt": [1, True]}, None, "invalid_value"),
        ({"prompt": "x" * 80}, "prompt", "context_length_exceeded"),
        ({"prompt": list(range(64))}, "prompt", "context_length_exceeded"),
        ({"prompt": "abc", "max_tokens": 62}, "max_tokens", "context_length_exceeded"),
        ({"prompt": "abc", "max_tokens": 101}, "max_tokens", None),
        ({"prompt": "abc", "temperature": 3}, "temperature", "invalid_value"),
        ({"prompt": "abc", "logit_bias": {str(vocab): 5}}, "logit_bias", "invalid_value"),
        ({"prompt": "abc", "stop": [""]}, "stop", None),
    ]
    for body, param, code in bad:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, **body)
        err = info.value.body
        assert isinstance(err, dict) and err["type"] == "invalid_request_error" and err["message"], body
        assert (param is None or err["param"] == param) and (code is None or err["code"] == code), (body, err)
        assert info.value.response.headers["x-should-retry"] == "false"
    missing = httpx.post(server.url + "/v1/completions", json={"model": MODEL}, timeout=10)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"
    with pytest.raises(openai.APIStatusError) as big:
        client.completions.create(model=MODEL, prompt="x" * 30_000)
    assert big.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other-model", prompt="abc")
    assert server.engine.requests == [] and server.in_flight() == 0
    ok = client.completions.create(model=MODEL, prompt=[1, vocab - 1], max_tokens=61)  # the edges fit
    assert ok.choices[0].text == "ok"


def test_auth_metrics_and_shared_admission(serve: Callable[..., Server]) -> None:
    slow = FakeReply(tuple("slow " * 200), token_delay_s=0.01)
    server = serve(
        respond=lambda req: slow if "hold" in req.prompt else "ok", api_key="k-1", max_num_seqs=1, max_queue=1
    )
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").completions.create(model=MODEL, prompt="abc")
    client = server.client("k-1")
    held = [
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hold"}], stream=True),
        client.completions.create(model=MODEL, prompt="hold", stream=True),
    ]
    with pytest.raises(openai.RateLimitError) as full:
        client.completions.create(model=MODEL, prompt="abc")
    assert full.value.response.headers["retry-after"] == "1"
    for stream in held:
        stream.close()
    _wait_for(lambda: server.in_flight() == 0)
    assert client.completions.create(model=MODEL, prompt="abc").choices[0].text == "ok"
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer k-1"}, timeout=5).text
    counts = dict(
        re.findall(r'^callgate_requests_total\{route="/v1/completions",status="(\d+)"\} (\S+)$', metrics, re.M)
    )
    assert counts == {"200": "2.0", "401": "1.0", "429": "1.0"}  # the held stream's 200 too
    assert re.search(r"^callgate_completion_tokens_total [1-9]", metrics, re.M)


def test_disconnects_abort_the_generation(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: FakeReply(tuple("word " * 400), token_delay_s=0.01), max_num_seqs=1, max_queue=0)
    stream = server.client().completions.create(model=MODEL, prompt="go", stream=True)
    first = next(iter(stream))
    assert first.choices[0].text and server.in_flight() == 1
    stream.close()
    _wait_for(lambda: server.in_flight() == 0 and len(server.engine.aborted) == 1)
    with httpx.Client(timeout=30) as http, pytest.raises(httpx.ReadTimeout):
        http.post(server.url + "/v1/completions", json={"prompt": "go"}, timeout=0.3)
    _wait_for(lambda: server.in_flight() == 0 and len(server.engine.aborted) == 2)
    assert server.engine.num_running() == 0 and server.engine.aborted[0].startswith("cmpl-")


def test_engine_failures_are_clear_errors(serve: Callable[..., Server]) -> None:
    def respond(req: GenerationRequest) -> FakeReply:
        return FakeReply(("par", "tial"), error=EngineError("engine died"))

    server = serve(respond=respond)
    client = server.client()
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL, prompt="abc")
    assert info.value.status_code == 500 and "x-should-retry" not in info.value.response.headers
    with pytest.raises(openai.APIError) as streamed:
        list(client.completions.create(model=MODEL, prompt="abc", stream=True))
    assert isinstance(streamed.value.body, dict) and streamed.value.body["message"] == "engine died"
    assert server.in_flight() == 0 and server.engine.num_running() == 0
