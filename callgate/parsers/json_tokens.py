"""The token readers of the strict incremental JSON scan: strings (with their escapes
and surrogates), numbers and literals, by the one strict rule of callgate/strict_json.py,
and the canonical text (`json.dumps(..., ensure_ascii=False)`) a streamed call's arguments
are written in.

Knows: JSON's token syntax, duplicate keys, what the captured arguments stream (`out`).
Does not know: nesting or driving (json_scan.py), markers or events.
"""

from __future__ import annotations

import json
import re

from callgate.parsers.json_scan_state import (
    COLON,
    ESCAPE,
    PLAIN_RUN,
    STRING,
    UNICODE,
    JsonScanState,
)
from callgate.strict_json import number_value

_NUMBER_TOKEN = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


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


class JsonTokenReader(JsonScanState):
    """Strings, numbers and literals; each step returns the position after what it read
    (or the offending position, having failed)."""

    __slots__ = ()

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
        self._state = STRING
        return pos + 1

    def _piece(self, piece: str) -> None:
        if self._str_keep:
            self._sb.append(piece)
        if self._str_stream:
            self.out.append(canonical_string(piece))

    def _string(self, text: str, pos: int) -> int:
        if self._hi and text[pos] != "\\":
            return self._lone_high(pos)
        m = PLAIN_RUN.match(text, pos)
        if m is not None:
            if self._str_keep or self._str_stream:
                self._piece(m.group())
            return m.end()
        ch = text[pos]
        if ch == '"':
            return self._close_string(pos)
        if ch == "\\":
            self._state = ESCAPE
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
        self._state = COLON
        return pos + 1

    def _escape(self, ch: str, pos: int) -> int:
        if self._hi and ch != "u":
            return self._lone_high(pos)
        if ch == "u":
            self._uni = ""
            self._state = UNICODE
            return pos + 1
        decoded = _SIMPLE_ESCAPES.get(ch)
        if decoded is None:
            return self._fail_here("invalid_json", "a JSON escape", "\\" + ch, pos)
        if self._str_keep or self._str_stream:
            self._piece(decoded)
        self._state = STRING
        return pos + 1

    def _unicode(self, ch: str, pos: int) -> int:
        if ch not in _HEX:
            return self._fail_here("invalid_json", "a hex digit", ch, pos)
        self._uni += ch
        if len(self._uni) < 4:
            return pos + 1
        self._state = STRING
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
        if _NUMBER_TOKEN.fullmatch(token) is None:
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
