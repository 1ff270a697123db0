"""VllmEngine's pieces that need no model: output mapping, arguments, environment, the adapter."""

from __future__ import annotations

import pickle
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import pytest

from callgate.constraints import ConstraintRef
from callgate.decoding.processor import row_spec
from callgate.errors import InvalidRequestError
from callgate.serving.engines import vllm_engine
from callgate.serving.engines.engine import EngineConfig, GenerationRequest, SamplingParams, TokenDelta
from tests.harness import CountingTokenizer


@dataclass
class FakeCompletion:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop string or stop token id that ended it


@dataclass
class FakeRequestOutput:
    outputs: list[FakeCompletion]
    finished: bool = False
    num_cached_tokens: int | None = None


@dataclass
class FakeStream:
    items: list[FakeRequestOutput]
    closed: bool = False
    consumed: int = field(default=0)

    async def run(self) -> AsyncGenerator[FakeRequestOutput, None]:
        try:
            for item in self.items:
                self.consumed += 1
                yield item
        finally:
            self.closed = True


async def deltas(items: list[FakeRequestOutput], n_prompt: int = 7) -> list[TokenDelta]:
    return [d async for d in vllm_engine._deltas(FakeStream(items).run(), n_prompt)]


async def test_delta_outputs_become_token_deltas_with_cumulative_counts() -> None:
    out = await deltas(
        [
            FakeRequestOutput([FakeCompletion("Hel", [1, 2])], num_cached_tokens=0),
            FakeRequestOutput([FakeCompletion("lo", [3])], num_cached_tokens=0),
            FakeRequestOutput([FakeCompletion("", [9], "stop")], finished=True, num_cached_tokens=None),
        ]
    )
    assert [d.text for d in out] == ["Hel", "lo", ""]
    assert [d.completion_tokens for d in out] == [2, 3, 4]
    assert [d.finish_reason for d in out] == [None, None, "stop"]
    assert out[-1].token_ids == (9,)
    assert all(d.prompt_tokens == 7 for d in out)
    assert out[-1].cached_tokens == 0
    assert out[-1].stop_string is None  # ended by EOS


async def test_the_stop_string_that_ended_the_output_is_carried() -> None:
    by_string = await deltas([FakeRequestOutput([FakeCompletion("Hi", [1], "stop", "END")], finished=True)])
    by_token = await deltas([FakeRequestOutput([FakeCompletion("Hi", [1], "stop", 42)], finished=True)])
    assert (by_string[-1].stop_string, by_token[-1].stop_string) == ("END", None)


async def test_cached_tokens_are_reported() -> None:
    out = await deltas([FakeRequestOutput([FakeCompletion("x", [1], "length")], True, num_cached_tokens=128)])
    assert out[-1].cached_tokens == 128
    assert out[-1].finish_reason == "length"


async def test_a_stream_cut_short_ends_with_abort() -> None:
    out = await deltas([FakeRequestOutput([FakeCompletion("x", [1])])])
    assert [d.finish_reason for d in out] == [None, "abort"]


async def test_nothing_is_read_after_the_finished_output() -> None:
    stream = FakeStream(
        [
            FakeRequestOutput([FakeCompletion("a", [1], "stop")], finished=True),
            FakeRequestOutput([FakeCompletion("b", [2])]),
        ]
    )
    out = [d async for d in vllm_engine._deltas(stream.run(), 1)]
    assert [d.text for d in out] == ["a"]
    assert stream.consumed == 1


class PlainRef:
    key = "k"
    grammar = "start: /a+/"


def test_constraint_args_carry_every_field_of_the_ref() -> None:
    ref = ConstraintRef("k", "start: /a+/", "start: /a+/", "auto", "<tool_call>")
    assert vllm_engine.constraint_args(ref) == {
        "key": "k",
        "grammar": "start: /a+/",
        "plain": "start: /a+/",
        "mode": "auto",
        "trigger": "<tool_call>",
        "budget_closing": True,
    }
    assert vllm_engine.constraint_args(PlainRef()) == {"key": "k", "grammar": "start: /a+/"}  # type: ignore[arg-type]
    spec = row_spec({"callgate": vllm_engine.constraint_args(ref)})  # what the processor reads back
    assert spec is not None and (spec.key, spec.grammar, spec.trigger, spec.needs_call) == (
        "k",
        "start: /a+/",
        "<tool_call>",
        False,
    )


