"""The one marker primitive every parser family shares (callgate/parsers/markers.py):
its contract against brute-force definitions, split invariance of a stream scan built on
it, and the precondition of that invariance on every marker set the parsers build."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from callgate.formats import FORMATS, get_format
from callgate.parsers.dsml import text_syntax
from callgate.parsers.dsml_block_syntax import block_syntax
from callgate.parsers.json_spec import json_family_spec
from callgate.parsers.markers import MarkerSet
from callgate.parsers.qwen3_xml_syntax import syntax_of

ALPHABET = "ab<>/\n"
marker_lists = st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4)
texts = st.text(ALPHABET, max_size=30)


def _brute_hold_from(markers: MarkerSet, text: str, start: int) -> int:
    prefixes = {m[:k] for m in markers.markers for k in range(1, len(m))}
    return next((i for i in range(start, len(text)) if text[i:] in prefixes), len(text))


def _brute_find(markers: tuple[str, ...], text: str, start: int) -> tuple[int, str] | None:
    for i in range(start, len(text)):
        hits = [m for m in markers if text.startswith(m, i)]
        if hits:
            return i, max(hits, key=len)
    return None


def test_find_is_leftmost_then_longest() -> None:
    markers = MarkerSet.of(["<a", "<ab>", "b>"])
    hit = markers.find("x b> <ab>", 0)
    assert hit is not None and (hit.start(), hit.group()) == (2, "b>")
    hit = markers.find("x b> <ab>", 3)
    assert hit is not None and (hit.start(), hit.group()) == (5, "<ab>")
    assert markers.at("<ab>", 0) == "<ab>"
    assert markers.at("<ax", 0) == "<a"
    assert markers.at("x<a", 0) is None
    assert markers.markers == ("<ab>", "<a", "b>")
    assert markers.longest == 4 and markers.firsts == "<b"


def test_hold_from_keeps_only_a_possible_start() -> None:
    markers = MarkerSet.of(["<tool_call>", "<|im_end|>"])
    assert markers.hold_from("hello <tool", 0) == 6
    assert markers.hold_from("hello <|im", 0) == 6
    assert markers.hold_from("x<tool_call", 0) == 1  # the longest a hold-back can be
    assert markers.hold_from("hello <b", 0) == 8  # "<b" starts no marker
    assert markers.hold_from("hello", 0) == 5
    assert markers.hold_from("<", 0) == 0
    assert markers.hold_from("<", 1) == 1  # nothing before `start` is held
    assert markers.hold_from("<tool_call>", 0) == 11  # a whole marker is found, not held


def test_waits_and_could_start() -> None:
    markers = MarkerSet.of(["</p>", "<x>"])
    assert markers.waits("</") and markers.waits("<")
    assert not markers.waits("</p>") and not markers.waits("a<")
    assert markers.could_start("ab</", 2) and not markers.could_start("ab</q", 2)
    assert not markers.could_start("ab</p>", 2)  # a whole marker is not a proper prefix


def test_a_marker_set_without_markers_finds_and_holds_nothing() -> None:
    markers = MarkerSet.of([])
    assert markers.find("anything", 0) is None and markers.at("x", 0) is None
    assert markers.hold_from("anything", 0) == 8
    assert markers.starts.search("<[{") is None
    assert not markers.waits("") and not markers.could_start("x", 0)


def test_an_empty_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        MarkerSet.of(["<a>", ""])


@given(marker_lists, texts, st.integers(0, 30))
def test_hold_from_and_find_match_their_definitions(raw: list[str], text: str, start: int) -> None:
    markers = MarkerSet.of(raw)
    start = min(start, len(text))
    assert markers.hold_from(text, start) == _brute_hold_from(markers, text, start)
    hit = markers.find(text, start)
    assert (None if hit is None else (hit.start(), hit.group())) == _brute_find(markers.markers, text, start)
    for pos in range(len(text) + 1):
        assert markers.could_start(text, pos) == (text[pos:] in markers.prefixes)
    assert markers.waits(text) == (text in markers.prefixes and _brute_find(markers.markers, text, 0) is None)


def _stream_hits(markers: MarkerSet, pieces: list[str]) -> list[tuple[int, str]]:
    """What a stream parser built on the primitive finds: (offset, marker) of each marker,
    consuming up to the marker, else up to the hold-back, after every piece."""
    held, base, hits = "", 0, []
    for k, piece in enumerate(pieces):
        buf, i, final = held + piece, 0, k == len(pieces) - 1
        while True:
            m = markers.find(buf, i)
            if m is None:
                i = len(buf) if final else markers.hold_from(buf, i)
                break
            hits.append((base + m.start(), m.group()))
            i = m.end()
        held, base = buf[i:], base + i
    return hits


def _no_marker_inside_a_prefix(markers: MarkerSet) -> bool:
    return markers.waiting == markers.prefixes


@given(marker_lists, texts, st.lists(st.integers(0, 30), max_size=6))
def test_a_stream_scan_finds_the_same_markers_for_any_split(raw: list[str], text: str, cuts: list[int]) -> None:
    markers = MarkerSet.of(raw)
    assume(_no_marker_inside_a_prefix(markers))  # what the invariance is promised under (see below)
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)] or [""]
    assert _stream_hits(markers, pieces) == _stream_hits(markers, [text])


def _parser_marker_sets() -> list[tuple[str, MarkerSet]]:
    sets: list[tuple[str, MarkerSet]] = []
    for name in FORMATS:
        fmt = get_format(name)
        if fmt.family == "json":
            spec = json_family_spec(name)
            named = {
                "content": spec.content_markers,
                "ends": spec.ends_set,
                "reasoning": spec.reasoning_markers,
                "block": spec.block_markers,
                "skip": spec.skip_markers,
                "trailing": spec.trailing_markers,
            }
        elif fmt.family == "qwen3-xml":
            sx = syntax_of(fmt)
            named = {
                "content": sx.content,
                "reasoning": sx.reasoning,
                "value": sx.value,
                "body": sx.body,
                "between": sx.between,
                "recover": sx.recover,
                "stray": sx.stray,
            }
        else:
            named = {"text": text_syntax(fmt).markers, "values": block_syntax(fmt).values}
        sets += [(f"{name}:{what}", markers) for what, markers in named.items()]
    return sets


@pytest.mark.parametrize(("where", "markers"), _parser_marker_sets(), ids=[w for w, _ in _parser_marker_sets()])
def test_every_parser_marker_set_meets_the_split_invariance_precondition(where: str, markers: MarkerSet) -> None:
    assert markers.markers, where
    assert _no_marker_inside_a_prefix(markers), where
