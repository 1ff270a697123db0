"""What each format family's free text may not hold: content, reasoning, and the text of a
lazy row before its call trigger.

Knows: the markers of each family (spelled with callgate.formats) that such text would read
as something else, and how a numbered run of reserved control tokens is kept out by its
prefix. Does not know: grammars, vocabularies or tool_choice; the Lark families
(lark_json.py, lark_dsml.py, lark_qwen3_xml.py) and the regex baseline
(benchmarks/regex_baseline/) build their text rules from these lists.

    json_content(fmt), json_reasoning(fmt) -> list[str]   # hermes, llama3-json, mistral
    json_lazy_ok(fmt), json_opens_reasoning(fmt) -> bool
    dsml_content(fmt) -> list[str]; DSML_BAR                 # DeepSeek V3.2 / V4
    qwen3_xml_content(fmt) -> list[str]                      # Qwen3-Coder
    collapse_numbered(markers) -> list[str]
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from callgate.formats import Llama3Markers, Qwen3XmlMarkers, ToolCallFormat, json_markers

# U+FF5C, the bar of every DSML marker: raw text without it holds no BOS, EOS, `｜DSML｜`
# nor parameter close (stricter than the parser, which only stops a value at
# `/｜DSML｜parameter`).
DSML_BAR = "\uff5c"

_NUMBERED = re.compile(r"(.*?)[0-9]+([^0-9]*)", re.DOTALL)


def collapse_numbered(markers: Iterable[str], *, min_members: int = 16, min_prefix: int = 4) -> list[str]:
    """`markers` with each numbered family replaced by its prefix: a family is at least
    `min_members` markers PREFIX + decimal + SUFFIX sharing PREFIX and SUFFIX (reserved
    control tokens: mistral's `<SPECIAL_20>`..`<SPECIAL_999>`, llama3's
    `<|reserved_special_token_N|>`). Order is kept, the prefix standing where the family's
    first member stood; a prefix shorter than `min_prefix` is left alone (it would ban
    ordinary text).

    Text without PREFIX holds no member, so text that avoids the result avoids `markers`:
    stricter (the bare prefix is kept out too), at the cost of one prefix instead of the
    family. Measured on the regex baseline: mistral's content grammar went from a 56 kB
    regex and 2301 DFA states (4-8 s to compile over a 49k vocabulary) to ~2 kB.
    """
    ordered = list(dict.fromkeys(markers))
    families: dict[tuple[str, str], list[str]] = {}
    for m in ordered:
        found = _NUMBERED.fullmatch(m)
        if found is not None and len(found[1]) >= min_prefix:
            families.setdefault((found[1], found[2]), []).append(m)
    prefix_of = {m: key[0] for key, members in families.items() if len(members) >= min_members for m in members}
    return list(dict.fromkeys(prefix_of.get(m, m) for m in ordered))


def _control(fmt: ToolCallFormat) -> list[str]:
    """The control tokens, a numbered run of reserved ones (mistral `<SPECIAL_20..999>`,
    llama3 `<|reserved_special_token_0..247|>`) as its prefix: stricter than the parser,
    which reads each token, and a content grammar of one prefix instead of ~1000 literals
    (mistral's took 4-12 s to compile on the regex baseline, past the request's time limit)."""
    return list(_collapsed(fmt.special_tokens))


@functools.cache
def _collapsed(tokens: tuple[str, ...]) -> tuple[str, ...]:
    # once per format, not per request: mistral's ~1000 tokens take ~0.5 ms
    return tuple(collapse_numbered(tokens))


def json_content(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger): control
    tokens, and in the single layout a call object."""
    m = json_markers(fmt)
    if isinstance(m, Llama3Markers):  # the "single" layout
        return [*_control(fmt), m.call_in_text]
    return _control(fmt)


def json_reasoning(fmt: ToolCallFormat) -> list[str]:
    """What a reasoning block may not hold before its close: control tokens."""
    return _control(fmt)


def json_lazy_ok(fmt: ToolCallFormat) -> bool:
    """Whether content may precede a call (so free text up to the trigger is fine)."""
    return bool(json_markers(fmt).call_layout != "single")


def json_opens_reasoning(fmt: ToolCallFormat) -> bool:
    """Whether the model may open a reasoning block itself (Qwen3 writes
    `<think>\\n\\n</think>\\n\\n` even when not thinking): the format has one."""
    return fmt.reasoning_open is not None and fmt.reasoning_close is not None


def dsml_think(fmt: ToolCallFormat) -> list[str]:
    """The think tags of a DSML format."""
    return [t for t in (fmt.reasoning_open, fmt.reasoning_close) if t]


def dsml_content(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger, where the
    trigger's own bar is the one allowed): think tags, and the bar of every DSML marker."""
    return [*dsml_think(fmt), DSML_BAR]


def qwen3_xml_content(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger): control
    tokens and stray call tags."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    return [*fmt.special_tokens, m.function_open, m.function_close, m.parameter_open, m.parameter_close]
