"""The states of the JSON-family machine that read text outside call blocks: the start
of the output, reasoning, content, and what follows a block (the next block, the end of
turn, or text that is an error there). Layouts and strictness: see json_calls.py.

Knows: the markers of the spec and what each means in free text (json_spec.Action).
Does not know: a block's JSON (json_block.py) or how `feed` drives the machine.
"""

from __future__ import annotations

from callgate.parsers.json_block import JsonBlockReader
from callgate.parsers.json_emit import quote
from callgate.parsers.json_machine import (
    AFTER_CALL,
    AFTER_END,
    BAD_BLOCK,
    CONTENT,
    REASONING,
    SINGLE_TAIL,
    TRAILING,
)
from callgate.types import ReasoningDelta

_LLAMA_TAIL_SKIP = " \t\r\n;"


class JsonTextReader(JsonBlockReader):
    """The free-text states. Each returns as a state handler does (json_machine.py)."""

    # ---- free text -----------------------------------------------------------------------

    def _start(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        rest = buf[i:]
        if spec.layout == "single":
            if rest[:1] == "{" and self._json_answer:
                self._undecided = True
                return self._open_block(i, i)
            if rest[:1] in ("{", "[") and self._bare_calls and not self._json_answer:
                return self._open_block(i, i)
            if rest.startswith(spec.block_open):
                return self._open_block(i, i + len(spec.block_open))
            if not self._final and spec.block_open.startswith(rest):
                return False
            if self._json_answer and rest:
                self._bare_calls = False  # the answer: JSON in it is text, as without tools
        elif spec.reasoning_open:
            if rest.startswith(spec.reasoning_open):
                self._i = i + len(spec.reasoning_open)
                self._r_start = self._abs(i)
                self._go(REASONING)
                return True
            if not self._final and spec.reasoning_open.startswith(rest):
                return False
        self._go(CONTENT)
        return True

    def _content(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        markers = spec.content_markers
        m = markers.find(buf, i)
        if m is None:
            stop = len(buf) if self._final else markers.hold_from(buf, i)
            if not self._final and spec.separator and buf.endswith(spec.separator, i, stop):
                stop -= len(spec.separator)  # dropped if a call follows
            self._text(buf[i:stop])
            self._i = stop
            return False
        k, tok = m.start(), m.group()
        action = spec.content_actions[tok]
        text = buf[i:k]
        if action == "block" and spec.separator and text.endswith(spec.separator):
            text = text[: -len(spec.separator)]
        self._text(text)
        self._i = k + len(tok)
        span = (self._abs(k), self._abs(k + len(tok)))
        if action == "block":
            return self._open_block(k, k + len(tok))
        if action == "end":
            self._go(AFTER_END)
        elif action == "text_before_call" and tok != spec.block_open and not self._bare_calls:
            self._text(tok)  # no tools declared: JSON in an answer is just text
        elif action == "text_before_call":
            self._diag("text_before_call", "a call only at the start of the output", quote(tok), span)
            self._i = k
            self._go(BAD_BLOCK)
        else:
            code = {"unbalanced": "unbalanced_tags", "stray_think": "stray_think_tag"}.get(
                action, "special_token_in_content"
            )
            self._diag(code, "plain text", quote(tok), span)
        return True

    def _reasoning(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        markers = spec.reasoning_markers
        m = markers.find(buf, i)
        stop = m.start() if m else (len(buf) if self._final else markers.hold_from(buf, i))
        self._think(buf[i:stop])
        self._i = stop
        if m is None:
            return False
        tok = m.group()
        self._i = stop + len(tok)
        if tok == spec.reasoning_close:
            self._r_newlines = 0
            self._lstrip = True
            self._go(CONTENT)
        elif tok in spec.ends:
            self._diag("missing_think_end", quote(spec.reasoning_close), quote(tok), (self._r_start, self._abs(stop)))
            self._go(AFTER_END)
        else:
            opens = tok == spec.block_open
            if opens or not self._r_call_open:
                span = (self._abs(stop), self._abs(self._i))
                self._diag("call_in_reasoning", "no call inside reasoning", quote(tok), span)
            self._r_call_open = opens
            self._think(tok)
        return True

    def _think(self, text: str) -> None:
        if not self._r_started:
            text = text.lstrip("\n")
            if not text:
                return
            self._r_started = True
        body = text.rstrip("\n")
        if body:
            self._events.append(ReasoningDelta("\n" * self._r_newlines + body))
            self._r_newlines = 0
        self._r_newlines += len(text) - len(body)

    # ---- after a block -------------------------------------------------------------------

    def _after_call(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        rest = buf[i:]
        if spec.layout == "object":
            nxt = spec.separator + spec.block_open
            if rest.startswith(nxt):
                return self._open_block(i + len(spec.separator), i + len(nxt))
            if rest.startswith(spec.block_open):
                return self._open_block(i, i + len(spec.block_open))
        end = spec.ends_set.at(buf, i)
        if end is not None:
            self._i = i + len(end)
            self._go(AFTER_END)
            return True
        if spec.layout == "list" and rest.startswith(spec.block_open):
            span = (self._abs(i), self._abs(i + len(spec.block_open)))
            self._diag("multiple_call_blocks", "one call block", quote(spec.block_open), span)
            self._go(BAD_BLOCK)
            self._i = i + len(spec.block_open)
            return True
        if not rest or (not self._final and rest in spec.after_call_prefixes):
            return False
        self._trail_start = self._abs(i)
        self._go(SINGLE_TAIL if spec.layout == "single" else TRAILING)
        return True

    def _single_tail(self) -> bool:
        buf, k = self._buf, self._i
        while k < len(buf) and buf[k] in _LLAMA_TAIL_SKIP:
            k += 1
        self._i = k
        if k == len(buf):
            return False
        if buf[k] in "{[":
            span = (self._abs(k), self._abs(k + 1))
            self._diag("parallel_calls_unsupported", "one call", quote(buf[k]), span)
            self._go(BAD_BLOCK)
            return True
        self._go(TRAILING)
        return True

    def _trailing(self) -> bool:
        buf, i = self._buf, self._i
        markers = self._spec.trailing_markers
        m = markers.find(buf, i)
        if m is None:
            self._i = len(buf) if self._final else markers.hold_from(buf, i)
            return False
        k, tok = m.start(), m.group()
        span = (self._trail_start, self._abs(k))
        if tok == self._spec.block_open:
            self._diag("text_between_calls", "only a separator between calls", f"{span[1] - span[0]} characters", span)
            return self._open_block(k, k + len(tok))
        self._diag("trailing_text", "the end of the turn", f"{span[1] - span[0]} characters", span)
        self._i = k + len(tok)
        self._go(AFTER_END)
        return True

    def _bad_block(self) -> bool:
        buf, i = self._buf, self._i
        markers = self._spec.skip_markers
        m = markers.find(buf, i)
        if m is None:
            self._i = len(buf) if self._final else markers.hold_from(buf, i)
            return False
        self._i = m.end()
        self._go(AFTER_END if m.group() in self._spec.ends else AFTER_CALL)
        return True

    def _after_end(self) -> bool:
        if self._i < len(self._buf) and self._end_trail_start < 0:
            self._end_trail_start = self._abs(self._i)
        self._i = len(self._buf)
        return False
