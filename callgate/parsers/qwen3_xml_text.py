"""The states of the qwen3-xml machine that read free text: the start of the output,
reasoning, and content up to the first call (the decisions on trimming and `<think>` are
in qwen3_xml.py's docstring).

Knows: the content and reasoning markers (qwen3_xml_syntax). Does not know: the block
(qwen3_xml_block.py) or how `feed` drives the machine (qwen3_xml.py). States return as
in qwen3_xml_block.py.
"""

from __future__ import annotations

from callgate.parsers.base import CallIdFactory, Tools
from callgate.parsers.qwen3_xml_block import Qwen3XmlBlockReader
from callgate.parsers.qwen3_xml_syntax import Call, Syntax
from callgate.types import ReasoningDelta


class Qwen3XmlTextReader(Qwen3XmlBlockReader):
    """The free-text states, and how content and reasoning text is emitted."""

    def __init__(self, syntax: Syntax, tools: Tools, *, call_ids: CallIdFactory) -> None:
        super().__init__(syntax, tools, call_ids=call_ids)
        self._ws = ""  # whitespace held back at the end of the content so far
        self._skip_newlines = False  # after </think>: the content loses its leading newlines
        self._nl = ""  # newlines held back at the end of the reasoning so far
        self._reasoning_start = True

    # ---- emitting ------------------------------------------------------------------------

    def _emit_content(self, text: str) -> None:
        if self._skip_newlines:
            text = text.lstrip("\n")
            if not text:
                return
            self._skip_newlines = False
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        self._emit_text(self._ws + body)
        self._ws = text[len(body) :]

    def _emit_reasoning(self, text: str) -> None:
        if self._reasoning_start:
            text = text.lstrip("\n")
            if not text:
                return
            self._reasoning_start = False
        body = text.rstrip("\n")
        if not body:
            self._nl += text
            return
        reasoning = self._nl + body
        self._builder.reasoning(reasoning)
        self._out.append(ReasoningDelta(reasoning))
        self._nl = text[len(body) :]

    # ---- outside calls -------------------------------------------------------------------

    def _start(self, buf: str, pos: int) -> int:
        opener = self._sx.think_open
        if buf.startswith(opener, pos):
            self._state = self._reasoning
            return pos + len(opener)
        if opener.startswith(buf[pos:]):
            return ~pos
        self._state = self._content
        return pos

    def _content(self, buf: str, pos: int) -> int:
        sx = self._sx
        m = sx.content.pattern.search(buf, pos)
        if m is None:
            end = sx.content.hold_from(buf, pos)
            self._emit_content(buf[pos:end])
            return ~end
        i, tag = m.start(), m.group()
        self._emit_content(buf[pos:i])
        if tag == sx.call_open:
            self._ws = ""
            return self._open_call(i)
        if tag == sx.eos:
            self._emit_text(self._ws)
            self._ws = ""
            self._state = self._ended
            return m.end()
        if tag == sx.fn_open:
            self._ws = ""
            self._call = Call(self._abs(i))
            self._fail("missing_tool_call_open", sx.call_open, tag, self._abs(i))
            return i
        self._diagnose("unbalanced_tags", "text or a call", tag, self._abs(i), self._abs(m.end()), self._abs(i))
        self._emit_content(tag)
        return m.end()

    def _reasoning(self, buf: str, pos: int) -> int:
        sx = self._sx
        m = sx.reasoning.pattern.search(buf, pos)
        if m is None:
            end = sx.reasoning.hold_from(buf, pos)
            self._emit_reasoning(buf[pos:end])
            return ~end
        i, tag = m.start(), m.group()
        self._emit_reasoning(buf[pos:i])
        if tag == sx.think_close:
            self._state = self._content
            self._skip_newlines = True
            return m.end()
        if tag == sx.eos:
            self._diagnose("missing_think_end", sx.think_close, tag, self._abs(i), self._abs(m.end()), self._abs(i))
            self._state = self._ended
            return m.end()
        self._diagnose("call_in_reasoning", sx.think_close, tag, self._abs(i), self._abs(m.end()), self._abs(i))
        self._emit_reasoning(tag)
        return m.end()
