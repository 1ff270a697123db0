"""The state of one strict incremental JSON scan (json_scan.JsonScanner), shared by its
structure steps (json_scan.py) and its token readers (json_tokens.py): the scanner's
states, the stack of open containers, what a call object's scan remembers, and how a
value ends or the scan fails.

Knows: JSON's nesting and the strict rule's error shape (ScanError). Does not know: how
any character is read (the subclasses do), markers or events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]+')  # string body that needs no look

# states
VALUE, OBJ_FIRST, OBJ_KEY, COLON, OBJ_NEXT, ARR_FIRST, ARR_NEXT = range(7)
STRING, ESCAPE, UNICODE, NUMBER, LITERAL, DONE, ERROR = range(7, 14)


@dataclass(frozen=True, slots=True)
class ScanError:
    code: str  # "invalid_json" | "duplicate_key"
    expected: str
    got: str
    offset: int  # relative to the first character the scanner was fed


class Frame:
    """One open array or object: its keys so far and the current key."""

    __slots__ = ("is_object", "key", "keys")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.keys: set[str] = set()
        self.key = ""


class JsonScanState:
    """The fields of one scan (see json_scan.JsonScanner for `name_key`/`capture_key`)."""

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
        self._state = VALUE
        self._stack: list[Frame] = []
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
        return self._state == DONE

    @property
    def failed(self) -> bool:
        return self._state == ERROR

    @property
    def started(self) -> bool:
        return self.value_start >= 0

    def take_output(self) -> str:
        text = "".join(self.out)
        self.out.clear()
        return text

    def _value_done(self, next_pos: int) -> int:
        stack = self._stack
        if not stack:
            self._state = DONE
        elif stack[-1].is_object:
            self._state = OBJ_NEXT
        else:
            self._state = ARR_NEXT
            if len(stack) == 1:
                start, _ = self.element_spans[-1]
                self.element_spans[-1] = (start, self._abs(next_pos))
        return next_pos

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
        self._state = ERROR
