"""Strict incremental scanner for one JSON value (RFC 8259), fed piece by piece.

Knows: JSON syntax -- nesting, strings and their escapes, numbers, literals -- and reads it
by the one strict rule of callgate/strict_json.py: it rejects single quotes, trailing commas,
control characters in strings, NaN/Infinity, numbers out of range, duplicate object keys,
lone surrogates (escaped or raw) and nesting past MAX_DEPTH. For a *call object* it also
knows two things: the string under its name key, and the canonical text
(`json.dumps(..., ensure_ascii=False)`) of its arguments object, produced as the value
arrives so that a parser can stream it.
Does not know: any wire format's markers, tools, call ids or events.

    scanner.feed(text, pos) -> int
        consumes text[pos:] and returns where it stopped: len(text) when the value is not
        complete yet, the index just after the value when it is (`done`), or the index of
        the offending character (`error` holds (code, expected, got, offset)).
    scanner.finish() -> None      the text ended: completes a top-level number, or errs.
    scanner.feed_delta(text) -> int
        `feed(text)` for a streaming parser: says with a negative answer that the value
        goes on after `text` (and whether `text` was all plain string body, read in one step).

Cost is O(consumed): runs of plain string characters and whitespace are skipped with one
regex match each, and nothing already consumed is looked at again.
"""

from __future__ import annotations

import re

from callgate.parsers.json_scan_state import (
    ARR_FIRST,
    ARR_NEXT,
    COLON,
    DONE,
    ESCAPE,
    LITERAL,
    NUMBER,
    OBJ_FIRST,
    OBJ_KEY,
    OBJ_NEXT,
    PLAIN_RUN,
    STRING,
    UNICODE,
    VALUE,
    Frame,
)
from callgate.parsers.json_tokens import JsonTokenReader
from callgate.strict_json import MAX_DEPTH

_WS_RUN = re.compile(r"[ \t\n\r]+")
_WS = frozenset(" \t\n\r")
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# feed_delta's answers when it consumed the whole delta and the value goes on: RUNNING, or
# the whole delta was plain string body, streamed (part of the captured object) or not
RUNNING, PLAIN_KEPT, PLAIN_STREAMED = -1, -2, -3


