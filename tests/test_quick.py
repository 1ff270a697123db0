"""Quick-instruction heads without a model: prompts share the main prompt's prefix, the
categorical heads' grammars, output decoding, and concurrent runs on a scripted engine."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate import templates
from callgate.constraints import vocabulary
from callgate.constraints.llg import matcher
from callgate.errors import InvalidRequestError
from callgate.formats import FORMATS, get_format
from callgate.serving.engine import GenerationRequest
from callgate.serving.fake_engine import FakeEngine, FakeReply, FakeTokenizer
from callgate.serving.prompt import untrusted_spans
from callgate.serving.quick import Conversation, QuickConfig, QuickService
from callgate.serving.quick_heads import (
    DEFAULT_LABELS,
    HEADS,
    check_tasks,
    decode,
    first_line,
    head_choice,
    head_constraint,
    head_max_tokens,
    head_prompt,
    head_regex,
    urls_in,
)
from tests.llg_harness import allowed_bytes

TASKS = tuple(HEADS)
QUICK_FORMATS = tuple(name for name, f in FORMATS.items() if f.quick_tasks)
CHAT = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Is https://example.com/a worth reading? Also see http://docs.test/b."},
]


def main_prompt(fmt: str, messages: Sequence[Mapping[str, Any]]) -> tuple[str, tuple[tuple[int, int], ...]]:
    def render(msgs: Sequence[Mapping[str, Any]]) -> str:
        return templates.render(fmt, msgs)

    text = render(messages)
    return text, untrusted_spans(render, messages, text)


# ---- tasks and prompts ----------------------------------------------------------------------


def test_every_format_but_v32_has_the_six_heads() -> None:
    assert set(QUICK_FORMATS) == {"dsml-v4", "qwen3-xml", "hermes", "hermes-qwen2.5", "llama3-json", "mistral"}
    for name in QUICK_FORMATS:
        assert set(get_format(name).quick_tasks) == set(TASKS)


def test_unknown_task_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequestError) as err:
        check_tasks("hermes", ["title", "poem"])
    assert err.value.status == 400 and "poem" in err.value.message and "tasks[1]" in err.value.message


def test_a_format_without_heads_refuses_every_task() -> None:
    with pytest.raises(InvalidRequestError, match="known: none"):
        check_tasks("dsml-v3.2", ["action"])


def test_duplicate_tasks_run_once_in_order() -> None:
    assert check_tasks("hermes", ["query", "action", "query"]) == ("query", "action")


@pytest.mark.parametrize("fmt", QUICK_FORMATS)
@pytest.mark.parametrize("task", TASKS)
def test_head_prompt_shares_the_main_prompt_up_to_the_user_text(fmt: str, task: str) -> None:
    main, spans = main_prompt(fmt, CHAT)
    head = head_prompt(fmt, CHAT, task)
    user_end = spans[-1][1]
    assert main[:user_end].endswith(CHAT[-1]["content"])
    assert head.text[:user_end] == main[:user_end]
    assert head.spans == spans  # the same content is untrusted in both, so it tokenises the same
    assert get_format(fmt).quick_tasks[task] in head.text[user_end:]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(QUICK_FORMATS), st.sampled_from(TASKS), st.text(min_size=1, max_size=40))
def test_head_prefix_is_byte_stable_for_any_user_text(fmt: str, task: str, text: str) -> None:
    messages = [{"role": "user", "content": "first " + text}]
    main, spans = main_prompt(fmt, messages)
    head = head_prompt(fmt, messages, task)
    assert head.text[: spans[-1][1]] == main[: spans[-1][1]]


@pytest.mark.parametrize("fmt", QUICK_FORMATS)
def test_title_after_the_answer_keeps_the_answer_in_the_prefix(fmt: str) -> None:
    answered = [*CHAT, {"role": "assistant", "content": "Yes, both are worth it."}]
    head = head_prompt(fmt, answered, "title")
    assert "Yes, both are worth it." in head.text
    assert head.text.index("Yes, both") < head.text.rindex(get_format(fmt).quick_tasks["title"])


def test_dsml_v4_heads_use_the_models_task_tokens() -> None:
    spec = get_format("dsml-v4")
    assert head_prompt("dsml-v4", CHAT, "query").text.endswith(CHAT[-1]["content"] + spec.quick_tasks["query"])
    action = head_prompt("dsml-v4", CHAT, "action").text
    assert action.endswith(spec.markers.assistant + "</think>" + spec.quick_tasks["action"])


# ---- grammars and decoding -------------------------------------------------------------------


def test_urls_of_the_last_user_message_in_order_without_trailing_punctuation() -> None:
    messages = [*CHAT[:1], {"role": "user", "content": "old http://x.test"}, *CHAT[1:]]
    assert urls_in(messages) == ("https://example.com/a", "http://docs.test/b")
    assert urls_in([{"role": "user", "content": "no links"}]) == ()


@pytest.mark.parametrize(
    ("content", "urls"),
    [
        (
            "Read https://en.wikipedia.org/wiki/Python_(programming_language) please.",
            ("https://en.wikipedia.org/wiki/Python_(programming_language)",),
        ),
        ("(see https://a.test/x).", ("https://a.test/x",)),
        ("see https://a.test/x.", ("https://a.test/x",)),
        ("[http://x.com/a_(b)] and {https://q.test/{k}}", ("http://x.com/a_(b)", "https://q.test/{k}")),
        ("http://x.com/a_(b)) or https://a.test/x?!", ("http://x.com/a_(b)", "https://a.test/x")),
        ("Also HTTPS://EXAMPLE.COM/A and Http://b.test/C", ("HTTPS://EXAMPLE.COM/A", "Http://b.test/C")),
        ("nothing after https://. or http://)", ()),
    ],
)
def test_urls_keep_balanced_brackets_and_any_scheme_case(content: str, urls: tuple[str, ...]) -> None:
    assert urls_in([{"role": "user", "content": content}]) == urls


@pytest.mark.parametrize(
    ("task", "good", "bad"),
    [
        ("action", ["search", "Search", "answer", "Answer"], ["maybe", "search.", "SEARCH", ""]),
        ("authority", ["low", "High"], ["very high", "none"]),
        ("domain", ["science", "Travel"], ["cooking", "science fiction"]),
        (
            "read_url",
            ["https://example.com/a: yes\nhttp://docs.test/b: no"],
            ["https://example.com/a: yes", "http://docs.test/b: no\nhttps://example.com/a: yes", "x: yes\ny: no"],
        ),
    ],
)
def test_categorical_heads_admit_exactly_their_labels(task: str, good: list[str], bad: list[str]) -> None:
    regex = head_regex(task, DEFAULT_LABELS, urls_in(CHAT))
    assert regex is not None
    assert all(re.fullmatch(regex, g) for g in good)
    assert not any(re.fullmatch(regex, b) for b in bad)


@pytest.mark.parametrize("task", ["title", "query"])
def test_text_heads_are_unconstrained_but_bounded(task: str) -> None:
    assert head_regex(task, DEFAULT_LABELS, ()) is None
    assert 0 < head_max_tokens(task, ()) <= 64


def test_a_head_grammar_compiles_with_llguidance_and_ends_after_the_label() -> None:
    tok = FakeTokenizer()
    vocab = vocabulary(tok.vocabulary(), tok.eos_token_id)
    regex = head_regex("authority", DEFAULT_LABELS, ())
    assert regex is not None
    m = matcher(head_constraint(regex).grammar, vocab)
    for b in b"Medium":
        assert b in allowed_bytes(m)
        assert m.consume_token(b)
    assert allowed_bytes(m) == [tok.eos_token_id]


def test_a_label_that_extends_another_can_still_be_written() -> None:
    tok = FakeTokenizer()
    vocab = vocabulary(tok.vocabulary(), tok.eos_token_id)
    regex = head_regex("domain", {"domain": ("Law", "Lawyer")}, ())
    assert regex is not None
    for word in (b"Law", b"Lawyer"):
        m = matcher(head_constraint(regex).grammar, vocab)
        for b in word:
            assert b in allowed_bytes(m), (word, b)
            assert m.consume_token(b)
        assert tok.eos_token_id in allowed_bytes(m)


def test_read_url_bound_covers_its_lines() -> None:
    urls = urls_in(CHAT)
    assert head_max_tokens("read_url", urls) >= len("\n".join(f"{u}: yes" for u in urls))


def test_decided_only_when_one_spelling_is_left() -> None:
    assert head_choice("action", DEFAULT_LABELS).decided("A") == ("Answer", "answer")
    choice = head_choice("domain", DEFAULT_LABELS)
    assert choice.decided("") is None and choice.decided("s") is None and choice.decided("S") is None
    assert choice.decided("Sc") == ("Science", "science")
    assert choice.decided("h") == ("health", "health")
    assert choice.decided("x") is None
    news = head_choice("domain", {"domain": ("news", "newsroom")})
    assert news.decided("news") is None and news.decided("news", eos=True) == ("news", "news")
    assert news.decided("newsr") == ("newsroom", "newsroom") and news.decided("new", eos=True) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text("abcdefgh", min_size=1, max_size=6), min_size=1, max_size=6, unique=True),
    st.data(),
)
def test_a_decision_is_the_spelling_greedy_decoding_finishes_within_the_bound(words: list[str], data: Any) -> None:
    choice = head_choice("domain", {"domain": tuple(words)})
    spelling, label = data.draw(st.sampled_from(choice.spellings))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(spelling) - 1))) if len(spelling) > 1 else set())
    tokens = [spelling[a:b] for a, b in zip([0, *cuts], [*cuts, len(spelling)], strict=True)]
    for n in range(1, len(tokens) + 1):
        said = choice.decided("".join(tokens[:n]))
        if said is not None:
            break
    else:
        n, said = len(tokens) + 1, choice.decided(spelling, eos=True)  # EOS is one more token
    assert said == (spelling, label) and n <= len(spelling.encode()) + 1


@pytest.mark.parametrize(
    ("task", "text", "expected"),
    [
        ("action", "Search", "search"),
        ("action", " answer.\n", "answer"),
        ("action", "perhaps", None),
        ("domain", "Science", "science"),
        ("authority", "extreme", None),
        ("query", "1. mars rover news\n- perseverance 2025\n\n", ["mars rover news", "perseverance 2025"]),
        ("title", '"Trip to Iceland"\nmore', "Trip to Iceland"),
        ("title", "  ", None),
        (
            "read_url",
            "https://example.com/a: yes\nhttp://docs.test/b: no",
            {"https://example.com/a": True, "http://docs.test/b": False},
        ),
        ("read_url", "https://example.com/a: yes", None),
    ],
)
def test_decode(task: str, text: str, expected: Any) -> None:
    assert decode(task, text, DEFAULT_LABELS, urls_in(CHAT)) == expected


# ---- running on a scripted engine -------------------------------------------------------------

ANSWERS = {"action": "Search", "query": "example a\nexample b", "authority": "high", "domain": "technology"}
ANSWERS |= {"title": "Two links", "read_url": "https://example.com/a: yes\nhttp://docs.test/b: no"}
URL_ANSWERS = {"https://example.com/a": " yes", "http://docs.test/b": " no"}  # read_url decided per URL
# "S" decides search; "h" high; "te" technology (not travel); " y" / " n" each URL; the text
# heads write everything plus EOS (the fake writes one token per character)
DECIDED_TOKENS = {"action": 1, "authority": 1, "domain": 2, "read_url": 4, "query": 20, "title": 10}
EXPECTED = {
    "action": "search",
    "query": ["example a", "example b"],
    "authority": "high",
    "domain": "technology",
    "title": "Two links",
    "read_url": {"https://example.com/a": True, "http://docs.test/b": False},
}


def scripted(fmt: str = "hermes", delay_s: float = 0.0) -> FakeEngine:
    spec = get_format(fmt)

    def respond(req: GenerationRequest) -> FakeReply:
        task = max(spec.quick_tasks, key=lambda t: req.prompt.rfind(spec.quick_tasks[t]))
        if req.prompt.rfind(spec.quick_tasks[task]) < 0:
            return FakeReply(tuple("The main answer."), token_delay_s=delay_s)
        url = next((u for u in URL_ANSWERS if req.prompt.endswith(u + ":")), None)
        answer = URL_ANSWERS[url] if task == "read_url" and url else ANSWERS[task]
        return FakeReply(tuple(answer), token_delay_s=delay_s)

    return FakeEngine(respond=respond)


@pytest.mark.parametrize("decide_early", [True, False])
async def test_all_heads_answer_in_their_shapes(decide_early: bool) -> None:
    engine = scripted()
    config = QuickConfig(decide_early=decide_early)
    result = await QuickService(engine, "hermes", config).run(Conversation(tuple(CHAT)), TASKS)
    assert result.results() == EXPECTED
    texts = {r.task: r.text for r in result.runs}
    assert texts == ANSWERS  # a decided label is completed as the grammar would finish it


async def test_deciding_early_writes_only_the_deciding_tokens() -> None:
    engine = scripted()
    result = await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), TASKS)
    assert {r.task: r.completion_tokens for r in result.runs} == DECIDED_TOKENS


async def test_a_label_decided_before_its_bound_stops_the_generation() -> None:
    engine = FakeEngine(replies=["law"])
    labels = {"domain": ("science", "sports", "law")}  # "sc" / "sp" need two tokens, "l" one
    result = await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), ["domain"], labels=labels)
    run = result.runs[0]
    assert (run.output, run.text, run.completion_tokens, run.finish_reason) == ("law", "law", 1, "stop")
    assert engine.aborted == [engine.requests[0].request_id]


async def test_full_decode_writes_every_token() -> None:
    engine = scripted()
    config = QuickConfig(decide_early=False)
    result = await QuickService(engine, "hermes", config).run(Conversation(tuple(CHAT)), TASKS)
    assert result.usage()["completion_tokens"] == sum(len(a) + 1 for a in ANSWERS.values())  # + EOS each
    assert engine.aborted == []


async def test_heads_are_greedy_constrained_where_categorical_and_bounded() -> None:
    engine = scripted()
    await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), TASKS, request_id="q")
    by_task = {r.request_id.removeprefix("q-"): r for r in engine.requests}
    urls = urls_in(CHAT)
    assert set(by_task) == {t for t in TASKS if t != "read_url"} | {"read_url-0", "read_url-1"}
    for name, req in by_task.items():
        task = name.split("-")[0]
        assert req.sampling.temperature == 0.0
        if task == "read_url":
            assert req.sampling.max_tokens == 2 and req.constraint is not None
            assert req.constraint.grammar == head_constraint(" (?:yes|no)").grammar
            continue
        regex = head_regex(task, DEFAULT_LABELS, urls)
        assert (req.constraint.grammar if req.constraint else None) == (regex and head_constraint(regex).grammar)
        if task in ("action", "authority", "domain"):  # stopped in the engine once decided
            assert req.sampling.max_tokens == head_choice(task, DEFAULT_LABELS).deciding_bytes()
            assert dataclasses.asdict(req.constraint)["budget_closing"] is False  # type: ignore[call-overload]
        else:
            assert req.sampling.max_tokens == head_max_tokens(task, urls)


async def test_full_decode_sends_the_bound_without_budget_closing() -> None:
    """A head's bound holds its whole label: a closing plan from the label's start would pick
    the label for the model (the processor's greedy closer spells the first one it prefers)."""
    engine = scripted()
    await QuickService(engine, "hermes", QuickConfig(decide_early=False)).run(Conversation(tuple(CHAT)), ["domain"])
    req = engine.requests[0]
    assert req.sampling.max_tokens == head_max_tokens("domain", ()) and req.constraint is not None
    assert dataclasses.asdict(req.constraint)["budget_closing"] is False  # type: ignore[call-overload]


def test_deciding_bytes_bound_the_tokens_that_decide() -> None:
    assert head_choice("action", DEFAULT_LABELS).deciding_bytes() == 1
    assert head_choice("authority", DEFAULT_LABELS).deciding_bytes() == 1
    assert head_choice("domain", DEFAULT_LABELS).deciding_bytes() == 2  # "sc" / "sp" / "sh", "te" / "tr"
    assert head_choice("domain", {"domain": ("news", "newsroom")}).deciding_bytes() is None  # only EOS decides
    assert head_choice("domain", {"domain": ("café", "cab")}).deciding_bytes() == 3  # "caf" decides


async def test_read_url_asks_each_url_after_the_lines_before_it() -> None:
    engine = scripted()
    result = await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), ["read_url"])
    head = head_prompt("hermes", CHAT, "read_url")
    first, second = urls_in(CHAT)
    a_start, b_start = len(head.text), len(head.text + first + ": yes\n")
    prompts = [head.text + first + ":", head.text + first + ": yes\n" + second + ":"]
    assert [r.prompt for r in engine.requests] == prompts
    assert engine.requests[0].untrusted_spans == (*head.spans, (a_start, a_start + len(first)))
    assert engine.requests[1].untrusted_spans == (
        *head.spans,
        (a_start, a_start + len(first)),
        (b_start, b_start + len(second)),
    )
    # the prompt of the last request is the full decode's text up to its answer
    assert result.runs[0].text == f"{first}: yes\n{second}: no" == ANSWERS["read_url"]
    assert head.text + result.runs[0].text.removesuffix(" no") == engine.requests[1].prompt


