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

import json
import re
from dataclasses import dataclass

from callgate.strict_json import MAX_DEPTH, number_value

_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]+')
_WS_RUN = re.compile(r"[ \t\n\r]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_HEX = frozenset("0123456789abcdefABCDEF")
_WS = frozenset(" \t\n\r")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# states
_VALUE, _OBJ_FIRST, _OBJ_KEY, _COLON, _OBJ_NEXT, _ARR_FIRST, _ARR_NEXT = range(7)
_STRING, _ESCAPE, _UNICODE, _NUMBER_ST, _LITERAL, _DONE, _ERROR = range(7, 14)

# feed_delta's answers when it consumed the whole delta and the value goes on: RUNNING, or
# the whole delta was plain string body, streamed (part of the captured object) or not
RUNNING, PLAIN_KEPT, PLAIN_STREAMED = -1, -2, -3


def canonical_string(text: str) -> str:
    """The body of json.dumps(text, ensure_ascii=False) without its quotes."""
    if _NEEDS_ESCAPE.search(text) is None:
        return text
    return json.dumps(text, ensure_ascii=False)[1:-1]


def canonical_number(token: str) -> str | None:
    """json.dumps(json.loads(token)) for a valid number token; None when the strict rule
    refuses it (a double that overflows to infinity, an integer over the digit limit)."""
    value = number_value(token)
    return None if value is None else repr(value)


@dataclass(frozen=True, slots=True)
class ScanError:
    code: str  # "invalid_json" | "duplicate_key"
    expected: str
    got: str
    offset: int  # relative to the first character the scanner was fed


class _Frame:
    __slots__ = ("is_object", "key", "keys")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.keys: set[str] = set()
        self.key = ""


class JsonScanner:
    """One JSON value. `name_key`/`capture_key`: for a call object, remember the string
    under `name_key` and, when that came first, stream the canonical text of the object
    under `capture_key` into `out` (drain it with `take_output`)."""

    __slots__ = (
        "_capture_depth",
        "_feed_start",
        "_hi",
        "_hi_at",
        "_lit",
        "_lit_word",
        "_num",
        "_sb",
        "_stack",
        "_state",
        "_str_is_key",
        "_str_keep",
        "_str_start",
        "_str_stream",
        "_uni",
        "capture_key",
        "captured",
        "element_spans",
        "error",
        "name",
        "name_key",
        "offset",
        "out",
        "top_is_array",
        "top_keys",
        "value_start",
    )

    def __init__(self, name_key: str | None = None, capture_key: str | None = None) -> None:
        self.name_key = name_key
        self.capture_key = capture_key
        self.offset = 0  # characters consumed so far
        self.value_start = -1  # offset of the value's first character
        self.error: ScanError | None = None
        self.name: str | None = None  # the string under name_key at depth 1
        self.top_keys: list[str] = []  # depth-1 keys in order
        self.top_is_array = False
        self.element_spans: list[tuple[int, int]] = []  # depth-1 array elements
        self.captured = False  # the arguments object was streamed into `out`
        self.out: list[str] = []
        self._state = _VALUE
        self._stack: list[_Frame] = []
        self._capture_depth = 0  # stack depth of the captured object while capturing
        self._sb: list[str] = []
        self._str_is_key = False
        self._str_start = 0
        self._str_keep = False
        self._str_stream = False
        self._hi = ""  # pending high surrogate from a \\u escape (a low one must follow)
        self._hi_at = 0  # its offset
        self._uni = ""
        self._num: list[str] = []
        self._lit = ""
        self._lit_word = ""
        self._feed_start = 0

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def failed(self) -> bool:
        return self._state == _ERROR

    @property
    def started(self) -> bool:
        return self.value_start >= 0

    def take_output(self) -> str:
        text = "".join(self.out)
        self.out.clear()
        return text

    # ---- driving -------------------------------------------------------------------------

    def feed(self, text: str, pos: int = 0) -> int:
        end = len(text)
        start = self._feed_start = pos
        while pos < end and self._state < _DONE:
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
            self._state == _STRING
            and not self._hi
            and (
                ('"' not in text and "\\" not in text) if text.isprintable() else _PLAIN_RUN.fullmatch(text) is not None
            )
        ):
            self.offset += len(text)
            if self._str_keep:
                self._sb.append(text)
            return PLAIN_STREAMED if self._str_stream else PLAIN_KEPT
        pos, end = 0, len(text)
        self._feed_start = 0
        while pos < end and self._state < _DONE:
            pos = self._step(text, pos, end)
        self.offset += pos
        return RUNNING if self._state < _DONE else pos

    def finish(self) -> None:
        """The text ended. Completes a pending top-level number; any other open value errs."""
        self._feed_start = self.offset
        if self._state == _NUMBER_ST and not self._stack:
            self._end_number(self.offset, self.offset)
            return
        if self._state < _DONE:
            self._fail("invalid_json", "more JSON", "end of text", self.offset)

    # ---- one step: consume at least one character (or fail) ------------------------------

    def _step(self, text: str, pos: int, end: int) -> int:
        state = self._state
        if state == _STRING:
            return self._string(text, pos)
        ch = text[pos]
        if state in (_VALUE, _OBJ_FIRST, _OBJ_KEY, _COLON, _OBJ_NEXT, _ARR_FIRST, _ARR_NEXT) and ch in _WS:
            m = _WS_RUN.match(text, pos)
            return m.end() if m else pos + 1
        if state == _VALUE:
            return self._value(ch, text, pos)
        if state == _ARR_FIRST:
            if ch == "]":
                return self._close(ch, pos)
            return self._value(ch, text, pos)
        if state in (_OBJ_FIRST, _OBJ_KEY):
            if ch == '"':
                return self._open_string(pos, is_key=True)
            if ch == "}" and state == _OBJ_FIRST:
                return self._close(ch, pos)
            return self._fail_here("invalid_json", 'a key string "..."', ch, pos)
        if state == _COLON:
            if ch != ":":
                return self._fail_here("invalid_json", "':'", ch, pos)
            self._emit(": ")
            self._state = _VALUE
            return pos + 1
        if state in (_OBJ_NEXT, _ARR_NEXT):
            closer = "}" if state == _OBJ_NEXT else "]"
            if ch == ",":
                self._emit(", ")
                self._state = _OBJ_KEY if state == _OBJ_NEXT else _VALUE
                return pos + 1
            if ch == closer:
                return self._close(ch, pos)
            return self._fail_here("invalid_json", f"',' or '{closer}'", ch, pos)
        if state == _ESCAPE:
            return self._escape(ch, pos)
        if state == _UNICODE:
            return self._unicode(ch, pos)
        if state == _NUMBER_ST:
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
            self._stack.append(_Frame(ch == "{"))
            if depth == 0:
                self.top_is_array = ch == "["
            self._emit(ch)
            self._state = _OBJ_FIRST if ch == "{" else _ARR_FIRST
            return pos + 1
        if ch == '"':
            return self._open_string(pos, is_key=False)
        if ch in "-0123456789":
            self._num = [ch]
            self._state = _NUMBER_ST
            return pos + 1
        literal = _LITERALS.get(ch)
        if literal is not None:
            self._lit = literal[1:]
            self._lit_word = literal
            self._state = _LITERAL
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

    def _value_done(self, next_pos: int) -> int:
        stack = self._stack
        if not stack:
            self._state = _DONE
        elif stack[-1].is_object:
            self._state = _OBJ_NEXT
        else:
            self._state = _ARR_NEXT
            if len(stack) == 1:
                start, _ = self.element_spans[-1]
                self.element_spans[-1] = (start, self._abs(next_pos))
        return next_pos

    # ---- strings -------------------------------------------------------------------------

    def _open_string(self, pos: int, *, is_key: bool) -> int:
        depth = len(self._stack)
        self._str_is_key = is_key
        self._str_start = self._abs(pos)
        at_name = (
            not is_key
            and depth == 1
            and self._stack[0].is_object
            and self.name_key is not None
            and self._stack[0].key == self.name_key
        )
        self._str_keep = is_key or at_name
        self._str_stream = bool(self._capture_depth) and not is_key
        self._sb = []
        self._hi = ""
        if self._str_stream:
            self.out.append('"')
        self._state = _STRING
        return pos + 1

    def _piece(self, piece: str) -> None:
        if self._str_keep:
            self._sb.append(piece)
        if self._str_stream:
            self.out.append(canonical_string(piece))

    def _string(self, text: str, pos: int) -> int:
        if self._hi and text[pos] != "\\":
            return self._lone_high(pos)
        m = _PLAIN_RUN.match(text, pos)
        if m is not None:
            if self._str_keep or self._str_stream:
                self._piece(m.group())
            return m.end()
        ch = text[pos]
        if ch == '"':
            return self._close_string(pos)
        if ch == "\\":
            self._state = _ESCAPE
            return pos + 1
        if "\ud800" <= ch <= "\udfff":
            return self._fail_here("invalid_json", "a Unicode scalar value", f"U+{ord(ch):04X}", pos)
        return self._fail_here("invalid_json", "an escaped control character", repr(ch), pos)

    def _close_string(self, pos: int) -> int:
        if self._str_stream:
            self.out.append('"')
        if not self._str_is_key:
            if self._str_keep:
                self.name = "".join(self._sb)
            return self._value_done(pos + 1)
        key = "".join(self._sb)
        frame = self._stack[-1]
        if key in frame.keys:
            self._fail(
                "duplicate_key",
                "a key not used before in this object",
                json.dumps(key, ensure_ascii=False),
                self._str_start,
            )
            return pos
        frame.keys.add(key)
        frame.key = key
        if len(self._stack) == 1:
            self.top_keys.append(key)
        if self._capture_depth:
            self.out.append(json.dumps(key, ensure_ascii=False))
        self._state = _COLON
        return pos + 1

    def _escape(self, ch: str, pos: int) -> int:
        if self._hi and ch != "u":
            return self._lone_high(pos)
        if ch == "u":
            self._uni = ""
            self._state = _UNICODE
            return pos + 1
        decoded = _SIMPLE_ESCAPES.get(ch)
        if decoded is None:
            return self._fail_here("invalid_json", "a JSON escape", "\\" + ch, pos)
        if self._str_keep or self._str_stream:
            self._piece(decoded)
        self._state = _STRING
        return pos + 1

    def _unicode(self, ch: str, pos: int) -> int:
        if ch not in _HEX:
            return self._fail_here("invalid_json", "a hex digit", ch, pos)
        self._uni += ch
        if len(self._uni) < 4:
            return pos + 1
        self._state = _STRING
        cp = int(self._uni, 16)
        at = self._abs(pos) - 5  # the escape's backslash
        if self._hi:  # strict_json: a high surrogate escape pairs with a low one, never alone
            if not 0xDC00 <= cp <= 0xDFFF:
                return self._lone_high(pos)
            cp = 0x10000 + ((ord(self._hi) - 0xD800) << 10) + (cp - 0xDC00)
            self._hi = ""
        elif 0xD800 <= cp <= 0xDBFF:
            self._hi, self._hi_at = chr(cp), at
            return pos + 1
        elif 0xDC00 <= cp <= 0xDFFF:
            self._fail("invalid_json", "a surrogate pair (high then low escape)", "\\u" + self._uni, at)
            return pos
        if self._str_keep or self._str_stream:
            self._piece(chr(cp))
        return pos + 1

    def _lone_high(self, pos: int) -> int:
        """A high surrogate escape not followed by a low one: an error at the high escape."""
        got = f"\\u{ord(self._hi):04x}"
        self._fail("invalid_json", "a surrogate pair (high then low escape)", got, self._hi_at)
        return pos

    # ---- numbers and literals ------------------------------------------------------------

    def _number(self, ch: str, pos: int) -> int:
        if ch in _NUMBER_CHARS:
            self._num.append(ch)
            return pos + 1
        return self._end_number(pos, self._abs(pos))

    def _end_number(self, pos: int, abs_pos: int) -> int:
        token = "".join(self._num)
        start = abs_pos - len(token)
        if _NUMBER.fullmatch(token) is None:
            self._fail("invalid_json", "a JSON number", token, start)
            return pos
        canonical = canonical_number(token)
        if canonical is None:
            self._fail("invalid_json", "a number in range", token, start)
            return pos
        self._emit(canonical)
        return self._value_done(pos)

    def _literal(self, ch: str, pos: int) -> int:
        if ch != self._lit[0]:
            return self._fail_here("invalid_json", repr(self._lit_word), ch, pos)
        self._lit = self._lit[1:]
        if self._lit:
            return pos + 1
        self._emit(self._lit_word)
        return self._value_done(pos + 1)

    # ---- helpers -------------------------------------------------------------------------

    def _emit(self, text: str) -> None:
        if self._capture_depth:
            self.out.append(text)

    def _abs(self, pos: int) -> int:
        """Offset (scanner coordinates) of position `pos` of the text being fed."""
        return self.offset + pos - self._feed_start

    def _fail_here(self, code: str, expected: str, got: str, pos: int) -> int:
        self._fail(code, expected, got, self._abs(pos))
        return pos

    def _fail(self, code: str, expected: str, got: str, offset: int) -> None:
        self.error = ScanError(code, expected, got, offset)
        self._state = _ERROR
