"""Sampling parameters beyond temperature/top_p through the real app (FakeEngine, hermes):
presence/frequency/repetition penalties, top_k, min_p and logit_bias reach the engine's
`SamplingParams`, bad values are 400s naming the field, logprobs are refused rather than
ignored; and vllm_engine turns them into vLLM's `SamplingParams`, whose logit bias the
grammar mask still overrides."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from callgate.serving.engines import vllm_engine
from callgate.serving.engines.engine import EngineConfig, GenerationRequest, SamplingParams
from tests import test_server_app
from tests.harness import CountingTokenizer
from tests.test_server_app import ASK, MODEL

make_harness = test_server_app.make_harness  # the app harness fixture

VOCAB = 259  # FakeTokenizer: 256 bytes and 3 special tokens


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASK, "max_tokens": 16, **kw}


# ---- the parameters arrive ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_sampling_parameters_reach_the_engine(make_harness: Any, stream: bool) -> None:
    h = make_harness([["Oslo ", "is ", "cold."]])
    sent = body(
        presence_penalty=0.5,
        frequency_penalty=-1.5,
        repetition_penalty=1.1,
        top_k=40,
        min_p=0.05,
        logit_bias={"65": -100, "258": 5, "0": 100},
        stream=stream,
    )
    resp = await h.post(sent)
    assert resp.status_code == 200, resp.text
    [s] = h.engine.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -1.5, 1.1)
    assert (s.top_k, s.min_p) == (40, 0.05)
    assert s.logit_bias == {65: -100.0, 258: 5.0, 0: 100.0}


async def test_defaults_are_vllms_neutral_values(make_harness: Any) -> None:
    h = make_harness(["ok", "ok"])
    assert (await h.post(body())).status_code == 200
    assert (await h.post(body(top_k=-1, logit_bias={}, presence_penalty=None))).status_code == 200
    for s in h.engine.sampling:
        assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.0, 0.0, 1.0)
        assert (s.top_k, s.min_p, s.logit_bias) == (0, 0.0, None)


# ---- bad values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"presence_penalty": -2.01}, "presence_penalty"),
        ({"presence_penalty": "1"}, "presence_penalty"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"logit_bias": {"5": "1"}}, "logit_bias.5"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"logit_bias": {"hello": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"007": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 1, str(VOCAB): 1}}, "logit_bias"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
)
async def test_bad_sampling_values_are_400_naming_the_field(
    make_harness: Any, fields: dict[str, Any], param: str
) -> None:
    h = make_harness()
    for stream in (False, True):
        resp = await h.post(body(**fields, stream=stream))
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_value"
        assert err["param"] == param and param in err["message"]
    assert h.engine.requests == []


async def test_out_of_vocabulary_ids_are_named(make_harness: Any) -> None:
    h = make_harness(["ok"])
    resp = await h.post(body(logit_bias={str(VOCAB - 1): 1, str(VOCAB): 1, "100000": -1}))
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert f"{VOCAB}, 100000" in message and f"{VOCAB - 1}," not in message
    assert (await h.post(body(logit_bias={str(VOCAB - 1): 1}))).status_code == 200  # the last id is in


# ---- logprobs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 5}, "logprobs"),
        ({"top_logprobs": 0}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ],
)
async def test_logprobs_are_refused_not_ignored(make_harness: Any, fields: dict[str, Any], param: str) -> None:
    h = make_harness()
    resp = await h.post(body(**fields))
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", param)
    assert "not returned by callgate" in err["message"]
    assert h.engine.requests == []


async def test_logprobs_off_as_clients_send_it_is_accepted(make_harness: Any) -> None:
    h = make_harness(["ok", "ok", "ok"])
    for fields in ({"logprobs": False}, {"logprobs": None, "top_logprobs": None}, {"logprobs": False, "n": 1}):
        assert (await h.post(body(**fields))).status_code == 200
    resp = await h.post(body(logprobs="yes"))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "logprobs"


# ---- vllm_engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    key: str = "k"
    grammar: str = "start: /a+/"


def test_sampling_arguments_carry_every_parameter() -> None:
    s = SamplingParams(
        50,
        0.7,
        0.9,
        3,
        ("END",),
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        top_k=20,
        min_p=0.1,
        logit_bias={7: -100.0},
    )
    args = vllm_engine.sampling_arguments(s, 30, Ref())
    assert args == {
        "n": 1,
        "max_tokens": 30,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.2,
        "logit_bias": {7: -100.0},
        "seed": 3,
        "stop": ["END"],
        "ignore_eos": False,
        "extra_args": {"callgate": {"key": "k", "grammar": "start: /a+/", "request_id": ""}},
    }
    plain = vllm_engine.sampling_arguments(SamplingParams(8), 100, None)
    assert (plain["logit_bias"], plain["stop"], plain["extra_args"], plain["top_k"]) == (None, None, None, 0)
    assert vllm_engine.sampling_arguments(SamplingParams(8, ignore_eos=True), 100, None)["ignore_eos"] is True


@dataclass
class CapturingLLM:
    params: list[Any] = field(default_factory=list)

    def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncGenerator[Any, None]:
        self.params.append(params)

        async def empty() -> AsyncGenerator[Any, None]:
            return
            yield

        return empty()


async def test_vllm_sampling_params_get_the_request_values() -> None:
    """The keywords are vLLM 0.32's own: its SamplingParams is built (and validated) from them."""
    pytest.importorskip("vllm")
    llm = CapturingLLM()
    engine = vllm_engine.VllmEngine(llm, CountingTokenizer(), EngineConfig(model="/m", served_model_name="m"))
    s = SamplingParams(
        8,
        0.5,
        presence_penalty=1.0,
        frequency_penalty=0.25,
        repetition_penalty=1.3,
        top_k=5,
        min_p=0.2,
        logit_bias={3: -100.0, 4: 2.5},
    )
    [d async for d in engine.generate(GenerationRequest("a", "hi", s, prompt_ids=(1, 2)))]
    [p] = llm.params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (1.0, 0.25, 1.3)
    assert (p.top_k, p.min_p, p.logit_bias, p.max_tokens) == (5, 0.2, {3: -100.0, 4: 2.5}, 8)