async def test_read_url_with_an_undecided_url_answers_none() -> None:
    engine = FakeEngine(respond=lambda req: " maybe" if req.prompt.endswith("/a:") else " no")
    result = await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), ["read_url"])
    assert result.results() == {"read_url": None}
    assert len(engine.requests) == 1  # no line to continue from: the later URLs are not asked


async def test_unconstrained_config_sends_no_grammar() -> None:
    engine = scripted()
    await QuickService(engine, "hermes", QuickConfig(constrained=False)).run(Conversation(tuple(CHAT)), ["action"])
    assert engine.requests[0].constraint is None


async def test_request_labels_override_the_server_set() -> None:
    engine = scripted()
    labels = {"domain": ("technology", "cooking")}
    result = await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), ["domain"], labels=labels)
    assert result.results() == {"domain": "technology"}
    assert engine.requests[0].constraint is not None and "ooking" in engine.requests[0].constraint.grammar


async def test_read_url_without_urls_generates_nothing() -> None:
    engine = scripted()
    result = await QuickService(engine, "hermes").run(Conversation(({"role": "user", "content": "hi"},)), ["read_url"])
    assert result.results() == {"read_url": {}} and engine.requests == []


async def test_heads_hit_the_prefix_cache_of_the_main_prompt() -> None:
    engine = scripted()
    main, spans = main_prompt("hermes", CHAT)
    async for _ in engine.generate(GenerationRequest("main", main, _sampling(), None, spans)):
        pass
    result = await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), ["action", "domain"])
    rates = result.prefix_cache()
    shared = len(engine.tokenizer.encode(main[: spans[-1][1]], spans))  # tokens up to the user text's end
    for run in result.runs:
        assert run.cached_tokens == shared // 16 * 16  # every full block of the shared prefix
        assert rates[run.task] == pytest.approx(run.cached_tokens / run.prompt_tokens, abs=1e-4)


