"""mistral follow-ups from QA on the real server.

1. tool_choice `none` compiles a content grammar that holds no schema. It kept each of
   mistral's ~1000 control tokens out one by one (`<SPECIAL_20>`..`<SPECIAL_999>`) and took
   seconds to compile, past the request's time limit, which then told the client to
   simplify schemas it never sent. Now a numbered run of reserved tokens is kept out by its
   prefix (stricter than the parser, never more lenient: what the grammar admits parses);
   an overrun of a schema-free grammar is a retryable 503; the server warms that grammar at
   start.
2. A tool without `parameters` is any object, under mistral as under every other format.

The grammars are llguidance's, judged over a byte vocabulary (tests/llg_harness.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import callgate.constraints as constraints
from callgate.constraints import json_calls
from callgate.constraints.request import grammar_request
from callgate.constraints.text import collapse_numbered
from callgate.errors import CompilerBusyError
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.serving.app import create_app
from callgate.serving.fake_engine import FakeEngine
from callgate.serving.settings import Limits
from callgate.templates import render
from tests.llg_harness import accepts, byte_vocabulary
from tests.test_compile_pool import Held, held, make_harness  # noqa: F401 - fixtures
from tests.test_server_app import ASK, make_settings

VOCAB = byte_vocabulary()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def grammar(fmt: str, choice: str) -> str:
    c = constraints.build(fmt, [WEATHER], choice, True, None, VOCAB)
    assert c is not None
    return c.grammar


@pytest.fixture(scope="module")
def mistral_none() -> str:
    return grammar("mistral", "none")


# ---- 1. the content grammar ------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "bound"), [("mistral", 40), ("llama3-json", 40)])
def test_reserved_token_runs_are_kept_out_by_their_prefix(fmt: str, bound: int) -> None:
    # before GRAMMAR_VERSION 9: mistral 980 <SPECIAL_n> literals, llama3-json 248 reserved tokens
    markers = json_calls.content_markers(get_format(fmt))
    assert len(markers) < bound and any(m.endswith("_") for m in markers)


def test_collapse_numbered_keeps_short_prefixes_small_runs_and_order() -> None:
    run = [f"<RES_{i}>" for i in range(20)]
    assert collapse_numbered(["<a>", *run, "<b>"]) == ["<a>", "<RES_", "<b>"]
    assert collapse_numbered(run[:5]) == run[:5]  # a few numbered tokens are named ones
    assert collapse_numbered([f"<{i}>" for i in range(20)]) == [f"<{i}>" for i in range(20)]  # "<" alone: no


# ---- 1. grammar and parser still agree -------------------------------------------------------------


REFUSED = ["<SPECIAL_20>", "Hi <SPECIAL_999> there", "<SPECIAL_", "a<SPECIAL_x", "[TOOL_CALLS]", "ok</s>"]
ADMITTED = ["Hi", "<SPECIAL", "a <SPECIAL-20>", "<special_20>", "[INST", "<s", "x [/INST x", "é <SPEC"]


@pytest.mark.parametrize("text", REFUSED)
def test_the_none_grammar_keeps_every_special_token_out(mistral_none: str, text: str) -> None:
    assert not accepts(mistral_none, text)


@pytest.mark.parametrize("text", ADMITTED)
def test_what_the_none_grammar_admits_parses_as_plain_content(mistral_none: str, text: str) -> None:
    assert accepts(mistral_none, text)
    result = parse("mistral", text + get_format("mistral").eos)
    assert result.diagnostics == () and result.content == text


def test_content_before_an_auto_call_keeps_the_same_prefix_out() -> None:
    auto = grammar("mistral", "auto")
    call = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "abcDEF123"}]'
    assert accepts(auto, "Hi <SPECIAL-") and accepts(auto, "Hi <SPECIAL-" + call)
    assert not accepts(auto, "Hi <SPECIAL_20>") and not accepts(auto, "Hi <SPECIAL_" + call)


# ---- 1. a schema-free grammar that overruns is a retryable 503 -------------------------------------


async def test_an_overrun_of_the_none_grammar_is_busy_not_too_complex(held: Held) -> None:  # noqa: F811
    held.held_names.add("")  # every compile waits
    with pytest.raises(CompilerBusyError) as err:
        await constraints.build_async("mistral", [WEATHER], "none", True, None, VOCAB, timeout_s=0.05)
    assert (err.value.status, err.value.code, err.value.retry_after_s) == (503, "grammar_compiler_busy", 1)
    assert "simplify" not in err.value.message and "retry" in err.value.message
    # a retry joins the running compile and waits its own time limit (not what the first one left)
    retry = asyncio.ensure_future(
        constraints.build_async("mistral", [WEATHER], "none", True, None, VOCAB, timeout_s=30)
    )
    for _ in range(3000):
        if constraints._POOL.waiting == 1:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # past the first request's 0.05 s
    held.release.set()
    found = await retry
    assert found is not None and held.compiled.count(found.grammar) == 1


async def test_http_none_overrun_is_503_with_retry_after(held: Held, make_harness: Any) -> None:  # noqa: F811
    held.held_names.add("")
    settings = make_settings(format="mistral", limits=Limits(grammar_timeout_s=0.05))
    h = make_harness(["Hello."], settings=settings)
    busy = await h.post({"messages": ASK, "tools": [WEATHER], "tool_choice": "none"})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
    error = busy.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "grammar_compiler_busy", None)
    assert "simplify" not in error["message"]


async def test_the_server_warms_the_none_grammar_at_start(held: Held) -> None:  # noqa: F811
    app = create_app(make_settings(format="mistral"), engine=FakeEngine(replies=[]))
    async with app.router.lifespan_context(app):
        for _ in range(3000):
            if constraints.CACHE.entries:
                break
            await asyncio.sleep(0.01)
    key = grammar_request("mistral", [WEATHER], "none", None, None)
    assert key is not None and [slot[1] for slot in constraints.CACHE.entries] == [key.key()]
    assert len(held.compiled) == 1 and "start:" in held.compiled[0]  # its one llguidance check


# ---- 2. a tool without parameters ------------------------------------------------------------------


ANY_OBJECT = {"type": "object", "properties": {}}


def tool_list(tools: list[dict[str, Any]]) -> list[Any]:
    prompt = render("mistral", [{"role": "user", "content": "ping"}], tools=tools)
    fmt = get_format("mistral")
    body = prompt.split(fmt.markers.tools_open, 1)[1].split(fmt.markers.tools_close, 1)[0]
    listed: list[Any] = json.loads(body)
    return listed


@pytest.mark.parametrize("function", [{"name": "ping"}, {"name": "ping", "parameters": None}])
def test_a_tool_without_parameters_is_shown_as_any_object(function: dict[str, Any]) -> None:
    shown = tool_list([{"type": "function", "function": function}])
    explicit = tool_list([{"type": "function", "function": {"name": "ping", "parameters": ANY_OBJECT}}])
    expected = {"type": "function", "function": {"name": "ping", "description": "", "parameters": ANY_OBJECT}}
    assert shown == explicit == [expected]


def test_parameters_that_are_no_object_are_still_refused() -> None:
    with pytest.raises(Exception, match=r"tools\[0\]\.function\.parameters"):
        tool_list([{"type": "function", "function": {"name": "ping", "parameters": "any"}}])


async def test_http_required_call_to_a_tool_without_parameters(make_harness: Any) -> None:  # noqa: F811
    settings = make_settings(format="mistral")
    h = make_harness([['[TOOL_CALLS][{"name": "ping", "arguments": {}, "id": "abcDEF123"}]']], settings=settings)
    tools = [{"type": "function", "function": {"name": "ping", "description": "Ping"}}]
    resp = await h.post({"messages": [{"role": "user", "content": "ping"}], "tools": tools, "tool_choice": "required"})
    assert resp.status_code == 200, resp.text
    [call] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("ping", {})


@pytest.mark.parametrize("mode", ["none", "response_format"])
def test_a_grammar_with_no_call_is_one_key_whatever_parallel_tool_calls_says(mode: str) -> None:
    tool = [{"type": "function", "function": {"name": "f"}}]
    choice, fmt = ("none", None) if mode == "none" else ("none", {"type": "json_object"})
    requests = [grammar_request("mistral", tool, choice, p, fmt) for p in (True, False, None)]
    assert len({r.key() for r in requests if r is not None}) == 1 and None not in requests
