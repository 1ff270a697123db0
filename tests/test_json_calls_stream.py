"""JSON family streaming behaviour: calls start as soon as their name is known, arguments
stream canonically while they arrive, text is released promptly (only a possible marker
is held back), and a block that turns out malformed ends in a diagnostic, not a call."""

from __future__ import annotations

import json

import pytest

from callgate.parsers import parse, sequential_call_ids, stream_parser
from callgate.types import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    DiagnosticEvent,
    Event,
    ReasoningDelta,
    TextDelta,
    arguments_json,
    coalesce,
)
from tests.harness import check_split_invariance


def _feed(format: str, pieces: list[str], thinking: bool = False) -> list[list[Event]]:
    parser = stream_parser(format, None, thinking=thinking, call_ids=sequential_call_ids())
    steps = [parser.feed(p) for p in pieces]
    steps.append(parser.finish())
    return steps


def _args(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, ArgumentsDelta))


def test_hermes_arguments_stream_before_the_block_closes() -> None:
    steps = _feed(
        "hermes",
        [
            '<tool_call>\n{"name": "write", "arguments": {"path": "a.txt", "text": "hel',
            "lo \\u00e9\\n wor",
            'ld"}}\n</tool_call>',
        ],
    )
    assert [type(e) for e in steps[0]] == [CallStart, ArgumentsDelta]
    assert steps[0][0] == CallStart(0, "call_0", "write")
    assert _args(steps[0]) == '{"path": "a.txt", "text": "hel'
    assert _args(steps[1]) == "lo é\\n wor"
    end = [e for e in steps[2] if isinstance(e, CallEnd)]
    assert _args(steps[2]) == 'ld"}'
    assert len(end) == 1 and end[0].candidate.arguments == {"path": "a.txt", "text": "hello é\n world"}


def test_name_after_arguments_starts_the_call_at_its_end() -> None:
    text = '<tool_call>\n{"arguments": {"q": 1}, "name": "f"}\n</tool_call>'
    steps = _feed("hermes", [text[:-13], text[-13:]])
    assert [type(e) for e in steps[0]] == [CallStart]
    assert [type(e) for e in steps[1]] == [ArgumentsDelta, CallEnd]
    assert _args(steps[1]) == '{"q": 1}'


def test_llama3_streams_after_the_python_tag() -> None:
    steps = _feed("llama3-json", ['<|python_tag|>{"name": "f", "parameters": {"k": [1, ', "2]}}<|eom_id|>"])
    assert isinstance(steps[0][0], CallStart) and _args(steps[0]) == '{"k": [1, '
    assert _args(steps[1]) == "2]}"


def test_mistral_calls_start_when_the_list_is_complete_with_native_ids() -> None:
    text = '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "Abc123xyz"}, {"name": "g", "arguments": {}}]</s>'
    steps = _feed("mistral", [text[:60], text[60:]])
    assert steps[0] == []
    starts = [e for e in steps[1] if isinstance(e, CallStart)]
    assert starts == [CallStart(0, "Abc123xyz", "f"), CallStart(1, "call_1", "g")]
    ends = [e for e in steps[1] if isinstance(e, CallEnd)]
    assert [e.candidate.raw for e in ends] == [
        '{"name": "f", "arguments": {"a": 1}, "id": "Abc123xyz"}',
        '{"name": "g", "arguments": {}}',
    ]


def test_malformed_block_ends_with_a_diagnostic_not_a_call() -> None:
    steps = _feed("hermes", ['<tool_call>\n{"name": "f", "arguments": {"a": 1', ', "a": 2}}\n</tool_call>'])
    assert [type(e) for e in steps[0]] == [CallStart, ArgumentsDelta]
    later = [e for step in steps[1:] for e in step]
    assert not any(isinstance(e, CallEnd) for e in later)
    assert [e.diagnostic.code for e in later if isinstance(e, DiagnosticEvent)] == ["duplicate_key"]


def test_text_is_released_promptly() -> None:
    text = "The answer < 5 is [x] and {y}; done. " * 20
    for format in ("hermes", "llama3-json", "mistral"):
        parser = stream_parser(format, None)
        sent = ""
        for k, ch in enumerate("Plain. " + text):
            sent += "".join(e.text for e in parser.feed(ch) if isinstance(e, TextDelta))
            # only a possible marker (<|...|>, [TOOL_...], a call) or one separator is held back
            assert k + 1 - len(sent) <= 2, (format, k)
        sent += "".join(e.text for e in parser.finish() if isinstance(e, TextDelta))
        assert sent == "Plain. " + text


