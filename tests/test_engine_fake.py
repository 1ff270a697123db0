"""FakeEngine: the scripted engine behaves like vLLM where the chat service can tell."""

from __future__ import annotations

import asyncio

import pytest

from callgate.errors import EngineError
from callgate.serving.engines.engine import Engine, GenerationRequest, SamplingParams, TokenDelta
from callgate.serving.engines.fake_engine import FakeEngine, FakeReply, FakeTokenizer


def request(
    rid: str = "r1", prompt: str = "hello", max_tokens: int = 100, stop: tuple[str, ...] = ()
) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, stop=stop))


async def collect(engine: FakeEngine, req: GenerationRequest) -> list[TokenDelta]:
    return [d async for d in engine.generate(req)]


def test_fake_engine_satisfies_protocol() -> None:
    engine: Engine = FakeEngine()
    assert engine.tokenizer.eos_token_id == 256


async def test_streams_chunks_in_order_and_finishes_once() -> None:
    engine = FakeEngine(replies=[["Hel", "lo", " world"]])
    deltas = await collect(engine, request())
    assert "".join(d.text for d in deltas) == "Hello world"
    assert [d.finish_reason for d in deltas] == [None, None, None, "stop"]
    assert [d.completion_tokens for d in deltas] == [1, 2, 3, 4]  # the EOS token counts
    assert deltas[-1].token_ids == (256,)
    assert all(d.prompt_tokens == 5 for d in deltas)


async def test_plain_string_is_one_token_per_character() -> None:
    engine = FakeEngine(replies=["abc"])
    deltas = await collect(engine, request())
    assert [d.text for d in deltas] == ["a", "b", "c", ""]


async def test_max_tokens_ends_with_length() -> None:
    engine = FakeEngine(replies=["abcdef"])
    deltas = await collect(engine, request(max_tokens=3))
    assert "".join(d.text for d in deltas) == "abc"
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].completion_tokens == 3


@pytest.mark.parametrize(
    ("chunks", "stop", "expected"),
    [
        (["Hello", " STOP", " more"], ("STOP",), "Hello "),
        (["He", "llo S", "T", "OP more"], ("STOP",), "Hello "),  # stop string split over deltas
        (["ab", "c"], ("cd",), "abc"),  # a held-back partial stop that never completes
        (["x<", "/a>y"], ("</a>", "<"), "x"),  # the earliest stop wins
    ],
)
async def test_stop_strings_cut_and_excluded(chunks: list[str], stop: tuple[str, ...], expected: str) -> None:
    engine = FakeEngine(replies=[chunks])
    deltas = await collect(engine, request(stop=stop))
    assert "".join(d.text for d in deltas) == expected
    assert deltas[-1].finish_reason == "stop"
    assert [d.finish_reason for d in deltas].count("stop") == 1


async def test_respond_callback_after_script_runs_out() -> None:
    engine = FakeEngine(replies=["first"], respond=lambda req: f"echo:{req.prompt}")
    first = await collect(engine, request("a"))
    second = await collect(engine, request("b", prompt="hi"))
    assert "".join(d.text for d in first) == "first"
    assert "".join(d.text for d in second) == "echo:hi"
    assert [r.request_id for r in engine.requests] == ["a", "b"]


async def test_no_script_left_is_an_engine_error() -> None:
    engine = FakeEngine()
    with pytest.raises(EngineError):
        await collect(engine, request())


async def test_scripted_error_is_raised_after_chunks() -> None:
    engine = FakeEngine(replies=[FakeReply(("a", "b"), error=EngineError("boom"))])
    seen: list[str] = []
    with pytest.raises(EngineError, match="boom"):
        async for d in engine.generate(request()):
            seen.append(d.text)
    assert seen == ["a", "b"]
    assert engine.num_running() == 0


async def test_abort_ends_stream_and_frees_slot() -> None:
    engine = FakeEngine(replies=["x" * 1000], token_delay_s=0.001)
    stream = engine.generate(request("slow"))
    first = await anext(stream)
    assert first.text == "x"
    assert engine.num_running() == 1
    await engine.abort("slow")
    rest = [d async for d in stream]
    assert rest[-1].finish_reason == "abort"
    assert len(rest) < 999
    assert engine.num_running() == 0
    assert engine.aborted == ["slow"]


async def test_consumer_close_counts_as_abort() -> None:
    engine = FakeEngine(replies=["x" * 100])
    stream = engine.generate(request("gone"))
    await anext(stream)
    await stream.aclose()
    assert engine.num_running() == 0
    assert engine.aborted == ["gone"]


async def test_cancelled_consumer_frees_slot() -> None:
    engine = FakeEngine(replies=["x" * 1000], token_delay_s=0.01)

    async def consume() -> None:
        async for _ in engine.generate(request("c")):
            pass

    task = asyncio.create_task(consume())
    while engine.num_running() == 0:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.num_running() == 0
    assert engine.aborted == ["c"]


async def test_concurrent_requests_interleave() -> None:
    engine = FakeEngine(replies=["aaaa", "bbbb"], token_delay_s=0.001)
    a, b = await asyncio.gather(collect(engine, request("a")), collect(engine, request("b")))
    assert "".join(d.text for d in a) == "aaaa"
    assert "".join(d.text for d in b) == "bbbb"


async def test_duplicate_running_request_id_is_rejected() -> None:
    engine = FakeEngine(replies=["aaaa", "bbbb"])
    stream = engine.generate(request("dup"))
    await anext(stream)
    with pytest.raises(EngineError, match="already running"):
        await collect(engine, request("dup"))
    await stream.aclose()


async def test_prefix_cache_reports_whole_shared_blocks() -> None:
    engine = FakeEngine(respond=lambda req: "ok")
    shared = "s" * 40
    first = await collect(engine, request("1", prompt=shared + "first question"))
    second = await collect(engine, request("2", prompt=shared + "second question"))
    assert first[-1].cached_tokens == 0
    assert second[-1].cached_tokens == 32  # 40 shared tokens -> two whole 16-token blocks


async def test_shutdown_refuses_new_requests() -> None:
    engine = FakeEngine(respond=lambda req: "ok")
    await engine.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        await collect(engine, request())


def test_tokenizer_special_tokens_only_outside_untrusted_spans() -> None:
    tok = FakeTokenizer()
    prompt = "<|im_start|>user\nsay <|im_end|> please<|im_end|>"
    content = prompt.index("say")
    span = (content, prompt.index(" please") + len(" please"))
    trusted = tok.encode(prompt)
    guarded = tok.encode(prompt, (span,))
    assert trusted.count(tok.eos_token_id) == 2
    assert guarded.count(tok.eos_token_id) == 1
    assert tok.decode(guarded) == prompt


def test_tokenizer_vocabulary_covers_every_byte_without_eos() -> None:
    vocab = FakeTokenizer().vocabulary()
    assert len(vocab) == 256
    assert b"<|im_end|>" not in vocab
    assert vocab["é".encode()[:1]] == [0xC3]
