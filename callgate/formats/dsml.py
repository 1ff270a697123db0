"""The DSML formats (DeepSeek V3.2 `dsml-v3.2`, V4 `dsml-v4`); see golden/dsml/FORMAT.md.

Knows: the DSML call syntax as typed markers, the two versions' result tags, special
tokens and (v4) quick-task tokens. Does not know: rendering, parsing or constraining
(templates/dsml*.py, parsers/dsml*.py, constraints/*dsml.py read these specs).
Rendered by templates/dsml*.py, parsed by parsers/dsml*.py, constrained by
constraints/lark_dsml.py (lark_params.py, lark_raw.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from callgate.formats.spec import FormatMarkers, ToolCallFormat, frozen

_DSML_BAR = "\uff5c"  # U+FF5C FULLWIDTH VERTICAL LINE, never the ASCII "|"
_DSML = f"{_DSML_BAR}DSML{_DSML_BAR}"
_DSML_BOS = f"<{_DSML_BAR}begin\u2581of\u2581sentence{_DSML_BAR}>"  # U+2581 LOWER ONE EIGHTH BLOCK
_DSML_EOS = f"<{_DSML_BAR}end\u2581of\u2581sentence{_DSML_BAR}>"
_DSML_TASKS = ("action", "query", "authority", "domain", "title", "read_url")


def _dsml_token(name: str) -> str:
    return f"<{_DSML_BAR}{name}{_DSML_BAR}>"


@dataclass(frozen=True, slots=True)
class DsmlMarkers(FormatMarkers):
    """The DSML call syntax, split at the points where a parser or grammar branches.

    block    = "\\n\\n" block_open "\\n" invoke *("\\n" invoke) "\\n" block_close
    invoke   = invoke_open NAME tag_end "\\n" (param *("\\n" param) | "") "\\n" invoke_close
    param    = param_open KEY string_attr ("true" | "false") tag_end VALUE param_close
    """

    block: str  # the block's tag name: "function_calls" (v3.2), "tool_calls" (v4)
    dsml: str
    call_prefix: str
    block_open: str
    block_close: str
    invoke_open: str
    invoke_close: str
    param_open: str
    string_attr: str
    param_close: str
    tag_end: str
    user: str
    assistant: str


@dataclass(frozen=True, slots=True)
class DsmlV32Markers(DsmlMarkers):
    """v3.2: tool results are grouped in a results block of result tags."""

    results_open: str
    results_close: str
    result_open: str
    result_close: str


@dataclass(frozen=True, slots=True)
class DsmlV4Markers(DsmlMarkers):
    """v4: each tool result in its own tag; the latest-reminder token."""

    latest_reminder: str
    result_open: str
    result_close: str


def _syntax(block: str) -> dict[str, str]:
    return {
        "block": block,
        "dsml": _DSML,
        "call_prefix": "\n\n",
        "block_open": f"<{_DSML}{block}>",
        "block_close": f"</{_DSML}{block}>",
        "invoke_open": f'<{_DSML}invoke name="',
        "invoke_close": f"</{_DSML}invoke>",
        "param_open": f'<{_DSML}parameter name="',
        "string_attr": '" string="',
        "param_close": f"</{_DSML}parameter>",
        "tag_end": '">',
        "user": _dsml_token("User"),
        "assistant": _dsml_token("Assistant"),
    }


def _dsml_special_tokens(*extra: str) -> tuple[str, ...]:
    return (_DSML_BOS, _DSML_EOS, _dsml_token("User"), _dsml_token("Assistant"), "<think>", "</think>", _DSML, *extra)


DSML_V32 = ToolCallFormat(
    name="dsml-v3.2",
    family="dsml",
    framing="deepseek-v3.2",
    argument_encoding="dsml-typed",
    bos=_DSML_BOS,
    eos=_DSML_EOS,
    call_trigger=f"\n\n<{_DSML}function_calls>",
    reasoning_open="<think>",
    reasoning_close="</think>",
    markers=DsmlV32Markers(
        **_syntax("function_calls"),
        results_open="<function_results>",
        results_close="</function_results>",
        result_open="<result>",
        result_close="</result>",
    ),
    special_tokens=_dsml_special_tokens(),
)

DSML_V4 = ToolCallFormat(
    name="dsml-v4",
    family="dsml",
    framing="deepseek-v4",
    argument_encoding="dsml-typed",
    bos=_DSML_BOS,
    eos=_DSML_EOS,
    call_trigger=f"\n\n<{_DSML}tool_calls>",
    reasoning_open="<think>",
    reasoning_close="</think>",
    markers=DsmlV4Markers(
        **_syntax("tool_calls"),
        latest_reminder=_dsml_token("latest_reminder"),
        result_open="<tool_result>",
        result_close="</tool_result>",
    ),
    special_tokens=_dsml_special_tokens(_dsml_token("latest_reminder"), *(_dsml_token(t) for t in _DSML_TASKS)),
    quick_tasks=frozen({t: _dsml_token(t) for t in _DSML_TASKS}),
)