async def test_heads_run_concurrently() -> None:
    engine = scripted(delay_s=0.2)  # a decided label is one or two tokens
    script = engine.respond
    assert script is not None
    running_at_start: list[int] = []

    def respond(req: GenerationRequest) -> Any:
        running_at_start.append(engine.num_running())
        return script(req)

    engine.respond = respond
    await QuickService(engine, "hermes").run(Conversation(tuple(CHAT)), ["action", "authority", "domain"])
    assert running_at_start == [0, 1, 2]  # each head started while the earlier ones still ran


async def test_beside_runs_user_heads_early_and_title_on_the_answer() -> None:
    engine = scripted()
    service = QuickService(engine, "hermes")
    beside = service.beside(Conversation(tuple(CHAT)), ["title", "action"], "chatcmpl-1")
    await asyncio.sleep(0.02)
    assert engine.requests == []  # nothing before the main generation's first token
    beside.launch()
    beside.launch()
    for _ in range(500):  # the head compiles its grammar in a thread first
        await asyncio.sleep(0.01)
        if engine.requests:
            break
    await asyncio.sleep(0.05)
    assert [r.request_id for r in engine.requests] == ["chatcmpl-1-q-action"]
    answer = {"role": "assistant", "content": "Both links are worth reading."}
    result = await beside.finish(answer)
    assert [r.task for r in result.runs] == ["title", "action"]
    assert [r.request_id for r in engine.requests].count("chatcmpl-1-q-action") == 1
    title_req = engine.requests[-1]
    assert title_req.request_id == "chatcmpl-1-q-title" and "Both links are worth reading." in title_req.prompt