def test_engine_arguments_pass_config_through() -> None:
    config = EngineConfig(
        model="/m", served_model_name="smol", max_model_len=1024, tensor_parallel_size=2, pipeline_parallel_size=3
    )
    args = vllm_engine.engine_arguments(config)
    assert args["model"] == args["tokenizer"] == "/m"
    assert args["enable_prefix_caching"] is True
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"], args["max_model_len"]) == (2, 3, 1024)


def test_environment_from_config() -> None:
    env = vllm_engine.environment(EngineConfig(model="/m", served_model_name="m", kv_cache_space_gib=2, cpu_threads=4))
    assert env == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": "4",
    }
    assert "OMP_NUM_THREADS" not in vllm_engine.environment(EngineConfig(model="/m", served_model_name="m"))


@pytest.mark.slow
def test_logits_processor_adapter_is_a_vllm_processor_and_pickles_by_name() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.sample.logits_processor import LogitsProcessor

    from callgate.decoding.processor import ConstrainedBatch

    cls: Any = vllm_engine.CallgateLogitsProcessor
    assert issubclass(cls, LogitsProcessor) and issubclass(cls, ConstrainedBatch)
    assert pickle.loads(pickle.dumps(cls)) is cls  # vLLM's engine core process finds it by name
    assert vllm_engine.logits_processor_classes() == [cls]


def test_unknown_module_attribute_raises() -> None:
    with pytest.raises(AttributeError):
        vllm_engine.NoSuchThing  # noqa: B018


@dataclass
class FakeLLM:
    prompts: list[Any] = field(default_factory=list)

    def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncGenerator[FakeRequestOutput, None]:
        self.prompts.append(prompt)
        return FakeStream([FakeRequestOutput([FakeCompletion("x", [1], "stop")], finished=True)]).run()


async def test_ids_the_caller_tokenised_are_used_as_given() -> None:
    """chat tokenises its prompt for the context check and hands the ids over: no second encode."""
    pytest.importorskip("vllm")
    tok, llm = CountingTokenizer(), FakeLLM()
    engine = vllm_engine.VllmEngine(llm, tok, EngineConfig(model="/m", served_model_name="m", max_model_len=64))
    req = GenerationRequest("a", "hello", SamplingParams(4), prompt_ids=(7, 8, 9))
    [d async for d in engine.generate(req)]
    assert tok.encoded == [] and llm.prompts[0]["prompt_token_ids"] == [7, 8, 9]


async def test_prompt_refused_by_its_length_untokenised_and_tokenised_off_the_loop() -> None:
    """Quick heads reach the engine with no context check of their own."""
    pytest.importorskip("vllm")
    tok, llm = CountingTokenizer(), FakeLLM()
    engine = vllm_engine.VllmEngine(llm, tok, EngineConfig(model="/m", served_model_name="m", max_model_len=64))
    most = 63 * max(len(s) for s in tok.specials)  # the most text 63 of the fake's tokens can hold
    with pytest.raises(InvalidRequestError) as info:
        [d async for d in engine.generate(GenerationRequest("a", "x" * (most + 1), SamplingParams(4)))]
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "messages")
    assert tok.encoded == [] and llm.prompts == []
    out = [d async for d in engine.generate(GenerationRequest("b", "x" * 10, SamplingParams(4)))]
    assert [d.text for d in out] == ["x"] and tok.encoded == [(10, False)]
    with pytest.raises(InvalidRequestError) as info:  # under the length bound, over the context by its count
        [d async for d in engine.generate(GenerationRequest("c", "x" * 64, SamplingParams(4)))]
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "messages")
    assert tok.encoded[-1] == (64, False) and len(llm.prompts) == 1
