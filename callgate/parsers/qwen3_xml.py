"""The strict incremental parser of the qwen3-xml family (Qwen3-Coder XML tool calls).

Knows: the completion grammar of golden/qwen3-xml/FORMAT.md section 6, spelled with the
markers of the format spec. Does not know: templates, engines, HTTP.

    [<think> reasoning </think>] content (<tool_call>\\n<function=NAME>\\n
        (<parameter=P>\\nVALUE\\n</parameter>\\n)* </function>\\n</tool_call>)  joined by \\n
    [<|im_end|>]

One state machine serves both paths: `feed` hands each state the unconsumed text from
its position; a state consumes what it can decide and, when the rest may be the start
of a marker, keeps it (at most the longest marker) for the next delta, so `feed` costs
O(len(delta)) amortised and never re-scans. parse(text) == feed(text) + finish().
A delta that arrives with nothing held and holds no character that can start one of
the current state's markers skips the machine (text, reasoning and value fragments; value
text followed by the start of its end marker too). Inside tag text the machine can only
hold text back until the tag ends, so deltas are collected unread until the newline that
follows the tag arrives (at most _MAX_WAIT_CHARS), then read at once (`_wait_in_tag`).
This module drives the machine (`feed`, its shortcuts, `finish`); the states live in
qwen3_xml_text (free text) and qwen3_xml_block (calls), the markers and their MarkerSets
in qwen3_xml_syntax, typed values in qwen3_xml_values.

Decisions where the golden rules leave room, all documented here:
* Content before the first call is trimmed (the template trims it); content without a
  call is kept as written. Streaming cannot take back text, so only whitespace that is
  still held back is dropped: trailing whitespace before a call always, leading
  whitespace only when nothing but whitespace precedes the first call.
* `<think>` opens reasoning only at the very start (or `thinking=True`); each
  `<tool_call>` inside reasoning is `call_in_reasoning` and stays reasoning text.
* A malformed block yields one diagnostic and no candidate; the parser then skips to
  that block's `</tool_call>` (or to the next `<tool_call>`, which starts a new call, or
  to `<|im_end|>`), so later calls are still read and nothing becomes content.
* Text after the calls or after `<|im_end|>` is neither content nor dropped silently:
  `trailing_text`, or `text_between_calls` when another call follows it.
* `CallStart` is emitted once the function name is read; a string-typed value streams
  as escaped JSON fragments while it arrives, other values when they are complete.
"""

from __future__ import annotations

from collections.abc import Callable

from callgate.formats import ToolCallFormat
from callgate.parsers.base import CallIdFactory, Tools
from callgate.parsers.qwen3_xml_block import State
from callgate.parsers.qwen3_xml_syntax import Syntax, syntax_of
from callgate.parsers.qwen3_xml_text import Qwen3XmlTextReader
from callgate.types import ArgumentsDelta, Event, ParseResult, TextDelta

_MAX_WAIT_CHARS = 128  # at most this much text is held unread inside a tag
# Held text that starts a marker from its fourth character on ("\n</p", "</fu", "<too"):
# shorter starts ("<", "</", "\n<") are common in text and values, which must not stall
# waiting for a ">", so they are read again with the next delta instead.
_DISTINCT_CHARS = 4


