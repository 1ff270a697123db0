"""DeepSeek-V4 prompt layout (golden/dsml/FORMAT.md section 4).

Knows: V4 preprocessing (tool messages become `<tool_result>` blocks of a user turn,
consecutive user texts share one turn, results follow the order of the last assistant's
call ids), the reasoning policy (old reasoning dropped only with drop_thinking and no
tools), the generation header rule, the max-effort prefix, the latest_reminder role and the
quick-instruction task tokens. Does not know: message validation or the shared blocks.

One deliberate difference from the reference: a `task` on a user message that is merged
into the previous user turn is kept (the reference silently loses it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from callgate.errors import TemplateError
from callgate.formats import DsmlV4Markers, ToolCallFormat
from callgate.templates.dsml_blocks import calls_block, fixed_text, neutralize, system_extras
from callgate.templates.dsml_messages import Msg, last_user_index

VERSION = "dsv4"
EFFORTS = (None, "high", "max")


@dataclass(frozen=True, slots=True)
class _Block:
    text: str
    tool_use_id: str | None = None  # None: a text block; else a tool result


@dataclass(frozen=True, slots=True)
class _Turn:
    msg: Msg
    blocks: tuple[_Block, ...] = ()


def render_v4(
    fmt: ToolCallFormat,
    msgs: Sequence[Msg],
    *,
    thinking: bool,
    drop_thinking: bool,
    reasoning_effort: str | None,
    add_bos: bool,
    header: bool,
) -> str:
    if reasoning_effort not in EFFORTS:
        raise TemplateError(
            f"reasoning_effort: {reasoning_effort!r} is not supported by dsml-v4 (expected 'high' or 'max')",
            param="reasoning_effort",
        )
    for m in msgs:
        if m.task is not None and m.task not in fmt.quick_tasks:
            raise TemplateError(f"{m.where}.task: unknown task {m.task!r}", param=f"{m.where}.task")
    dropping = thinking and drop_thinking and not any(m.tools for m in msgs)
    turns = _sort_results(_merge(msgs))
    if dropping:
        turns = _drop_old_thinking(turns)
    last_user = last_user_index([t.msg for t in turns])
    out = [fmt.bos] if add_bos else []
    if thinking and reasoning_effort == "max" and turns:
        out.append(fixed_text(VERSION, "reasoning_effort_max_prefix"))
    for i in range(len(turns)):
        out.append(_body(fmt, turns, i, thinking=thinking, keep_all=not dropping, last_user=last_user))
        if header or i < len(turns) - 1:
            out.append(_header(fmt, turns, i, thinking=thinking, keep_all=not dropping, last_user=last_user))
    return "".join(out)


def _merge(msgs: Sequence[Msg]) -> list[_Turn]:
    turns: list[_Turn] = []
    for m in msgs:
        prev = turns[-1] if turns and turns[-1].msg.role == "user" else None
        if m.role == "tool":
            block = _Block(m.content or "", m.tool_call_id)
            if prev is not None:
                turns[-1] = replace(prev, blocks=(*prev.blocks, block))
            else:
                turns.append(_Turn(Msg(where=m.where, role="user", content=None), (block,)))
        elif m.role == "user" and prev is not None and prev.msg.task is None:
            turns[-1] = _Turn(replace(prev.msg, task=m.task), (*prev.blocks, _Block(m.content or "")))
        elif m.role == "user":
            turns.append(_Turn(m, (_Block(m.content or ""),)))
        else:
            turns.append(_Turn(m))
    return turns


def _sort_results(turns: list[_Turn]) -> list[_Turn]:
    """Tool results follow the order of the most recent assistant's call ids; text blocks
    keep their slots; unknown ids sort first (position 0), as in the reference."""
    order: dict[str, int] = {}
    out: list[_Turn] = []
    for t in turns:
        if t.msg.role == "assistant" and t.msg.calls:
            order = {cid: k for k, cid in enumerate(t.msg.call_ids) if cid}
        results = [b for b in t.blocks if b.tool_use_id is not None]
        if len(results) > 1 and order:
            ranked = iter(sorted(results, key=lambda b: order.get(b.tool_use_id or "", 0)))
            t = replace(t, blocks=tuple(next(ranked) if b.tool_use_id is not None else b for b in t.blocks))
        out.append(t)
    return out


def _drop_old_thinking(turns: list[_Turn]) -> list[_Turn]:
    """Before the last user turn: assistant reasoning is removed, developer turns are dropped."""
    last_user = last_user_index([t.msg for t in turns])
    out: list[_Turn] = []
    for i, t in enumerate(turns):
        if t.msg.role in ("user", "system", "latest_reminder") or i >= last_user:
            out.append(t)
        elif t.msg.role == "assistant":
            out.append(replace(t, msg=replace(t.msg, reasoning=None)))
    return out


def _body(
    fmt: ToolCallFormat, turns: Sequence[_Turn], i: int, *, thinking: bool, keep_all: bool, last_user: int
) -> str:
    m, mk = turns[i].msg, fmt.markers_as(DsmlV4Markers)
    if m.role == "system":
        return (m.content or "") + system_extras(VERSION, m.tools, m.response_format)
    if m.role == "developer":
        return mk.user + (m.content or "") + system_extras(VERSION, m.tools, m.response_format)
    if m.role == "user":
        return mk.user + "\n\n".join(_block_text(fmt, b) for b in turns[i].blocks)
    if m.role == "latest_reminder":
        return mk.latest_reminder + (m.content or "")
    if m.role == "assistant":
        task_output = i > 0 and turns[i - 1].msg.task is not None
        thinking_part = ""
        if thinking and not task_output and (keep_all or i > last_user):
            thinking_part = (m.reasoning or "") + (fmt.reasoning_close or "")
        return thinking_part + (m.content or "") + calls_block(fmt, m.calls) + fmt.eos
    raise TemplateError(f"{m.where}.role: dsml-v4 has no role {m.role!r}", param=m.where)


def _block_text(fmt: ToolCallFormat, block: _Block) -> str:
    if block.tool_use_id is None:
        return block.text
    m = fmt.markers_as(DsmlV4Markers)
    return m.result_open + neutralize(fmt, block.text) + m.result_close


def _header(
    fmt: ToolCallFormat, turns: Sequence[_Turn], i: int, *, thinking: bool, keep_all: bool, last_user: int
) -> str:
    """What follows turn i: nothing unless an assistant or reminder turn (or the end) comes
    next; then the task token(s), or for user/developer turns the assistant header."""
    if i + 1 < len(turns) and turns[i + 1].msg.role not in ("assistant", "latest_reminder"):
        return ""
    m = turns[i].msg
    open_tag = fmt.reasoning_open if thinking else fmt.reasoning_close
    if m.task is not None:
        token = fmt.quick_tasks[m.task]
        return token if m.task != "action" else f"{fmt.markers_as(DsmlV4Markers).assistant}{open_tag}{token}"
    if m.role in ("user", "developer"):
        opens = thinking and (keep_all or i >= last_user)
        return fmt.markers_as(DsmlV4Markers).assistant + ((fmt.reasoning_open if opens else fmt.reasoning_close) or "")
    return ""
