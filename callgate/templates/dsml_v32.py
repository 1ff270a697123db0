"""DeepSeek-V3.2 prompt layout (golden/dsml/FORMAT.md section 3).

Knows: the order and framing of V3.2 turns: raw system text, `<｜User｜>` turns that always
end with the assistant header, developer turns with the question prefix, assistant turns
with reasoning only after the last user turn, and tool results written after the
assistant's end-of-sentence as `<function_results>`. Does not know: message validation
(dsml_messages) or the shared blocks (dsml_blocks).

Raises TemplateError for what the reference refuses: an assistant turn after the last user
turn without reasoning or calls in thinking mode, tool results without (enough) calls, and
in thinking mode with drop_thinking a developer message before the last user message.
"""

from __future__ import annotations

from collections.abc import Sequence

from callgate.errors import TemplateError
from callgate.formats import DsmlV32Markers, ToolCallFormat
from callgate.templates.dsml_blocks import calls_block, fixed_text, neutralize, system_extras
from callgate.templates.dsml_messages import Msg, last_user_index

VERSION = "dsv32"


def render_v32(
    fmt: ToolCallFormat, msgs: Sequence[Msg], *, thinking: bool, drop_thinking: bool, add_bos: bool, header: bool
) -> str:
    """The whole prompt. `header`: write the generation header after a final user turn or
    result group (add_generation_prompt)."""
    last_user = last_user_index(msgs)
    if thinking and drop_thinking:
        _refuse_dropped_developers(msgs, last_user)
    parts = [fmt.bos] if add_bos else []
    for i in range(len(msgs)):
        final = i == len(msgs) - 1
        parts.append(_render_one(fmt, msgs, i, last_user, thinking, header or not final))
    return "".join(parts)


def _refuse_dropped_developers(msgs: Sequence[Msg], last_user: int) -> None:
    # The reference deletes these messages and then fails to render; refuse them by name.
    for m in msgs[:last_user]:
        if m.role == "developer":
            raise TemplateError(
                f"{m.where}: a developer message before the last user message cannot be rendered "
                "in thinking mode with drop_thinking",
                param=m.where,
            )


def _render_one(fmt: ToolCallFormat, msgs: Sequence[Msg], i: int, last_user: int, thinking: bool, header: bool) -> str:
    m = msgs[i]
    if m.task is not None:
        raise TemplateError(f"{m.where}.task: dsml-v3.2 has no quick-instruction tasks", param=f"{m.where}.task")
    marker = fmt.reasoning_open if thinking and i == last_user else fmt.reasoning_close
    mk = fmt.markers_as(DsmlV32Markers)
    assistant_header = f"{mk.assistant}{marker}" if header else ""
    if m.role == "system":
        return (m.content or "") + system_extras(VERSION, m.tools, m.response_format)
    if m.role == "developer":
        body = system_extras(VERSION, m.tools, m.response_format)
        body += fixed_text(VERSION, "developer_question_prefix") + (m.content or "")
        return f"{mk.user}{body}{assistant_header}"
    if m.role == "user":
        return f"{mk.user}{m.content}{assistant_header}"
    if m.role == "assistant":
        return _assistant(fmt, m, thinking and i > last_user)
    if m.role == "tool":
        return _tool_result(fmt, msgs, i, thinking and i >= last_user, header)
    raise TemplateError(f"{m.where}.role: dsml-v3.2 has no role {m.role!r}", param=m.where)


def _assistant(fmt: ToolCallFormat, m: Msg, show_reasoning: bool) -> str:
    thinking_part = ""
    if show_reasoning:
        if not (m.reasoning or m.calls):
            raise TemplateError(
                f"{m.where}.reasoning_content: required in thinking mode for an assistant turn "
                "after the last user message (or tool_calls)",
                param=f"{m.where}.reasoning_content",
            )
        thinking_part = (m.reasoning or "") + (fmt.reasoning_close or "")
    return thinking_part + (m.content or "") + calls_block(fmt, m.calls) + fmt.eos


def _tool_result(fmt: ToolCallFormat, msgs: Sequence[Msg], i: int, open_thinking: bool, header: bool) -> str:
    """The k-th tool message after an assistant turn answers its k-th call (ids ignored)."""
    m, mk = msgs[i], fmt.markers_as(DsmlV32Markers)
    owner = i - 1
    while owner >= 0 and msgs[owner].role == "tool":
        owner -= 1
    if owner < 0 or msgs[owner].role != "assistant" or not msgs[owner].calls:
        raise TemplateError(f"{m.where}: a tool result must follow an assistant message with tool_calls", param=m.where)
    order, n_calls = i - owner, len(msgs[owner].calls)
    if order > n_calls:
        raise TemplateError(
            f"{m.where}: more tool results than the {n_calls} tool call(s) of {msgs[owner].where}", param=m.where
        )
    out = f"\n\n{mk.results_open}" if order == 1 else ""
    out += f"\n{mk.result_open}{neutralize(fmt, m.content or '')}{mk.result_close}"
    if order == n_calls:
        out += f"\n{mk.results_close}"
        if header:
            out += "\n\n" + ((fmt.reasoning_open if open_thinking else fmt.reasoning_close) or "")
    return out
