"""The state one JSON-family parse shares between its state handlers (json_block.py,
json_text.py, json_calls.py): the buffer and its absolute offsets, the events queued by
the current run, the current state, and how content and diagnostics are queued.

Knows: the states of the machine and the spec it reads (parsers/json_spec.py). Does not
know: what any state reads (the handlers do), or how `feed` drives them (json_calls.py).

A handler reads self._buf from self._i, moves self._i past what it decided, queues events
and returns True to run again (it changed state or consumed text) or False when it needs
more text. Offsets in events are absolute: self._abs(i) for buffer position i.
"""

from __future__ import annotations

from collections.abc import Callable

from callgate.parsers.base import CallIdFactory, ResultBuilder, Tools, tool_names
from callgate.parsers.json_emit import CallEmitter, diagnostic
from callgate.parsers.json_scan import JsonScanner
from callgate.parsers.json_spec import JsonFamilySpec
from callgate.types import Event, TextDelta

WS = " \t\r\n"

# States, plain ints: an Enum member read from its class costs ~90 ns and an Enum key's
# hash a Python call, measured, on every delta.
(
    START,
    REASONING,
    CONTENT,
    BLOCK,  # scanning the JSON of a block
    BLOCK_FAILED,  # the scanner failed; classify the offending text
    BLOCK_TAIL,  # object layout: the JSON is complete, the close tag is due
    BAD_BLOCK,  # skipping a malformed block up to its close (or the end of turn)
    AFTER_CALL,
    SINGLE_TAIL,  # single layout: text after the call object
    TRAILING,  # text where only calls or the end of turn may be
    AFTER_END,  # after the end-of-turn token
) = range(11)


class JsonMachine:
    """The shared state of one parse. Handlers live in the subclasses; the parser
    (json_calls.JsonCallParser) sets `_handlers`, indexed by state, and the first state."""

    _handlers: tuple[Callable[[], bool], ...]  # indexed by state
    _step: Callable[[], bool]  # the current state's handler

    def __init__(self, spec: JsonFamilySpec, tools: Tools, *, call_ids: CallIdFactory, json_answer: bool) -> None:
        self._spec = spec
        # single layout: bare JSON at the start is a call only when tools may be called
        # (golden/llama3-json/FORMAT.md 6: "only ... when tools are enabled"); tools=[] says
        # none are, tools=None that the caller did not say.
        self._bare_calls = tools is None or len(tools) > 0
        # ... and, when a JSON answer may stand there too, only when call-shaped
        self._json_answer = json_answer and spec.layout == "single" and self._bare_calls
        self._undecided = False  # a leading object whose keys do not yet tell call from answer
        self._builder = ResultBuilder()
        self._events: list[Event] = []
        self._calls = CallEmitter(spec.format, tool_names(tools), call_ids, self._events)
        self._buf = ""
        self._base = 0  # absolute offset of _buf[0]
        self._i = 0  # position in _buf of the first unconsumed character
        self._final = False
        self._state = START
        # reasoning
        self._r_start = 0
        self._r_started = False
        self._r_newlines = 0
        self._r_call_open = False
        self._lstrip = False  # content after reasoning loses its leading newlines
        # the current block
        self._block_start = 0
        self._scan_base = 0
        self._scan = JsonScanner()
        self._raw: list[str] = []  # the block's text so far; its JSON starts at _scan_base
        # trailing text
        self._trail_start = -1
        self._end_trail_start = -1

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> list[Event]:
        while self._step():
            pass
        return self._flush()

    def _go(self, state: int) -> None:
        self._state = state
        self._step = self._handlers[state]

    def _flush(self) -> list[Event]:
        if not self._events:
            return []
        events = self._events[:]
        self._events.clear()
        return self._builder.add(events)

    def _abs(self, i: int) -> int:
        return self._base + i

    def _text(self, text: str) -> None:
        """Queue content (after reasoning, without its leading newlines)."""
        if self._lstrip:
            text = text.lstrip("\n")
            if not text:
                return
            self._lstrip = False
        if text:
            self._events.append(TextDelta(text))

    def _diag(self, code: str, expected: str, got: str, span: tuple[int, int]) -> None:
        self._events.append(diagnostic(code, expected, got, span))
