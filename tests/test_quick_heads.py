"""Quick-instruction heads without a model: the tasks, the head prompts (which share the main
prompt's prefix), the categorical heads' grammars and the decoding of their outputs.

Running the heads on a scripted engine: tests/test_quick.py."""

from __future__ import annotations

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
from callgate.formats import FORMATS, DsmlMarkers, get_format
from callgate.serving.engines.fake_engine import FakeTokenizer
from callgate.serving.prompt import untrusted_spans
from callgate.serving.quick.heads import (
    DEFAULT_LABELS,
    HEADS,
    check_tasks,
    decode,
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
    assert action.endswith(spec.markers_as(DsmlMarkers).assistant + "</think>" + spec.quick_tasks["action"])


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
