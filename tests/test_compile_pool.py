"""Grammar compiles that overrun their time limit do not break other requests.

The compile pool's rules (compile_pool.py), the size refusal before an Index is built
(index_size.py), the memory cache's byte bound (cache.py), and the HTTP mapping of a busy
pool (503). Compiles are real outlines-core compiles; an overrun is a compile held on a
threading.Event, released at the end of each test.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import callgate.constraints as constraints
from callgate.constraints import cache, index_size
from callgate.constraints.cache import IndexCache, TokenVocabulary
from callgate.constraints.compile_pool import CompilePool
from callgate.errors import CompilerBusyError, SchemaTooComplexError
from tests import test_server_app
from tests.test_agreement import SmolTokenizer, _smol
from tests.test_server_app import ASK, Limits, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture
VOCAB = constraints.token_vocabulary({bytes([b]): [b] for b in range(256)}, eos_token_id=256)


def tool(name: str, optional: int = 1) -> dict[str, Any]:
    props = {f"p{k}": {"type": "string"} for k in range(optional)}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


@dataclass
class Held:
    """Compiles (or byte passes) of the grammars naming `held_names` wait on `release`."""

    release: threading.Event = field(default_factory=threading.Event)
    held_names: set[str] = field(default_factory=set)
    compiled: list[str] = field(default_factory=list)

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def held(regex: str, *rest: Any) -> Any:
            if any(name in regex for name in self.held_names):
                self.release.wait(30)
            self.compiled.append(regex)
            return real(regex, *rest)

        return held


@pytest.fixture
async def held(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Held]:
    """A fresh pool and memory cache; compiles of held grammars wait until the test ends."""
    h = Held()
    pool = CompilePool(workers=2)
    fresh = IndexCache(disk=None)
    monkeypatch.setattr(constraints, "_POOL", pool)
    monkeypatch.setattr(constraints, "CACHE", fresh)
    monkeypatch.setattr(cache, "CACHE", fresh)
    monkeypatch.setattr(cache, "compile_index", h.wrap(cache.compile_index))
    yield h
    h.release.set()
    await drained()  # the workers end before the loop closes
    assert pool.busy == 0 and pool.waiting == 0


async def drained() -> None:
    for _ in range(3000):
        if constraints._POOL.busy == 0:
            await asyncio.sleep(0.05)  # the loop runs the callbacks the last results scheduled
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the compile pool did not drain")


async def build(t: dict[str, Any] | None, timeout_s: float = 30.0, vocab: TokenVocabulary = VOCAB) -> Any:
    tools = [t] if t is not None else None
    choice = "required" if t is not None else None
    return await constraints.build_async("hermes", tools, choice, True, None, vocab, timeout_s=timeout_s)


async def overrun(held: Held, *names: str) -> None:
    """Fill the pool with compiles that overran their time limit (their requests got 400)."""
    held.held_names.update(names)
    for name in names:
        with pytest.raises(SchemaTooComplexError, match=r"within 0\.05 s"):
            await build(tool(name), timeout_s=0.05)


async def test_plain_and_cached_requests_never_wait_for_overrunning_compiles(held: Held) -> None:
    cached = await build(tool("cached"))
    await overrun(held, "wide_a", "wide_b")
    assert constraints._POOL.busy == 2  # both workers still compile
    assert await build(None, timeout_s=0.05) is None
    again = await build(tool("cached"), timeout_s=0.05)
    assert again is not None and again.index is cached.index


async def test_a_request_queued_behind_overruns_is_told_the_server_is_busy(held: Held) -> None:
    await overrun(held, "wide_a", "wide_b")
    with pytest.raises(CompilerBusyError) as err:
        await build(tool("queued"), timeout_s=0.05)
    assert (err.value.status, err.value.error_type, err.value.code) == (503, "server_error", "grammar_compiler_busy")
    assert constraints._POOL.busy == 2  # the queued compile nobody awaits was dropped
    held.release.set()
    assert (await build(tool("queued"))) is not None  # a retry once a worker is free compiles


async def test_an_overrun_lands_in_the_cache_and_a_retry_shares_it(held: Held) -> None:
    await overrun(held, "wide_a")
    retry = asyncio.ensure_future(build(tool("wide_a")))
    for _ in range(3000):  # until the retry has joined the running compile
        if constraints._POOL.waiting == 1 or retry.done():
            break
        await asyncio.sleep(0.01)
    assert constraints._POOL.busy == 1
    held.release.set()
    found = await retry
    assert found is not None and held.compiled.count(found.regex) == 1  # one compile for both requests


async def test_a_compile_every_request_gave_up_on_stops_before_its_index(
    held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_size, "byte_states", held.wrap(index_size.byte_states))
    held.held_names.add("given_up")
    with pytest.raises(SchemaTooComplexError):
        await build(tool("given_up"), timeout_s=0.05)
    held.release.set()
    await drained()
    assert len(held.compiled) == 1 and len(constraints.CACHE) == 0  # the byte pass ran, no Index


# ---- the size refusal, on SmolLM2's real vocabulary ----------------------------------------------


@pytest.fixture(scope="module")
def smol() -> SmolTokenizer:
    return _smol()


def test_an_index_too_large_is_refused_before_it_is_built(smol: SmolTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(regex: str, vocabulary: TokenVocabulary) -> Any:
        raise AssertionError("the Index was compiled")

    monkeypatch.setattr(cache, "compile_index", never)
    # 30 optional strings: ~30 000 byte states; over 49k tokens an Index of ~15 s and GBs (QA's case is 45)
    with pytest.raises(SchemaTooComplexError, match=r"grammar of \d+ states, too large") as err:
        constraints.build("hermes", [tool("wide", 30)], "required", True, None, smol.vocab)
    assert err.value.param == "tools" and err.value.code == "schema_too_complex"


def test_an_ordinary_tool_compiles_over_the_real_vocabulary(smol: SmolTokenizer) -> None:
    c = constraints.build("hermes", [tool("narrow", 2)], "required", True, None, smol.vocab)
    assert c is not None and c.index is not None
    assert index_size.byte_states(c.regex) * smol.vocab.size <= index_size.MAX_INDEX_CELLS


# ---- the memory cache's byte bound -----------------------------------------------------------


def test_the_memory_cache_is_bounded_in_bytes() -> None:
    regexes = ["a{1,40}", "b{1,40}", "c{1,40}"]
    size = len(cache.index_bytes(cache.compile_index(regexes[0], VOCAB)))
    bounded = IndexCache(disk=None, max_bytes=2 * size + size // 2)
    for rx in regexes:
        bounded.get_or_compile(rx, rx, VOCAB)
    assert len(bounded) == 2 and bounded.get(regexes[0], VOCAB) is None
    assert bounded.nbytes == 2 * size <= bounded.max_bytes
    too_big = IndexCache(disk=None, max_bytes=size - 1)
    assert too_big.get_or_compile("d", "d{1,40}", VOCAB) is not None and len(too_big) == too_big.nbytes == 0


async def test_every_compile_hands_its_freed_memory_back(held: Held, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile's transient hundreds of MB (and an evicted Index) go back to the system at
    its end, also when it is refused: benchmarks/bench_compile_memory.py measures the effect."""
    trims: list[int] = []
    monkeypatch.setattr(constraints, "trim_heap", lambda: trims.append(constraints._POOL.busy))
    assert await build(tool("trimmed")) is not None
    assert trims == [1]  # in the worker, before its job ends
    monkeypatch.setattr(index_size, "MAX_INDEX_CELLS", 1)
    with pytest.raises(SchemaTooComplexError, match="too large"):
        await build(tool("refused"))
    assert trims == [1, 1]
    assert await build(tool("trimmed")) is not None and trims == [1, 1]  # a cache hit compiles nothing
    cache.trim_heap()  # the real one: glibc's malloc_trim here, a no-op elsewhere; never raises


