"""Per-step constrained decoding for a vLLM batch over llguidance matchers, without vllm.

Knows: vLLM v1's logits-processor protocol by its method names (`__init__(vllm_config,
device, is_pin_memory)`, `validate_params`, `is_argmax_invariant`, `update_state`, `apply`)
and batch updates (removed, then added, then moved; each added request brings a *live* list
of its output token ids); llguidance's matcher; callgate.kernels. Does not know: formats
(beyond the closers of the format a grammar key names), schemas, HTTP.
`callgate.serving.engines.vllm_engine.CallgateLogitsProcessor` mixes this class with vLLM's base.

A request is constrained when `SamplingParams.extra_args["callgate"]` holds `{"key": str,
"grammar": str, "plain": str, "trigger": str | None, "mode": str, "budget_closing": bool}`
(a ConstraintRef's fields; `plain` is the grammar with markers spelled as text).
Its matcher is a copy of the grammar's first matcher in this process (built once per key:
milliseconds). Each step a row consumes its new tokens, llguidance fills its mask row (the
rows of a batch in parallel) and callgate's kernel masks the logits. A token the matcher
refuses (only possible when another processor changed the sampled token) leaves the row
unconstrained from then on, with a warning; the strict parser downstream judges the output.

Budget closing (closing.py): in a row's last `BOUND` tokens, a closing plan (the bytes that
end the grammar from the row's state, planned on a byte-vocabulary twin of its matcher) is
kept up to date; once the tokens left no longer exceed the plan's tokens plus EOS plus a margin
(`SLACK`, or two more than the most one free token has added to this row's plan), the row follows the plan, token by
token, then EOS, and marks its request (closing_marks.py: the server flags the call it cut
`truncated` and answers `finish_reason: "length"`). So an output never ends mid-call at max_tokens:
a value the model would not close is cut short so that the call closes (the server then
says `finish_reason: "length"`). Once a whole call is written (the grammar accepts and the
row has passed its trigger, or the grammar needs a call) and the tokens left could not hold
another one (the cost of the first, as planned right after its trigger), the row ends (EOS)
instead of starting a call it would have to cut short.

Every `apply` records its time in `timings` and the process-wide `STEP_TIMINGS`
(`mask_time_summary()`); with `CALLGATE_MASK_TIMINGS=/path/file` each step is also appended
to that file (decoding/step_log.py), readable from outside vLLM's engine process.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import llguidance
import llguidance.torch
import torch

from callgate.constraints.llg import LlgVocabulary, matcher
from callgate.decoding import closing_marks
from callgate.decoding.closing import closing_plan, format_closers
from callgate.decoding.step_log import StepLog
from callgate.decoding.timings import STEP_TIMINGS, MaskTimings, mask_time_summary
from callgate.kernels import apply_token_bitmask, apply_token_bitmask_rows

__all__ = ["BOUND", "ConstrainedBatch", "RowSpec", "mask_time_summary", "row_spec"]

log = logging.getLogger("callgate.decoding.processor")

EXTRA_ARGS_KEY = "callgate"
BOUND = 128  # tokens before max_tokens from which a row keeps a closing plan
# What one free token may add to a plan (a `,` that opens another key and its value): the
# row follows its plan this many tokens before the plan alone would still fit.
SLACK = 12
_TEMPLATES = 256  # grammars whose first matcher is kept


@dataclass(frozen=True, slots=True)
class RowSpec:
    """The per-request arguments, read from `extra_args["callgate"]`."""

    key: str
    grammar: str
    plain: str = ""  # the grammar with markers as plain text: budget closing's byte twin reads it
    trigger: str | None = None
    budget_closing: bool = True
    needs_call: bool = False  # required / named: an accepting state holds a whole call
    request_id: str = ""  # for closing_marks


def row_spec(extra_args: Mapping[str, Any] | None) -> RowSpec | None:
    """The spec of a request, None when unconstrained. Raises ValueError when malformed."""
    raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"] must be a mapping, got {type(raw).__name__}')
    key, grammar, trigger = raw.get("key"), raw.get("grammar"), raw.get("trigger")
    if not isinstance(key, str) or not key or not isinstance(grammar, str) or not grammar:
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"] needs non-empty string "key" and "grammar"')
    if trigger is not None and not isinstance(trigger, str):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"]["trigger"] must be a string or null')
    plain = raw.get("plain")
    mode = raw.get("mode")
    closing = raw.get("budget_closing") is not False
    request_id = raw.get("request_id")
    return RowSpec(
        key,
        grammar,
        str(plain or grammar),
        trigger or None,
        closing,
        mode in ("required", "named"),
        request_id if isinstance(request_id, str) else "",
    )


@dataclass(slots=True)
class Row:
    spec: RowSpec
    matcher: Any
    output: list[int]  # vLLM's live list of the request's output ids
    max_tokens: int | None
    consumed: int = 0
    failed: bool = False
    twin: Any = None  # the byte-vocabulary matcher budget closing plans on
    twin_bytes: int = 0  # output tokens fed to the twin
    text: bytearray = field(default_factory=bytearray)  # output bytes (special tokens as their text)
    called: bool = False  # a call trigger was written
    call_cost: int | None = None  # tokens of the first call from its trigger on (planned)
    plan: list[int] | None = None  # tokens to follow to the end of the grammar
    last_plan: int | None = None  # the plan's length at the last step (while free)
    growth: int = 0  # the most one free token has added to the plan

    def remaining(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens - len(self.output)


class ConstrainedBatch:
    """vLLM v1 logits-processor logic for callgate's grammars (vllm-free; see module doc)."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.vllm_config = vllm_config
        self.device = torch.device(device)
        self.pin = bool(is_pin_memory) and self.device.type == "cuda"
        self.vocab = self.load_tokens()
        self.pieces = _pieces(self.vocab)
        self._special_ids = frozenset(self.vocab.specials.values())
        self._trigger_masks: dict[str, torch.Tensor] = {}
        self._call_costs: dict[str, int | None] = {}  # grammar key -> a shortest call's tokens
        self.rows: dict[int, Row] = {}
        self.templates: OrderedDict[str, Any] = OrderedDict()
        # each grammar's mask at its start (a free-text start costs ~1 ms to fill on 152k ids)
        self.first_masks: dict[str, torch.Tensor] = {}
        self.executor = llguidance.LLExecutor()
        self.timings = MaskTimings()
        self.step_log = StepLog.from_environment()
        self.budget_ns = 0
        self.masked = 0
        self._host = torch.zeros(0, 0, dtype=torch.int32)
        self.closing_dir = os.environ.get(closing_marks.ENV)

    def load_tokens(self) -> LlgVocabulary:
        """The served model's tokens. Default: the tokenizer folder named in vllm_config
        (the one upward import: inside vLLM's engine core the config is all there is).
        Tests override it with a small vocabulary."""
        from callgate.serving.engines.tokenizer import HfTokenizer

        tok = HfTokenizer(self.vllm_config.model_config.tokenizer)
        specials = {int(i): str(t.content) for i, t in tok.hf.added_tokens_decoder.items()}
        return LlgVocabulary.build(tok.vocabulary(), tok.eos_token_id, specials, tok.vocab_size)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed `extra_args["callgate"]` (vLLM turns ValueError into HTTP 400)."""
        row_spec(getattr(sampling_params, "extra_args", None))

    def is_argmax_invariant(self) -> bool:
        """Masking changes the argmax, so greedy requests need it too."""
        return False

    def update_state(self, batch_update: Any | None) -> None:
        """Apply vLLM's batch changes in its order: removed, added, moved."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            row = self._new_row(params, output_ids)
            self.rows.pop(index, None)
            if row is not None:
                self.rows[index] = row
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if getattr(direction, "name", str(direction)) == "SWAP" and row_b is not None:
                self.rows[a] = row_b

    def _new_row(self, params: Any, output_ids: list[int]) -> Row | None:
        """A Row for a constrained request. A grammar llguidance cannot build here (the
        server checks it first) must not take down the engine: the row is logged and left
        unconstrained, and the strict parser still judges it."""
        try:
            spec = row_spec(getattr(params, "extra_args", None))
        except ValueError as exc:
            log.error("constrained decoding disabled for a request: %s", exc)
            return None
        if spec is None:
            return None
        first = self._template(spec)
        if first is None:
            return None
        max_tokens = getattr(params, "max_tokens", None)
        budget = max_tokens if isinstance(max_tokens, int) and spec.budget_closing else None
        return Row(spec, first.deep_copy(), output_ids, budget)

    def _template(self, spec: RowSpec) -> Any:
        found = self.templates.get(spec.key)
        if found is not None:
            self.templates.move_to_end(spec.key)
            return found
        m = matcher(spec.grammar, self.vocab)
        if m.is_error():
            log.error("constrained decoding disabled for a request: %s", m.get_error().splitlines()[0])
            return None
        self.templates[spec.key] = m
        while len(self.templates) > _TEMPLATES:
            evicted, _ = self.templates.popitem(last=False)
            self.first_masks.pop(evicted, None)
        return m

    # ---- a step ---------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Advance every constrained row's matcher, then mask its logits row in place."""
        self.budget_ns = self.masked = 0
        if not self.rows:
            return logits
        start = time.perf_counter_ns()
        n_rows, width = logits.shape
        if width < self.vocab.size:
            raise ValueError(f"logits have {width} columns but the vocabulary has {self.vocab.size} ids")
        live = [(i, row) for i, row in self.rows.items() if i < n_rows and self._catch_up(row)]
        if live:
            words = (self.vocab.size + 31) // 32
            host = self._buffer(n_rows, words)
            # a stopped matcher (the grammar is complete) admits EOS alone: its mask says so;
            # a row at its grammar's start takes the start mask, computed once per grammar
            fill = [(row.matcher, i) for i, row in live if row.consumed or row.spec.key not in self.first_masks]
            if fill:
                llguidance.torch.fill_next_token_bitmask_par(self.executor, fill, host)
            for i, row in live:
                if not row.consumed:
                    first = self.first_masks.get(row.spec.key)
                    if first is None:
                        self.first_masks[row.spec.key] = host[i].clone()
                    else:
                        host[i].copy_(first)
            for i, row in live:
                if row.max_tokens is not None and not row.matcher.is_stopped():
                    self._close(i, row, host)
            masked = [i for i, _ in live]
            self._kernel(logits, host, masked)
        elapsed = time.perf_counter_ns() - start
        self.masked = len(live)
        self.timings.record(elapsed, self.masked)
        STEP_TIMINGS.record(elapsed, self.masked)
        if self.step_log is not None and self.masked:
            self.step_log.record(elapsed, self.masked, self.budget_ns)
        return logits

    def _catch_up(self, row: Row) -> bool:
        """Feed the row's new tokens to its matcher; False when the row is unconstrained."""
        if row.failed:
            return False
        new = row.output[row.consumed :]
        if new:
            done = row.matcher.try_consume_tokens(new)
            row.consumed += done
            if done < len(new):
                row.failed = True
                log.warning("constraint %s: a sampled token was refused; the row is unconstrained", row.spec.key[:16])
                return False
            if row.max_tokens is not None:
                start = len(row.text)
                for t in new:
                    row.text += self.pieces.get(t, b"")
                trigger = row.spec.trigger
                if trigger and not row.called:  # only the new bytes (and a trigger they complete)
                    mark = trigger.encode()
                    row.called = mark in row.text[max(0, start - len(mark) + 1) :]
        return True

    def _buffer(self, n_rows: int, words: int) -> torch.Tensor:
        if self._host.shape[0] < n_rows or self._host.shape[1] != words:
            self._host = torch.zeros(
                max(n_rows, 2 * self._host.shape[0]), words, dtype=torch.int32, pin_memory=self.pin
            )
        return self._host[:n_rows]

    def _kernel(self, logits: torch.Tensor, host: torch.Tensor, masked: list[int]) -> None:
        if logits.device.type == "cpu":
            apply_token_bitmask_rows(logits, host, torch.tensor(sorted(masked), dtype=torch.int64))
        else:
            apply_token_bitmask(logits, host.to(logits.device, non_blocking=True), sorted(masked))

    # ---- budget closing -------------------------------------------------------------------

    def _close(self, i: int, row: Row, host: torch.Tensor) -> None:
        left = row.remaining()
        if left is None or left > BOUND:
            return
        started = time.perf_counter_ns()
        try:
            forced = self._forced(row, left)
            if forced == _NO_CALL:
                host[i] &= self._no_trigger(row.spec.trigger or "")
            elif forced is not None:
                host[i].zero_()
                host[i, forced // 32] = _bit(forced % 32)
        finally:
            self.budget_ns += time.perf_counter_ns() - started

    def _forced(self, row: Row, left: int) -> int | None:
        """The one token the row must take now to end within its budget (-1: any token but
        one that starts a call), or None (free)."""
        eos = self.vocab.eos_token_id
        if row.plan is not None:  # following a plan: its next token, then EOS
            return row.plan.pop(0) if row.plan else eos
        cost = self._call_cost(row)
        if row.matcher.is_accepting():
            if left <= 1:
                return eos
            if cost is None or left > cost + 1:
                return None
            # a whole call is written: end here; else (auto, text so far) start no call
            return eos if row.spec.needs_call or row.called else _NO_CALL
        plan = self._plan(row)
        if plan is None:
            return None
        ended = self._ends_a_call(row, plan)  # only the markup after a whole call is left
        if row.last_plan is not None:  # what the last free token added to the plan
            row.growth = max(row.growth, len(plan) - row.last_plan + 1)
        row.last_plan = len(plan)
        margin = max(SLACK, row.growth + 2)
        if left > len(plan) + 1 + margin and not (ended and cost is not None and left <= cost + len(plan) + 1):
            return None
        row.plan = plan[1:]  # committed: a plan re-made mid-marker would lose its way
        if self.closing_dir and row.spec.request_id and not ended:
            closing_marks.mark(self.closing_dir, row.spec.request_id)
        return plan[0] if plan else eos

    def _ends_a_call(self, row: Row, plan: list[int]) -> bool:
        """Whether the row has written a whole call and its plan only closes the markup
        around it (mistral's `]`, DSML's block close): ending there cuts nothing short."""
        if not (row.spec.needs_call or row.called) or len(plan) > 32:
            return False
        text = b"".join(self.pieces.get(t, b"\xff") for t in plan)
        for marker in _markup(row.spec.key.partition(":")[0]):
            text = text.replace(marker, b"")
        return not text.strip(b" \n]}")

    def _call_cost(self, row: Row) -> int | None:
        """Tokens of a shortest call from its trigger on, planned once per grammar from its
        start (the trigger, or the separator and trigger where calls follow one another);
        None where the grammar has no trigger to start one."""
        trigger = row.spec.trigger
        if row.call_cost is not None or not trigger:
            return row.call_cost
        key = row.spec.key
        if key not in self._call_costs:
            self._call_costs[key] = self._plan_call(row.spec.plain, trigger.encode(), key.partition(":")[0])
        row.call_cost = self._call_costs[key]
        return row.call_cost

    def _plan_call(self, plain: str, trigger: bytes, format: str) -> int | None:
        probe = matcher(plain, _BYTES)
        if probe.is_error() or probe.try_consume_tokens(list(trigger)) != len(trigger):
            return None
        plan = closing_plan(probe, _STEPS, 256, format_closers(format), max_bytes=4 * BOUND)
        if plan is None:
            return None
        return len(self.vocab.tokenizer.tokenize_bytes(trigger + plan)) + 1

    def _no_trigger(self, trigger: str) -> torch.Tensor:
        """A mask of every token but those that could begin `trigger`: a special token
        that spells it, and (its text spelled in ordinary tokens) any token holding its
        first character; kept per trigger."""
        found = self._trigger_masks.get(trigger)
        if found is None:
            words = (self.vocab.size + 31) // 32
            allowed = torch.ones(words * 32, dtype=torch.bool)
            first = trigger.encode()[:1]
            for i, data in self.pieces.items():
                if (first and first in data) or (
                    data and trigger.encode().startswith(data[:1]) and i in self._special_ids
                ):
                    allowed[i] = False
            bits = allowed.view(words, 32).to(torch.int64) << torch.arange(32, dtype=torch.int64)
            found = self._trigger_masks[trigger] = bits.sum(dim=1).to(torch.int64).apply_(_signed).to(torch.int32)
        return found

    def _plan(self, row: Row) -> list[int] | None:
        """Tokens from the row's state to the end of its grammar (the plan's bytes in the
        vocabulary's longest tokens the matcher takes; one-byte tokens where it does not)."""
        twin = self._twin(row)
        if twin is None:
            return None
        closers = format_closers(row.spec.key.partition(":")[0])
        plan = closing_plan(twin, _STEPS, 256, closers, max_bytes=4 * BOUND)
        if plan is None:
            return None
        return self._tokens(row.matcher, plan)

    def _twin(self, row: Row) -> Any:
        if row.twin is None:
            row.twin = matcher(row.spec.plain, _BYTES)
        feed = bytes(row.text[row.twin_bytes :])
        if feed:
            done = row.twin.try_consume_tokens(list(feed))
            row.twin_bytes += done
            if done < len(feed):  # text the byte twin cannot follow (a special token): no plan
                row.max_tokens = None
                return None
        return row.twin

    def _tokens(self, m: Any, plan: bytes) -> list[int]:
        out: list[int] = []
        pos = 0
        by_bytes = self.vocab.by_bytes
        while pos < len(plan):
            for size in range(min(len(plan) - pos, 16), 0, -1):
                ids = by_bytes.get(plan[pos : pos + size])
                if ids and m.try_consume_tokens([ids[0]]) == 1:
                    out.append(ids[0])
                    pos += size
                    break
            else:
                break
        if out:
            m.rollback(len(out))
        return out


def _bit(j: int) -> int:
    """Bit j of an int32 word (bit 31 is the sign bit)."""
    return (1 << j) - (1 << 32) if j == 31 else 1 << j


def _pieces(vocab: LlgVocabulary) -> dict[int, bytes]:
    pieces = {i: data for data, ids in vocab.by_bytes.items() for i in ids}
    pieces.update({i: text.encode() for text, i in vocab.specials.items()})
    return pieces


def _signed(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


# The vocabulary closing plans on: one token per byte, EOS 256.
_BYTES = LlgVocabulary.build({bytes([b]): [b] for b in range(256)}, 256, {256: "<eos>"}, 257)
_STEPS = {b: b for b in range(256)}
_NO_CALL = -1


@functools.cache
def _markup(format: str) -> tuple[bytes, ...]:
    """The format's closing markers, longest first (a JSON string's closers left out)."""
    return tuple(sorted((c for c in format_closers(format) if b'"' not in c), key=len, reverse=True))