@pytest.mark.slow
def test_a_biased_token_the_grammar_forbids_stays_forbidden() -> None:
    """vLLM's own processor list (built-ins first, then callgate's) on one constrained row:
    +100 on a forbidden token leaves it -inf; -100 on an allowed one leaves it allowed."""
    pytest.importorskip("vllm")
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, build_logitsprocs

    from tests.test_decoding_processor import WIDTH, ByteBatch, lark

    class ByteVllmBatch(ByteBatch, LogitsProcessor):
        pass

    config = SimpleNamespace(speculative_config=None, scheduler_config=SimpleNamespace(max_num_seqs=4))
    procs = build_logitsprocs(config, torch.device("cpu"), False, False, [ByteVllmBatch])  # type: ignore[arg-type]
    order = [type(p).__name__ for p in procs.non_argmax_invariant]
    assert order.index("LogitBiasLogitsProcessor") < order.index("ByteVllmBatch")
    a, b, c = ord("a"), ord("b"), ord("c")
    params = VllmSamplingParams(
        max_tokens=8, logit_bias={a: -100.0, c: 100.0}, extra_args={"callgate": lark("/ab*/", "ab")}
    )
    update = BatchUpdate(batch_size=1, removed=[], added=[(0, params, [], [])], moved=[])
    for p in procs.all:
        p.update_state(update)
    logits = torch.zeros(1, WIDTH)
    for p in procs.non_argmax_invariant:  # as vLLM's Sampler.apply_logits_processors runs them
        logits = p.apply(logits)
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == {a}  # the grammar's first byte
    assert logits[0, a] == -100.0  # "a", biased -100: still allowed, the bias applied
    assert logits[0, c] == float("-inf")  # "c", biased +100, forbidden by the grammar
    assert logits[0, b] == float("-inf")