class JsonScanner(JsonTokenReader):
    """One JSON value. `name_key`/`capture_key`: for a call object, remember the string
    under `name_key` and, when that came first, stream the canonical text of the object
    under `capture_key` into `out` (drain it with `take_output`)."""

    __slots__ = ()

    # ---- driving -------------------------------------------------------------------------

    def feed(self, text: str, pos: int = 0) -> int:
        end = len(text)
        start = self._feed_start = pos
        while pos < end and self._state < DONE:
            pos = self._step(text, pos, end)
        self.offset += pos - start
        return pos

    def feed_delta(self, text: str) -> int:
        """`feed(text)` for a streaming parser. Where the value stopped (done or failed) in
        `text`, that index, as `feed` returns it. Else a negative answer: PLAIN_STREAMED or
        PLAIN_KEPT when `text` lies wholly inside the current string and has no quote,
        backslash or control character (read in one step; when the string is part of the
        streamed arguments, STREAMED, the caller sends `text`, which is already canonical,
        as the next fragment: it does not go into `out`); RUNNING otherwise."""
        # isprintable() is false for every control character: measured 2x faster than the
        # regex, which decides only for the rest (non-printable but legal characters)
        if (
            self._state == STRING
            and not self._hi
            and (
                ('"' not in text and "\\" not in text) if text.isprintable() else PLAIN_RUN.fullmatch(text) is not None
            )
        ):
            self.offset += len(text)
            if self._str_keep:
                self._sb.append(text)
            return PLAIN_STREAMED if self._str_stream else PLAIN_KEPT
        pos, end = 0, len(text)
        self._feed_start = 0
        while pos < end and self._state < DONE:
            pos = self._step(text, pos, end)
        self.offset += pos
        return RUNNING if self._state < DONE else pos

    def finish(self) -> None:
        """The text ended. Completes a pending top-level number; any other open value errs."""
        self._feed_start = self.offset
        if self._state == NUMBER and not self._stack:
            self._end_number(self.offset, self.offset)
            return
        if self._state < DONE:
            self._fail("invalid_json", "more JSON", "end of text", self.offset)

    # ---- one step: consume at least one character (or fail) ------------------------------

    def _step(self, text: str, pos: int, end: int) -> int:
        state = self._state
        if state == STRING:
            return self._string(text, pos)
        ch = text[pos]
        if state in (VALUE, OBJ_FIRST, OBJ_KEY, COLON, OBJ_NEXT, ARR_FIRST, ARR_NEXT) and ch in _WS:
            m = _WS_RUN.match(text, pos)
            return m.end() if m else pos + 1
        if state == VALUE:
            return self._value(ch, text, pos)
        if state == ARR_FIRST:
            if ch == "]":
                return self._close(ch, pos)
            return self._value(ch, text, pos)
        if state in (OBJ_FIRST, OBJ_KEY):
            if ch == '"':
                return self._open_string(pos, is_key=True)
            if ch == "}" and state == OBJ_FIRST:
                return self._close(ch, pos)
            return self._fail_here("invalid_json", 'a key string "..."', ch, pos)
        if state == COLON:
            if ch != ":":
                return self._fail_here("invalid_json", "':'", ch, pos)
            self._emit(": ")
            self._state = VALUE
            return pos + 1
        if state in (OBJ_NEXT, ARR_NEXT):
            closer = "}" if state == OBJ_NEXT else "]"
            if ch == ",":
                self._emit(", ")
                self._state = OBJ_KEY if state == OBJ_NEXT else VALUE
                return pos + 1
            if ch == closer:
                return self._close(ch, pos)
            return self._fail_here("invalid_json", f"',' or '{closer}'", ch, pos)
        if state == ESCAPE:
            return self._escape(ch, pos)
        if state == UNICODE:
            return self._unicode(ch, pos)
        if state == NUMBER:
            return self._number(ch, pos)
        return self._literal(ch, pos)

    # ---- values --------------------------------------------------------------------------

    def _value(self, ch: str, text: str, pos: int) -> int:
        depth = len(self._stack)
        if self.value_start < 0 and (ch in '{["-0123456789' or ch in _LITERALS):
            self.value_start = self._abs(pos)
        if depth == 1 and not self._stack[0].is_object:
            self.element_spans.append((self._abs(pos), -1))
        if ch == "{" or ch == "[":
            if depth >= MAX_DEPTH:
                return self._fail_here("invalid_json", f"at most {MAX_DEPTH} nested arrays and objects", ch, pos)
            self._maybe_start_capture(ch, depth)
            self._stack.append(Frame(ch == "{"))
            if depth == 0:
                self.top_is_array = ch == "["
            self._emit(ch)
            self._state = OBJ_FIRST if ch == "{" else ARR_FIRST
            return pos + 1
        if ch == '"':
            return self._open_string(pos, is_key=False)
        if ch in "-0123456789":
            self._num = [ch]
            self._state = NUMBER
            return pos + 1
        literal = _LITERALS.get(ch)
        if literal is not None:
            self._lit = literal[1:]
            self._lit_word = literal
            self._state = LITERAL
            return pos + 1
        return self._fail_here("invalid_json", "a JSON value", ch, pos)

    def _maybe_start_capture(self, ch: str, depth: int) -> None:
        if (
            depth == 1
            and ch == "{"
            and self.capture_key is not None
            and self._stack[0].is_object
            and self._stack[0].key == self.capture_key
            and self.name
        ):
            self._capture_depth = 2
            self.captured = True

    def _close(self, ch: str, pos: int) -> int:
        self._emit(ch)
        self._stack.pop()
        if self._capture_depth and len(self._stack) < self._capture_depth:
            self._capture_depth = 0
        return self._value_done(pos + 1)