async def test_cancel_aborts_heads_still_running() -> None:
    engine = scripted(delay_s=0.05)
    beside = QuickService(engine, "hermes").beside(Conversation(tuple(CHAT)), ["query"], "chatcmpl-2")
    beside.launch()
    await asyncio.sleep(0.02)
    beside.cancel()
    await asyncio.sleep(0.1)
    assert engine.aborted == ["chatcmpl-2-q-query"] and engine.num_running() == 0


def test_beside_refuses_an_unknown_task_before_starting_anything() -> None:
    engine = scripted()
    with pytest.raises(InvalidRequestError, match=r"callgate\.quick"):
        QuickService(engine, "hermes").beside(Conversation(tuple(CHAT)), ["action", "poem"], "x")
    assert engine.requests == []


def _sampling() -> Any:
    from callgate.serving.engine import SamplingParams

    return SamplingParams(max_tokens=4, temperature=0.0)


# ---- a text head read past leading blank lines -------------------------------------------------


def titling(fmt: str, reply: str, main: str = "The main answer.") -> FakeEngine:
    """An engine that writes `reply` to a title head's prompt and `main` to any other."""
    title = get_format(fmt).quick_tasks["title"]
    return FakeEngine(respond=lambda req: reply if title in req.prompt else main)


ANSWERED = [*CHAT, {"role": "assistant", "content": "Sunny, 21 degrees."}]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("\nWeather in Oslo\nmore", "\nWeather in Oslo"),
        (" \n\t\nOslo\n", " \n\t\nOslo"),
        ("Oslo\n", "Oslo"),
        ("\n\n \n", None),
        ("\nWeather in Os", None),
        ("", None),
    ],
)
def test_first_line_ends_after_text_only(text: str, line: str | None) -> None:
    assert first_line(text, ("\n",)) == line


