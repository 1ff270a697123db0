"""The pieces both DeepSeek layouts share: the tools block, the response-format text, the
DSML calls block, and the neutralisation of untrusted text.

Knows: the DSML markers (from the format spec) and the long fixed texts (shipped as
`dsml_texts.json` in this package, verbatim from the reference encoders). Does not know
where in a conversation a piece goes (dsml_v32 / dsml_v4 decide that).

Neutralisation (tool results are untrusted data): a ZERO WIDTH JOINER (U+200D) is inserted
right after the `<` of anything that would read as a control token or a result tag
(`<｜...`, `</｜...`, `<think>`, `</think>`, `<result>`, `</function_results>`,
`<tool_result>`, ...) and inside a bare `｜DSML｜` (after its first bar). The tokenizer then
sees plain text, and neither an end of turn, a role switch, a think tag, a call block nor
an early end of the result can be forged. Everything else is kept byte for byte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from callgate.formats import DsmlMarkers, ToolCallFormat
from callgate.templates.dsml_messages import Call

ZWJ = "\u200d"


@cache
def fixed_text(version: str, key: str) -> str:
    """A verbatim constant of the reference encoder (`version` is "dsv32" or "dsv4")."""
    raw = resources.files("callgate.templates").joinpath("dsml_texts.json").read_text(encoding="utf-8")
    texts: dict[str, dict[str, str]] = json.loads(raw)
    return texts[version][key]


def to_json(value: Any) -> str:
    """JSON exactly as the reference writes it: Python's json.dumps, ensure_ascii off."""
    return json.dumps(value, ensure_ascii=False)


def tools_block(version: str, functions: Sequence[Mapping[str, Any]]) -> str:
    lines = "\n".join(to_json(fn) for fn in functions)
    return fixed_text(version, "tools_block_prefix") + lines + fixed_text(version, "tools_block_suffix")


def response_format_text(version: str, response_format: Any) -> str:
    return fixed_text(version, "response_format_prefix") + to_json(response_format)


def system_extras(version: str, tools: Sequence[Mapping[str, Any]], response_format: Any) -> str:
    """What follows a system (or V4 developer) text: the tools block, the response format."""
    out = ""
    if tools:
        out += "\n\n" + tools_block(version, tools)
    if response_format:
        out += "\n\n" + response_format_text(version, response_format)
    return out


def calls_block(fmt: ToolCallFormat, calls: Sequence[Call]) -> str:
    """The assistant's calls block, leading blank line included; "" without calls."""
    if not calls:
        return ""
    m = fmt.markers_as(DsmlMarkers)
    invokes = "\n".join(_invoke(fmt, c) for c in calls)
    return f"{m.call_prefix}{m.block_open}\n{invokes}\n{m.block_close}"


def _invoke(fmt: ToolCallFormat, call: Call) -> str:
    m = fmt.markers_as(DsmlMarkers)
    params = "\n".join(_parameter(fmt, k, v) for k, v in call.arguments.items())
    return f"{m.invoke_open}{call.name}{m.tag_end}\n{params}\n{m.invoke_close}"


def _parameter(fmt: ToolCallFormat, key: str, value: Any) -> str:
    m = fmt.markers_as(DsmlMarkers)
    is_str = isinstance(value, str)
    text = value if is_str else to_json(value)
    flag = "true" if is_str else "false"
    return f"{m.param_open}{key}{m.string_attr}{flag}{m.tag_end}{text}{m.param_close}"


_PATTERNS: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {}


def _neutral_patterns(fmt: ToolCallFormat) -> tuple[re.Pattern[str], re.Pattern[str]]:
    if fmt.name not in _PATTERNS:
        _PATTERNS[fmt.name] = _compile_neutral(fmt)
    return _PATTERNS[fmt.name]


def _compile_neutral(fmt: ToolCallFormat) -> tuple[re.Pattern[str], re.Pattern[str]]:
    dsml = fmt.markers_as(DsmlMarkers).dsml
    bar = dsml[0]
    tags = {fmt.reasoning_open, fmt.reasoning_close}
    tags |= {v for k, v in fmt.markers.named_texts() if k.startswith(("result", "results"))}
    after_lt = sorted({re.escape(t[1:]) for t in tags if t} | {re.escape(bar), re.escape("/" + bar)}, key=len)
    tag = re.compile(f"<(?=(?:{'|'.join(reversed(after_lt))}))")
    return tag, re.compile(re.escape(bar) + f"(?={re.escape(dsml[1:])})")


def neutralize(fmt: ToolCallFormat, text: str) -> str:
    """Untrusted text with every would-be control token or result tag broken by a ZWJ."""
    tag, dsml = _neutral_patterns(fmt)
    text = tag.sub("<" + ZWJ, text)
    return dsml.sub(lambda mo: mo.group(0) + ZWJ, text)
