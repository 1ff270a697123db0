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
rows of a batch in parallel) and callgate's kernel masks the logits. Where the grammar forces
the next bytes (a marker, a key name, a tool's name once chosen) llguidance's mask admits one
token, the first of its forced tokens (`compute_ff_tokens`), and filling it costs as much as
computing them all (0.1–0.4 ms a step inside DSML's markers on 49k ids): a row keeps the run of
forced tokens, computed once, and takes them one per step without a fill. A greedy row
(`argmax_sampled`: vLLM takes the argmax of the returned logits) whose argmax the grammar
admits is left unmasked: the mask would not move that argmax, and asking the matcher about
one token (~1 µs) after one C pass over the row replaces a fill and a kernel pass (tens of
µs); its argmax refused, it is masked as any other row. A token the matcher
refuses (only possible when another processor changed the sampled token) leaves the row
unconstrained from then on, with a warning; the strict parser downstream judges the output.

Budget closing (budget.py): in a row's last `BOUND` tokens the row is steered so that its
output ends within max_tokens at the end of its grammar, never mid-call (a value the model
would not close is cut short so that the call closes; the server then says
`finish_reason: "length"`). A row's spec and state are rows.py's.

Every `apply` records its time in `timings` and the process-wide `STEP_TIMINGS`
(`mask_time_summary()`); with `CALLGATE_MASK_TIMINGS=/path/file` each step is also appended
to that file (decoding/step_log.py), readable from outside vLLM's engine process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections import OrderedDict
from typing import Any

import llguidance
import numpy
import torch

from callgate.constraints.llg import LlgVocabulary, matcher
from callgate.decoding import closing_marks
from callgate.decoding.budget import BOUND, NO_CALL, BudgetClosing
from callgate.decoding.rows import Row, RowSpec, argmax_sampled, row_spec
from callgate.decoding.step_log import StepLog
from callgate.decoding.timings import STEP_TIMINGS, MaskTimings, mask_time_summary
from callgate.kernels import apply_token_bitmask, apply_token_bitmask_rows, argmax, cpu_row_kernels

__all__ = ["BOUND", "ConstrainedBatch", "RowSpec", "mask_time_summary", "row_spec"]

log = logging.getLogger("callgate.decoding.processor")

_TEMPLATES = 256  # grammars whose first matcher is kept
# Masks are filled on llguidance's thread pool only where spare cores exist: on a small CPU
# the model's own OpenMP threads hold the cores and a pool hand-off costs milliseconds
# (benchmarks/bench_mask_path.py). CALLGATE_PARALLEL_FILL=on|off overrides.
_PARALLEL_FILL_MIN_CPUS = 8


class ConstrainedBatch:
    """vLLM v1 logits-processor logic for callgate's grammars (vllm-free; see module doc)."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.vllm_config = vllm_config
        self.device = torch.device(device)
        self.pin = bool(is_pin_memory) and self.device.type == "cuda"
        self.vocab = self.load_tokens()
        self.pieces = _pieces(self.vocab)
        self.rows: dict[int, Row] = {}
        self.templates: OrderedDict[str, Any] = OrderedDict()
        # each grammar's mask at its start (a free-text start costs ~1 ms to fill on 152k ids)
        # and its forced tokens there (a required call's markup: a DSML start's are ~0.4 ms)
        self.first_masks: dict[str, numpy.ndarray] = {}
        self.first_forced: dict[str, list[int]] = {}
        self.executor = llguidance.LLExecutor()
        self.parallel_fill = parallel_fill_default()
        self.timings = MaskTimings()
        self.step_log = StepLog.from_environment()
        self.budget_ns = 0
        self.masked = 0  # rows constrained in the last step
        self.filled = 0  # of which llguidance filled a mask for
        self.passed = 0  # of which took their argmax unmasked (greedy, admitted)
        # the last step's parts, ns: advance (new tokens fed to the matchers), fill
        # (llguidance's masks and forced tokens), check (greedy rows' argmax), kernel
        self.parts = (0, 0, 0, 0)
        self.words = (self.vocab.size + 31) // 32
        # the host masks, one row per batch row: a tensor (for a GPU's copy), a numpy view and
        # its address (each step's writes go through these: after the model's forward pass every
        # cache is cold, and a torch call per row costs microseconds there)
        self._host = torch.zeros(0, self.words, dtype=torch.int32)
        self._host_np = self._host.numpy()
        self._host_ptr = 0
        self._row_kernels = cpu_row_kernels()
        self._argmax = argmax.argmax_rows_kernel() if argmax.available() else None
        self._argmax_out = numpy.zeros(0, dtype=numpy.int64)
        self.closing = BudgetClosing(self.vocab, self.pieces, os.environ.get(closing_marks.ENV))

    def load_tokens(self) -> LlgVocabulary:
        """The served model's tokens: a subclass supplies them (vLLM's adapter,
        serving/engines/vllm_engine.py, from the tokenizer folder its config names; tests, a
        small vocabulary), so that decoding knows no tokenizer."""
        raise NotImplementedError(f"{type(self).__name__} must supply the vocabulary (load_tokens)")

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
        return Row(spec, first.deep_copy(), output_ids, budget, argmax_sampled=argmax_sampled(params))

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
            self.first_forced.pop(evicted, None)
        return m

    # ---- a step ---------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Advance every constrained row's matcher, then mask its logits row in place."""
        self.budget_ns = self.masked = self.filled = self.passed = 0
        self.parts = (0, 0, 0, 0)
        if not self.rows:
            return logits
        clock = time.perf_counter_ns
        start = clock()
        n_rows, width = logits.shape
        if width < self.vocab.size:
            raise ValueError(f"logits have {width} columns but the vocabulary has {self.vocab.size} ids")
        live = [(i, row) for i, row in self.rows.items() if i < n_rows and self._catch_up(row)]
        advanced = clock()
        if live:
            self._buffer(n_rows)
            host, base, row_bytes = self._host_np, self._host_ptr, self.words * 4
            # rows whose mask admits one token: a stopped matcher (the grammar is complete)
            # EOS, budget closing the token it steers to, a run of forced tokens its next one
            # (asked last, and only of rows the argmax check leaves: a greedy row whose argmax
            # the matcher admits takes it whether or not it was forced, and llguidance's
            # forced tokens cost a few µs a row even where there are none)
            eos = self.vocab.eos_token_id
            one: dict[int, int] = {}
            no_call: list[int] = []  # rows kept from starting a call (budget closing)
            self.closing.spent_ns = 0
            for i, row in live:
                if row.matcher.is_stopped():
                    one[i] = eos
                elif row.max_tokens is not None:
                    decided = self.closing.decide(row)
                    if decided == NO_CALL:
                        no_call.append(i)
                    elif decided is not None:
                        one[i] = decided
            self.budget_ns = self.closing.spent_ns
            checking = clock()
            passed = self._argmax_admitted(logits, live, one, no_call)
            checked = clock()
            for i, row in live:
                if i not in passed and i not in one and self._forced(row):
                    one[i] = row.forced[0]
            # a row at its grammar's start takes the start mask, computed once per grammar
            fill = [
                (row.matcher, i)
                for i, row in live
                if i not in passed and i not in one and (row.consumed or row.spec.key not in self.first_masks)
            ]
            if len(fill) > 1 and self.parallel_fill:
                self.executor.unsafe_compute_mask_ptr(fill, base, row_bytes, n_rows)
            else:
                for m, i in fill:
                    m.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)
            masked = []
            for i, row in live:
                if i in passed:
                    continue
                masked.append(i)
                token = one.get(i)
                if token is not None:
                    ctypes.memset(base + i * row_bytes, 0, row_bytes)
                    host[i, token >> 5] = word_bit(token & 31)
                elif not row.consumed:
                    first = self.first_masks.get(row.spec.key)
                    if first is None:
                        self.first_masks[row.spec.key] = host[i].copy()
                    else:
                        host[i] = first
            for i in no_call:
                if i not in passed:
                    host[i] &= self.closing.no_trigger(self.rows[i].spec.trigger or "")
            filled = clock()
            if masked:
                self._kernel(logits, n_rows, sorted(masked))
            self.filled, self.passed = len(fill), len(passed)
            self.parts = (advanced - start, filled - checked, checked - checking, clock() - filled)
        elapsed = clock() - start
        self.masked = len(live)
        self.timings.record(elapsed, self.masked)
        STEP_TIMINGS.record(elapsed, self.masked)
        if self.step_log is not None and self.masked:
            self.step_log.record(elapsed, self.masked, self.budget_ns, passed=self.passed, parts=self.parts)
        return logits

    def _argmax_admitted(
        self, logits: torch.Tensor, live: list[tuple[int, Row]], one: dict[int, int], no_call: list[int]
    ) -> set[int]:
        """The rows that vLLM will sample greedily and whose argmax their mask would admit:
        masking them would change nothing, so they are left as they are (asking the matcher
        about one token is ~1 µs, a mask tens of µs; the argmax is one read of the row).
        Only for float32 CPU logits (a GPU's would cost a device sync)."""
        if self._argmax is None or logits.device.type != "cpu" or logits.dtype != torch.float32:
            return set()
        if logits.stride(1) != 1:
            return set()
        greedy = [(i, row) for i, row in live if row.argmax_sampled]
        if not greedy:
            return set()
        if self._argmax_out.shape[0] < len(greedy):
            self._argmax_out = numpy.zeros(max(len(greedy), 2 * self._argmax_out.shape[0]), dtype=numpy.int64)
        index = numpy.array([i for i, _ in greedy], dtype=numpy.int64)
        out = self._argmax_out
        width = logits.shape[1]
        self._argmax(logits.data_ptr(), logits.stride(0), index.ctypes.data, len(greedy), width, out.ctypes.data)
        kept_out = set(no_call)
        passed = set()
        for k, (i, row) in enumerate(greedy):
            t = int(out[k])
            if t < 0 or t >= self.vocab.size:  # a NaN in the row, or a padded column
                continue
            token = one.get(i)
            if token is not None:
                ok = t == token
            else:
                ok = row.matcher.validate_tokens([t]) == 1
            if ok and i in kept_out:
                ok = bool(self.closing.no_trigger(row.spec.trigger or "")[t >> 5] >> (t & 31) & 1)
            if ok:
                passed.add(i)
        return passed

    def _forced(self, row: Row) -> bool:
        """Whether the grammar forces the row's next token (then `row.forced` starts with it):
        the rest of a run computed earlier, else llguidance's forced tokens from here (cheap
        where there are none), kept per grammar at its start."""
        if row.forced:
            return True
        if row.consumed:
            row.forced = list(row.matcher.compute_ff_tokens())
        else:
            start = self.first_forced.get(row.spec.key)
            if start is None:
                start = self.first_forced[row.spec.key] = list(row.matcher.compute_ff_tokens())
            row.forced = list(start)
        return bool(row.forced)

    def _catch_up(self, row: Row) -> bool:
        """Feed the row's new tokens to its matcher; False when the row is unconstrained."""
        if row.failed:
            return False
        new = row.output[row.consumed :]
        if new:
            done = row.matcher.try_consume_tokens(new)
            row.consumed += done
            for t in new[:done]:  # the forced run goes on while the row takes its tokens
                if row.forced and row.forced[0] == t:
                    del row.forced[0]
                else:
                    row.forced.clear()
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

    def _buffer(self, n_rows: int) -> None:
        """Host masks for at least `n_rows` rows (grown by doubling, never shrunk)."""
        if self._host.shape[0] < n_rows:
            size = max(n_rows, 2 * self._host.shape[0])
            self._host = torch.zeros(size, self.words, dtype=torch.int32, pin_memory=self.pin)
            self._host_np = self._host.numpy()
            self._host_ptr = self._host.data_ptr()

    def _kernel(self, logits: torch.Tensor, n_rows: int, masked: list[int]) -> None:
        """Mask logits rows `masked` (ascending, each below n_rows) with their host masks.
        CPU logits go straight to the C kernel: the host buffer and the rows were made
        here, so only the logits need checking (dtype, unit stride: `check_call`'s checks)."""
        fn = self._row_kernels.get(logits.dtype) if logits.device.type == "cpu" else None
        if fn is not None and logits.stride(1) == 1:  # 2-D: apply unpacked its shape
            rows = numpy.array(masked, dtype=numpy.int64)
            fn(
                logits.data_ptr(),
                logits.stride(0),
                self._host_ptr,
                self.words,
                rows.ctypes.data,
                len(masked),
                logits.shape[1],
                self.words,
            )
        elif logits.device.type == "cpu":
            apply_token_bitmask_rows(logits, self._host[:n_rows], torch.tensor(masked, dtype=torch.int64))
        else:
            host = self._host[:n_rows].to(logits.device, non_blocking=True)
            apply_token_bitmask(logits, host, masked)


def _pieces(vocab: LlgVocabulary) -> dict[int, bytes]:
    pieces = {i: data for data, ids in vocab.by_bytes.items() for i in ids}
    pieces.update({i: text.encode() for text, i in vocab.specials.items()})
    return pieces


def word_bit(j: int) -> int:
    """Bit j of an int32 word (bit 31 is the sign bit)."""
    return (1 << j) - (1 << 32) if j == 31 else 1 << j


def parallel_fill_default() -> bool:
    """Fill masks in parallel? CALLGATE_PARALLEL_FILL=on|off, else by the machine's cores."""
    setting = os.environ.get("CALLGATE_PARALLEL_FILL", "auto").lower()
    if setting in ("on", "off"):
        return setting == "on"
    return (os.cpu_count() or 1) >= _PARALLEL_FILL_MIN_CPUS