def nested_arrays(depth: int) -> dict[str, Any]:
    """A tool whose argument nests `depth` bounded arrays: the regex doubles per level."""
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        nested = {"type": "array", "items": nested, "maxItems": 2}
    params = {"type": "object", "properties": {"x": nested}}
    return {"type": "function", "function": {"name": "deep", "parameters": params}}


@pytest.mark.parametrize("depth", [16, 40])
def test_a_grammar_doubling_per_level_is_refused_while_it_is_built(depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 levels would be 21 MB of regex and minutes of DFA building ("Failed to build DFA"
    in the end), 40 would not fit in memory: refused at the level that passes the bound."""

    def never(*args: Any) -> Any:
        raise AssertionError("compiled")

    monkeypatch.setattr(index_size, "byte_states", never)
    with pytest.raises(SchemaTooComplexError, match="makes a grammar of over") as err:
        constraints.build("hermes", [nested_arrays(depth)], "required", True, None, VOCAB)
    assert (
        err.value.code == "schema_too_complex"
        and err.value.param
        and err.value.param.startswith("tools[0].function.parameters.properties.x.")
    )


def test_a_whole_grammar_too_long_is_refused_before_its_byte_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any) -> Any:
        raise AssertionError("byte pass ran")

    monkeypatch.setattr(index_size, "MAX_GRAMMAR_CHARS", 1000)
    monkeypatch.setattr(index_size, "byte_states", never)
    with pytest.raises(SchemaTooComplexError, match="characters, too large to compile") as err:
        constraints.build("hermes", [tool("long", 8)], "required", True, None, VOCAB)
    assert err.value.param == "tools"


def test_a_grammar_outlines_cannot_build_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    """What outlines-core raises building a DFA (ValueError) is the request's 400, not a 500."""

    def fails(regex: str, *rest: Any) -> Any:
        raise ValueError("Failed to build DFA number of DFA states exceeds limit")

    monkeypatch.setattr(cache, "compile_index", fails)
    with pytest.raises(SchemaTooComplexError, match="cannot be built") as err:
        constraints.build("hermes", [tool("unbuildable")], "required", True, None, VOCAB)
    assert err.value.param == "tools" and err.value.code == "schema_too_complex"


class _Result:
    """A compile's result that a weak reference can watch."""


async def test_a_finished_compile_is_freed_without_the_cyclic_gc() -> None:
    """The pool keeps no cycle through a job's future: an Index of hundreds of MB is freed as
    soon as its requests are done with it, not at a rare gen-2 collection."""
    pool = CompilePool(workers=1)
    refs: list[weakref.ref[_Result]] = []

    def work(job: Any) -> _Result:
        job.proceed()
        made = _Result()
        refs.append(weakref.ref(made))
        return made

    gc.disable()
    try:
        got = await pool.run("slot", work, timeout_s=30, param="tools")
        assert isinstance(got, _Result) and refs[0]() is got
        del got
        await asyncio.sleep(0.05)  # the loop runs the done callbacks
        assert pool.busy == 0 and refs[0]() is None
    finally:
        gc.enable()


# ---- over HTTP ----------------------------------------------------------------------------------


async def test_http_busy_pool_is_503_and_plain_requests_still_answer(held: Held, make_harness: Any) -> None:
    h = make_harness(["Hello."], settings=make_settings(limits=Limits(grammar_timeout_s=0.05)))
    await overrun(held, "wide_a", "wide_b")
    plain = await h.post({"messages": ASK})
    assert plain.status_code == 200, plain.text
    busy = await h.post({"messages": ASK, "tools": [tool("get_time", 0)], "tool_choice": "required"})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
    assert busy.json()["error"] == {
        "message": "every grammar compile worker stayed busy for 0.05 s; retry later",
        "type": "server_error",
        "param": None,
        "code": "grammar_compiler_busy",
    }
