"""The qwen3-xml format (Qwen3-Coder); see golden/qwen3-xml/FORMAT.md.

Knows: the call layout's markers, the ChatML turn tokens of its framing, its special
tokens. The call layout (FORMAT.md section 4), spelled with these markers and "\\n"
separators:
  <tool_call>\\n<function=NAME>\\n  (<parameter=P>\\nVALUE\\n</parameter>\\n)*  </function>\\n</tool_call>
Values carry no type marker: they are typed by the declared JSON schema of the parameter.
`think_open` / `think_close` are read by the parser only (a leading reasoning block, as
other families that share this syntax write it); the Qwen3-Coder template has no reasoning.
Does not know: rendering, parsing or constraining.
Rendered by templates/qwen3_xml.py, parsed by parsers/qwen3_xml*.py, constrained by
constraints/lark_qwen3_xml.py and lark_qwen3_values.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from callgate.formats.quick_tasks import TEXT_QUICK_TASKS
from callgate.formats.spec import FormatMarkers, ToolCallFormat


@dataclass(frozen=True, slots=True)
class Qwen3XmlMarkers(FormatMarkers):
    """The qwen3-xml texts (see the module docstring for the layout they spell)."""

    turn_open: str
    turn_close: str
    call_open: str
    call_close: str
    function_open: str
    function_close: str
    parameter_open: str
    parameter_close: str
    tag_end: str
    separator: str
    result_open: str
    result_close: str
    think_open: str
    think_close: str


QWEN3_XML = ToolCallFormat(
    name="qwen3-xml",
    family="qwen3-xml",
    framing="chatml-qwen3-coder",
    argument_encoding="schema-typed-text",
    bos="",
    eos="<|im_end|>",
    call_trigger="<tool_call>",
    reasoning_open=None,
    reasoning_close=None,
    markers=Qwen3XmlMarkers(
        turn_open="<|im_start|>",
        turn_close="<|im_end|>",
        call_open="<tool_call>",
        call_close="</tool_call>",
        function_open="<function=",
        function_close="</function>",
        parameter_open="<parameter=",
        parameter_close="</parameter>",
        tag_end=">",
        separator="\n",
        result_open="<tool_response>",
        result_close="</tool_response>",
        think_open="<think>",
        think_close="</think>",
    ),
    special_tokens=(
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ),
    # Qwen3-Coder has no task tokens: a quick head is a plain instruction appended to the
    # last user turn, so the prompt up to the user text is shared with the main request.
    quick_tasks=TEXT_QUICK_TASKS,
)
