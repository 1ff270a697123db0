"""Grammar compiles that overrun their time limit do not break other requests.

The compile pool's rules (compile_pool.py), the grammar cache's bound, llguidance's refusal
as a 400, and the HTTP mapping of a busy pool (503). Compiles are real llguidance checks; an
overrun is a compile held on a threading.Event, released at the end of each test.
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
from callgate.constraints import LlgVocabulary
from callgate.constraints.compile_pool import CompilePool
from callgate.constraints.llg import matcher
from callgate.errors import CompilerBusyError, SchemaTooComplexError
from tests import test_server_app
from tests.llg_harness import accepts, byte_vocabulary
from tests.test_agreement import SmolTokenizer, _smol
from tests.test_server_app import ASK, Limits, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture
VOCAB = byte_vocabulary()


def tool(name: str, optional: int = 1) -> dict[str, Any]:
    props = {f"p{k}": {"type": "string"} for k in range(optional)}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


@dataclass
class Held:
    """Steps (the grammar's build or its llguidance check) of the grammars naming `held_names`
    wait on `release`; `compiled` lists what the wrapped step was given."""

    release: threading.Event = field(default_factory=threading.Event)
    held_names: set[str] = field(default_factory=set)
    compiled: list[str] = field(default_factory=list)

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def held(grammar: Any, *rest: Any) -> Any:
            text = grammar if isinstance(grammar, str) else repr(grammar)  # a GrammarRequest
            if any(name in text for name in self.held_names):
                self.release.wait(30)
            self.compiled.append(text)
            return real(grammar, *rest)

        return held


@pytest.fixture
async def held(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Held]:
    """A fresh pool and grammar cache; checks of held grammars wait until the test ends."""
    h = Held()
    pool = CompilePool(workers=2)
    monkeypatch.setattr(constraints, "_POOL", pool)
    monkeypatch.setattr(constraints, "CACHE", constraints._Cache())
    monkeypatch.setattr(constraints, "check", h.wrap(constraints.check))
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


async def build(t: dict[str, Any] | None, timeout_s: float = 30.0, vocab: LlgVocabulary = VOCAB) -> Any:
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
    assert again is not None and again is cached


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
    assert found is not None and held.compiled.count(found.grammar) == 1  # one compile for both requests


async def test_a_compile_every_request_gave_up_on_stops_before_its_check(
    held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constraints, "lark_grammar", held.wrap(constraints.lark_grammar))
    held.held_names.add("given_up")
    with pytest.raises(SchemaTooComplexError):
        await build(tool("given_up"), timeout_s=0.05)
    held.release.set()
    await drained()
    # the grammar text was built (one pass through the held builder), never checked nor cached
    assert len(held.compiled) == 1 and not constraints.CACHE.entries


# ---- on SmolLM2's real vocabulary ---------------------------------------------------------------


@pytest.fixture(scope="module")
def smol() -> SmolTokenizer:
    return _smol()


def test_a_wide_tool_compiles_over_the_real_vocabulary(smol: SmolTokenizer) -> None:
    """30 optional strings were "a grammar of 30 000 states, too large" for the Index; a
    grammar is now checked and masked lazily."""
    c = constraints.build("hermes", [tool("wide", 30)], "required", True, None, smol.vocab)
    assert c is not None
    m = matcher(c.grammar, smol.vocab)
    text = '<tool_call>\n{"name": "wide", "arguments": {"p0": "a", "p29": "z"}}\n</tool_call>'
    assert all(m.consume_token(t) for t in smol.encode(text)) and m.consume_token(smol.eos), m.get_error()


# ---- the grammar cache's bound --------------------------------------------------------------------


def test_the_grammar_cache_is_bounded_and_least_recently_used_first_out() -> None:
    bounded = constraints._Cache(capacity=2)
    made = {k: constraints.Constraint(k, k, k, "required", None) for k in "abc"}
    bounded.put(("v", "a"), made["a"])
    bounded.put(("v", "b"), made["b"])
    assert bounded.get(("v", "a")) is made["a"]  # a is now the most recent
    bounded.put(("v", "c"), made["c"])
    assert bounded.get(("v", "b")) is None and list(bounded.entries) == [("v", "a"), ("v", "c")]


def nested_arrays(depth: int) -> dict[str, Any]:
    """A tool whose argument nests `depth` bounded arrays (the old regex doubled per level)."""
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        nested = {"type": "array", "items": nested, "maxItems": 2}
    params = {"type": "object", "properties": {"x": nested}}
    return {"type": "function", "function": {"name": "deep", "parameters": params}}


def test_a_grammar_that_doubled_per_level_as_a_regex_compiles() -> None:
    """40 nested bounded arrays would not fit in memory as a regex; as a grammar they are a
    few rules, and their texts are the schema's."""
    c = constraints.build("hermes", [nested_arrays(40)], "required", True, None, VOCAB)
    assert c is not None

    def call(depth: int) -> str:
        value = "[" * depth + '"a"' + "]" * depth
        return f'<tool_call>\n{{"name": "deep", "arguments": {{"x": {value}}}}}\n</tool_call>'

    assert accepts(c.grammar, call(40)) and not accepts(c.grammar, call(41))


def test_a_grammar_llguidance_cannot_build_is_a_400() -> None:
    """What llguidance refuses (here a `pattern` that is no regex) is the request's 400, not a 500."""
    bad = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(unclosed"}}}
    t = {"type": "function", "function": {"name": "unbuildable", "parameters": bad}}
    with pytest.raises(SchemaTooComplexError, match="cannot be built") as err:
        constraints.build("hermes", [t], "required", True, None, VOCAB)
    assert err.value.param == "tools" and err.value.code == "schema_too_complex"


class _Result:
    """A compile's result that a weak reference can watch."""


async def test_a_finished_compile_is_freed_without_the_cyclic_gc() -> None:
    """The pool keeps no cycle through a job's future: a compiled result is freed as
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
