"""The states of the JSON-family machine that read a call block: its JSON (scanned once by
parsers/json_scan.py, streamed as it arrives), its close tag, and what a malformed block
reports. Layouts and strictness: see json_calls.py.

Knows: the block markers and call keys of the spec, the shape rules (json_shape.py).
Does not know: text outside blocks (json_text.py) or how `feed` drives the machine.
"""

from __future__ import annotations

import json

from callgate.parsers.json_emit import quote
from callgate.parsers.json_machine import (
    AFTER_CALL,
    AFTER_END,
    BAD_BLOCK,
    BLOCK,
    BLOCK_FAILED,
    BLOCK_TAIL,
    CONTENT,
    WS,
    JsonMachine,
)
from callgate.parsers.json_scan import JsonScanner
from callgate.parsers.json_shape import ShapeError, check_call_list, check_call_object


class JsonBlockReader(JsonMachine):
    """The block states. Each returns as a state handler does (json_machine.py)."""

    # ---- call blocks ---------------------------------------------------------------------

    def _open_block(self, start: int, json_start: int) -> bool:
        spec = self._spec
        streaming = spec.layout != "list"
        self._scan = JsonScanner(spec.name_key if streaming else None, spec.arguments_key if streaming else None)
        self._block_start = self._abs(start)
        self._scan_base = self._abs(json_start)
        self._raw = [self._buf[start:json_start]]
        self._calls.drop()
        self._i = json_start
        self._go(BLOCK)
        return True

    def _block(self) -> bool:
        return self._scanned(self._scan.feed(self._buf, self._i))

    def _scanned(self, j: int) -> bool:
        """The scanner has consumed the buffer up to `j`."""
        scan = self._scan
        self._raw.append(self._buf[self._i : j])
        self._i = j
        if self._undecided:
            verdict = self._verdict()
            if verdict is None:
                return False
            if verdict == "answer":
                return self._answer_so_far()
            self._undecided = False
        self._stream_call()
        if scan.done:
            if self._spec.layout == "object":
                self._go(BLOCK_TAIL)
            else:
                self._close_block(j)
            return True
        if scan.failed:
            self._go(BLOCK_FAILED)
            return True
        return False

    def _verdict(self) -> str | None:
        """json_answer: whether the leading object read so far is a call ("call": its first
        two keys are the name and arguments keys, or it is not JSON) or the answer; None
        while its keys do not tell."""
        scan, spec = self._scan, self._spec
        keys = scan.top_keys
        if keys[:1] not in ([], [spec.name_key]) or keys[1:2] not in ([], [spec.arguments_key]):
            return "answer"
        if len(keys) >= 2 or scan.failed:
            return "call"
        return "answer" if scan.done else None

    def _answer_so_far(self) -> bool:
        """The held object is the answer: its text is content, and so is what follows."""
        self._undecided = False
        self._bare_calls = False
        self._text("".join(self._raw))
        self._go(CONTENT)
        return True

    def _stream_call(self) -> None:
        scan = self._scan
        if not self._calls.open and scan.name:
            self._calls.start(scan.name, None)
        if scan.out:
            self._calls.arguments(scan.take_output())

    def _block_failed(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        err = self._scan.error
        assert err is not None
        json_error, markers = err.code == "invalid_json", spec.block_markers
        tok = markers.at(buf, i) if json_error else None
        if tok is None and json_error and not self._final and markers.could_start(buf, i):
            return False
        offset = self._scan_base + err.offset
        if tok in spec.ends:
            assert tok is not None
            self._diag("unterminated_block", "the rest of the call", quote(tok), (self._block_start, self._abs(i)))
            self._i = i + len(tok)
            self._go(AFTER_END)
            return True
        if tok is not None and tok == spec.block_close and not self._scan.started:
            self._diag("empty_call_block", "a JSON call", quote(tok), (self._block_start, self._abs(i + len(tok))))
            self._i = i + len(tok)
            self._go(AFTER_CALL)
            return True
        if tok is not None and tok == spec.block_open and spec.layout == "object":
            self._diag("unbalanced_tags", "a JSON call object", quote(tok), (self._abs(i), self._abs(i + len(tok))))
            self._i = i + len(tok)
            self._go(BAD_BLOCK)
            return True
        self._diag(err.code, err.expected, quote(err.got), (offset, offset + max(1, len(err.got))))
        if tok is not None and tok == spec.block_close:
            self._i = i + len(tok)
            self._go(AFTER_CALL)
        else:
            self._go(BAD_BLOCK)
        return True

    def _block_tail(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        k = i
        while k < len(buf) and buf[k] in WS:
            k += 1
        self._raw.append(buf[i:k])
        self._i = k
        if k == len(buf):
            return False
        if buf.startswith(spec.block_close, k):
            self._raw.append(spec.block_close)
            self._close_block(k + len(spec.block_close))
            return True
        tok = spec.block_markers.at(buf, k)
        if tok is None and not self._final and spec.block_markers.could_start(buf, k):
            return False
        span = (self._abs(k), self._abs(k + len(tok or buf[k])))
        if tok is None and spec.block_close.startswith(buf[k:]):  # the text ends inside the close tag
            self._i = len(buf)
            self._go(BLOCK_TAIL)
            return False
        if tok in spec.ends:
            self._diag("unterminated_block", quote(spec.block_close), quote(tok), (self._block_start, span[0]))
            self._i = span[1] - self._base
            self._go(AFTER_END)
            return True
        code = "unbalanced_tags" if tok == spec.block_open else "invalid_json"
        self._diag(code, quote(spec.block_close), quote(tok or buf[k]), span)
        self._i = span[1] - self._base
        self._go(BAD_BLOCK)
        return True

    def _close_block(self, end: int) -> None:
        """The block's JSON (and close tag) is complete at buffer position `end`."""
        spec = self._spec
        self._i = end
        self._go(AFTER_CALL)
        span = (self._block_start, self._abs(end))
        raw = "".join(self._raw)
        lo = self._scan_base - self._block_start
        body = raw[lo : lo + self._scan.offset]
        if not body.strip():
            self._diag("empty_call_block", "a JSON call", quote(raw), span)
            return
        value = json.loads(body)  # the scanner read it by strict_json's rule, depth included
        if spec.layout == "single" and isinstance(value, list):
            self._diag("parallel_calls_unsupported", "one call object", "a JSON array", span)
            return
        if spec.layout != "list":
            shape = check_call_object(spec, value)
            if isinstance(shape, ShapeError):
                self._shape_error(shape, span)
            else:
                self._calls.end(shape, raw, span)
            return
        shapes = check_call_list(spec, value)
        if isinstance(shapes, ShapeError):
            self._shape_error(shapes, span)
            return
        for shape, (s, e) in zip(shapes, self._scan.element_spans, strict=True):
            lo = self._scan_base - self._block_start
            self._calls.end(shape, raw[lo + s : lo + e], (self._scan_base + s, self._scan_base + e))

    def _shape_error(self, err: ShapeError, span: tuple[int, int]) -> None:
        if self._spec.layout == "list" and err.element < len(self._scan.element_spans):
            s, e = self._scan.element_spans[err.element]
            span = (self._scan_base + s, self._scan_base + e)
        self._diag(err.code, err.expected, err.got, span)