def make_parser(fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> Qwen3XmlParser:
    """A fresh parser for one output. `thinking`: the output starts inside reasoning."""
    return Qwen3XmlParser(syntax_of(fmt), tools, thinking=thinking, call_ids=call_ids)


class Qwen3XmlParser(Qwen3XmlTextReader):
    """Per-request incremental parser; see the module docstring for the grammar. The
    states are read by qwen3_xml_text.py (free text) and qwen3_xml_block.py (calls)."""

    def __init__(self, syntax: Syntax, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> None:
        super().__init__(syntax, tools, call_ids=call_ids)
        self._held = ""  # unconsumed tail: at most a partial marker
        self._done = False
        self._state = self._reasoning if thinking else self._start
        # state -> what it does with a delta when nothing is held, without the machine;
        # None: the machine must read it
        self._fast: dict[State, Callable[[str], list[Event]]] = {
            self._start: self._quick_start,
            self._content: self._quick_content,
            self._reasoning: self._quick_reasoning,
            self._value: self._quick_value,
        }
        # tag states -> what they wait for before reading on (see `_wait_in_tag`)
        sep, end = syntax.sep[-1], syntax.tag_end
        self._tag_waits: dict[State, tuple[str, int]] = {
            self._name: (sep, 1),
            self._body: (sep, 1),
            self._recover: (end, 1),
            self._stray: (end, 1),
        }
        self._waiting = ""  # deltas held unread until the awaited characters (feed is _feed_wait)
        self._wait_char = "\n"  # the character awaited ...
        self._wait_left = 1  # ... and how many more times
        # `feed` is an attribute, not a method: the current state's fast path, the wait, or
        # the machine, so that a delta costs one call. It is set where the state, the held
        # text or the wait change (`_read`, `_wait_in_tag`, the fast paths, `finish`).
        self.feed: Callable[[str], list[Event]] = self._fast.get(self._state) or self._feed_read
        self._plain_value = syntax.plain_value.search  # the per-delta searches, bound once
        self._content_start = syntax.content.starts.search
        # `in` is ~4x cheaper than the search: content deltas seldom hold a marker's first
        # character; "" (always in) when the markers start with different characters
        self._content_first = syntax.content.firsts if len(syntax.content.firsts) == 1 else ""

    # ---- driving -------------------------------------------------------------------------

    def _feed_read(self, delta: str) -> list[Event]:
        return self._read(delta) if delta else []

    def _feed_wait(self, delta: str) -> list[Event]:
        """Inside a tag: nothing to decide before the awaited characters (`_wait_in_tag`)."""
        waiting = self._waiting + delta  # at most _MAX_WAIT_CHARS: copying is cheaper than a list
        char = self._wait_char
        if char in delta:
            left = self._wait_left = self._wait_left - delta.count(char)
            if left <= 0:
                self._waiting = ""
                return self._read(waiting)
        if len(waiting) >= _MAX_WAIT_CHARS:
            self._waiting = ""
            return self._read(waiting)
        self._waiting = waiting
        return []

    @staticmethod
    def _feed_done(delta: str) -> list[Event]:
        del delta
        return []

    def _read(self, delta: str) -> list[Event]:
        """Run the machine on the held text and `delta`; wait where it stops inside a tag."""
        out: list[Event] = []
        self._out = out
        buf = self._held + delta if self._held else delta
        pos, n = 0, len(buf)
        while pos < n:
            pos = self._state(buf, pos)
            if pos < 0:  # the state needs more text: it keeps buf[~pos:]
                pos = ~pos
                break
        held = self._held = buf[pos:]
        self._base += pos
        quick = None if held else self._fast.get(self._state)
        if quick is None:
            self._wait_in_tag()
        else:  # a fast path needs no wait
            self.feed = quick
        return out

    def _wait_in_tag(self) -> None:
        """Where the machine stopped inside tag text, hold the next deltas unread until
        reading on can yield something. Every tag of a block is followed by a newline, so the
        wait counts newlines: the one after the tag being read (before a value or the next
        tag); after a value's closing tag, the one after the next tag too (it yields nothing
        before it); after a call opener, the ones after the function tag and the first
        parameter tag (`CallStart` comes with the first parameter's key: one machine run
        instead of two). Text outside blocks waits for the ">" of its tag. Reading later
        changes nothing but when the tags' events come out: the machine gives the same
        events for any split. Sets `feed`."""
        state = self._state
        wait = self._tag_waits.get(state)
        if wait is None:
            held, sx = self._held, self._sx
            if state == self._value:
                if len(held) < _DISTINCT_CHARS:
                    self.feed = self._quick_held_value if held else self._quick_value
                    return
                wait = (sx.sep[-1], 2)
            elif state == self._literal:
                call = self._call
                to_value = call.literal == sx.sep and call.literal_then == self._open_value
                wait = (sx.sep[-1], call.literal.count(sx.sep[-1]) + (not to_value))
            elif state == self._between:  # "\n<tool_call>" yields nothing: as after a call opener
                wait = (sx.sep[-1], 4 - held.count(sx.sep[-1]))
            elif (state == self._content or state == self._reasoning) and len(held) >= _DISTINCT_CHARS:
                opener = state == self._content and sx.call_open.startswith(held)
                wait = (sx.sep[-1], 3) if opener else (sx.tag_end, 1)
            else:
                self.feed = self._feed_read
                return
        self._waiting = ""
        self._wait_char, self._wait_left = wait
        self.feed = self._feed_wait

    def finish(self) -> list[Event]:
        if self._done:
            return []
        events: list[Event] = []
        if self.feed == self._feed_wait:
            events = self._read(self._waiting)
            self._waiting = ""
        self._done = True
        self.feed = self._feed_done
        self._out = []
        end = self._base + len(self._held)
        self._finish_state(self._held, end)
        self._held = ""
        return events + self._out

    def result(self) -> ParseResult:
        return self._builder.result()

    def _finish_state(self, held: str, end: int) -> None:
        state = self._state
        if state in (self._start, self._content):
            self._emit_content(held)
            self._emit_text(self._ws)
        elif state == self._reasoning:
            self._emit_reasoning(held)
            self._diagnose("missing_think_end", self._sx.think_close, "end of text", self._base, end, self._base)
        elif state == self._between:
            if held:
                self._diagnose("trailing_text", "end of text", held, self._base, end, self._base)
        elif state == self._stray:
            self._diagnose("trailing_text", "end of text", "text", self._stray_start, end, self._stray_start)
        elif state not in (self._recover, self._ended):
            self._diagnose("unterminated_block", "the rest of the call", "end of text", self._call.start, end, end)

    # ---- shortcuts for feed: the machine's outcome, with less work ------------------------

    def _quick_value(self, delta: str) -> list[Event]:
        """A value delta without a whole marker: its text is taken, up to where a marker may
        start (held back, as `_value` does)."""
        call = self._call
        if self._plain_value(delta) is None and delta:  # the common case: nothing to escape
            self._base += len(delta)
            call.raw.append(delta)
            # argument fragments do not change the result: the builder needs not see them
            return [ArgumentsDelta(call.index, delta)] if call.value_streams else []
        markers = self._sx.value
        start = markers.starts.search(delta)
        if start is None:  # only characters to escape
            at = len(delta)
        elif delta[start.start() :] in markers.waiting:  # the start of the end marker, say
            at = start.start()
        elif markers.pattern.search(delta) is None:  # a newline in the value, say
            at = markers.hold_from(delta, 0)
        else:
            return self._read(delta)
        self._base += at
        out: list[Event] = []
        self._out = out
        self._value_text(delta[:at])
        if at < len(delta):
            self._held = delta[at:]
            self._wait_in_tag()
        return out

    def _quick_held_value(self, delta: str) -> list[Event]:
        """A value holding back a short start of a marker ("\n", "\n<", "</"): when the held
        text and `delta` still start one, hold them too."""
        held = self._held + delta
        if held not in self._sx.value.waiting:
            return self._read(delta)
        self._held = held
        self._wait_in_tag()
        return []

    def _quick_start(self, delta: str) -> list[Event]:
        """The first delta, when it cannot start the reasoning opener: content."""
        opener = self._sx.think_open
        if not delta or opener.startswith(delta[: len(opener)]):
            return self._feed_read(delta)
        self._state = self._content
        self.feed = self._quick_content
        return self._quick_content(delta)

    def _quick_content(self, delta: str) -> list[Event]:
        start = self._content_start(delta) if self._content_first in delta else None
        if start is not None:  # text and then the start of a tag (more than a "<") is held back
            at = start.start()
            held = delta[at:]
            if len(held) < 2 or held not in self._sx.content.waiting:
                return self._read(delta)
            self._base += at
            self._out = []
            self._emit_content(delta[:at])
            self._held = held
            self._wait_in_tag()
            return self._out
        self._base += len(delta)
        body = delta.rstrip()
        if self._skip_newlines or not body:
            self._out = []
            self._emit_content(delta)
            return self._out
        text = self._ws + body if self._ws else body  # what _emit_content emits, directly
        self._ws = delta[len(body) :]
        self._builder.text(text)
        return [TextDelta(text)]

    def _quick_reasoning(self, delta: str) -> list[Event]:
        if self._sx.reasoning.starts.search(delta) is not None:
            return self._read(delta)
        self._base += len(delta)
        self._out = []
        self._emit_reasoning(delta)
        return self._out