def test_streamed_arguments_equal_the_canonical_json_for_odd_spacing() -> None:
    body = '{ "name" : "f" ,\n "arguments" : { "x" : 1.50E+2 , "y" : [ ] , "z" : "\\/\\u0041" } }'
    events = [e for step in _feed("hermes", ["<tool_call>\n", body, "\n</tool_call>"]) for e in step]
    end = next(e for e in events if isinstance(e, CallEnd))
    assert _args(events) == arguments_json(end.candidate.arguments) == json.dumps({"x": 150.0, "y": [], "z": "/A"})


def test_llama3_bare_json_is_an_answer_when_no_tools_are_enabled() -> None:
    answer = '{"name": "Bob", "age": 7} is the record.<|eot_id|>'
    assert parse("llama3-json", answer, []).content == answer.removesuffix("<|eot_id|>")
    assert parse("llama3-json", answer, []).diagnostics == ()
    assert [d.code for d in parse("llama3-json", answer).diagnostics] == ["bad_call_object", "trailing_text"]
    tagged = parse("llama3-json", '<|python_tag|>{"name": "f", "parameters": {}}', [])
    assert [d.code for d in tagged.diagnostics] == ["unknown_tool"]


# ---- the streaming shortcuts (plain deltas and held markers skip the state machine) -----

SHORTCUT_TEXTS = {
    "hermes": [
        "<think>\nFirst, the city.\n\nThen < the > days.\n\n</think>\n\nLooking it up now.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich \\u00e9\x7f", "note": "a \\"b\\" c"}}\n'
        "</tool_call>\n<tool_call>\n"
        '{"arguments": {"k": [1, 2.5, true, null, {"deep": "x"}]}, "name": "get_time"}\n</tool_call><|im_end|>',
    ],
    "llama3-json": [
        'Sure. {"json": "in text"} and more text.<|eot_id|>',
        '{"name": "get_weather", "parameters": {"city": "Paris \x7f\\n", "days": 3}}<|eot_id|>',
        '<|python_tag|>{"name": "get_time", "parameters": {}}<|eom_id|>',
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris \x7f"}, "id": "Abc123xyz"}]</s>',
        "A plain [answer] with <brackets>.</s>",
    ],
}


@pytest.mark.parametrize("format", sorted(SHORTCUT_TEXTS))
def test_streaming_shortcuts_keep_the_streaming_invariant(format: str) -> None:
    for text in SHORTCUT_TEXTS[format]:
        for thinking in (False, True) if format == "hermes" else (False,):
            result = check_split_invariance(format, text, None, thinking=thinking, splits=60)
            for size in (1, 3, 4, 5):
                pieces = [text[i : i + size] for i in range(0, len(text), size)]
                events = [e for step in _feed(format, pieces, thinking) for e in step]
                assert coalesce(events) == coalesce([e for step in _feed(format, [text], thinking) for e in step])
            assert not [d for d in result.diagnostics if d.code != "unknown_tool"], (format, text)


def test_a_plain_delta_is_one_event_and_a_held_marker_piece_none() -> None:
    pieces = [
        "<think>\nPlan",  # machine: opens reasoning
        " the call",  # plain reasoning
        "\n</think>\n\nOk",  # machine: closes reasoning
        " then",  # plain text
        "\n<to",  # machine: holds the separator and the start of a marker
        "ol_c",  # still only the start of a marker: nothing
        'all>\n{"name": "f", "arguments": {"a": "x',  # machine: the call starts
        "yz é",  # plain string body: one fragment
        '"}}',  # machine: the JSON ends
        "\n</too",  # held: the close tag may follow
        "l_c",  # still waiting
        "all><|im_end|>",
    ]
    steps = _feed("hermes", pieces)
    assert steps[1] == [ReasoningDelta(" the call")]
    assert steps[3] == [TextDelta(" then")]
    assert steps[5] == []
    assert steps[7] == [ArgumentsDelta(0, "yz é")]
    assert steps[10] == []
    assert [type(e) for e in steps[11]] == [CallEnd]
    whole = parse("hermes", "".join(pieces), call_ids=sequential_call_ids())
    assert whole.reasoning == "Plan the call" and whole.content == "Ok then"
    assert whole.candidates[0].arguments == {"a": "xyz é"}