@pytest.mark.parametrize("fmt", QUICK_FORMATS)
@pytest.mark.parametrize(
    ("reply", "title", "text", "tokens", "finish"),
    [
        # the fake writes a token a character; the title's bound is 16 tokens
        ("\nWeather in Oslo\n", "Weather in Oslo", "\nWeather in Oslo", 16, "length"),
        ("\nOslo weather\nmore", "Oslo weather", "\nOslo weather", 14, "stop"),
        ('\n\n \n"Oslo"\nmore', "Oslo", '\n\n \n"Oslo"', 11, "stop"),
        (" \n\tOslo weather", "Oslo weather", " \n\tOslo weather", 16, "stop"),  # ended by EOS
    ],
)
async def test_a_title_after_leading_blank_lines_is_its_first_line(
    fmt: str, reply: str, title: str, text: str, tokens: int, finish: str
) -> None:
    engine = titling(fmt, reply)
    run = (await QuickService(engine, fmt).run(Conversation(tuple(ANSWERED)), ["title"])).runs[0]
    assert (run.output, run.text, run.finish_reason) == (title, text, finish)
    assert run.completion_tokens == len(run.token_ids) == tokens
    assert len(engine.requests) == 1 and engine.requests[0].sampling.stop == ()


@pytest.mark.parametrize(
    ("reply", "tokens", "aborted"),
    [("Oslo weather\nmore lines", 13, True), ("Weather in Oslo\nmore", 16, False)],  # the bound on its end
)
async def test_a_title_on_its_first_line_ends_there(reply: str, tokens: int, aborted: bool) -> None:
    engine = titling("llama3-json", reply)
    run = (await QuickService(engine, "llama3-json").run(Conversation(tuple(ANSWERED)), ["title"])).runs[0]
    title = reply.split("\n")[0]
    assert (run.output, run.text, run.completion_tokens, run.finish_reason) == (title, title, tokens, "stop")
    assert engine.aborted == [engine.requests[0].request_id] * aborted  # stopped reading at the line's end


@pytest.mark.parametrize(("reply", "tokens"), [("\n" * 40, 16), (" ", 2), ("\n \n", 4), ("", 1)])
async def test_a_title_of_blank_lines_only_is_none_within_the_bound(reply: str, tokens: int) -> None:
    engine = titling("mistral", reply)
    run = (await QuickService(engine, "mistral").run(Conversation(tuple(ANSWERED)), ["title"])).runs[0]
    assert run.output is None and run.completion_tokens == tokens and len(engine.requests) == 1
