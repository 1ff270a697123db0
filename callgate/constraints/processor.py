"""Per-step constrained decoding for a vLLM batch, without importing vllm.

Knows: vLLM v1's logits-processor protocol by its method names (`__init__(vllm_config,
device, is_pin_memory)`, `validate_params`, `is_argmax_invariant`, `update_state`,
`apply`) and batch updates (removed, then added, then moved; each added request brings a
*live* list of its output token ids); outlines-core's Guide; callgate.kernels; that a
grammar key begins with its format's name. Does not know: formats (grammar.free_text
turns that name into a lazy row's free-text rules), schemas, HTTP.
`callgate.serving.vllm_engine.CallgateLogitsProcessor` mixes this class with vLLM's base
class.

A request is constrained when `SamplingParams.extra_args["callgate"]` holds
`{"key": str, "regex": str, "trigger": str | None, "index_path": str | None, "thinking":
bool | None, ...}` (a ConstraintRef's fields; optionally `"budget_closing": bool | None`,
default on). Its
Index comes from callgate.constraints.cache: vLLM's engine core is another process than
the server's, so on a memory miss it is loaded from
`index_path`, the file the server wrote when it compiled the grammar (milliseconds), and
compiled from the regex (blocking this step for 0.1-1 s) only when that file is missing
or corrupt.

Lazy mode (`trigger` set): `regex` describes the text *from the trigger on* (see
grammar.py). Until the generated text contains the trigger the row is free text, held
only to its format's free-text rules (grammar.free_text, found by the format name the
grammar key begins with; a key naming no format gets the trigger alone; a leading
reasoning block only where `thinking` is null, i.e. the prompt closed none): the markers the
strict parser rejects in content (control tokens, stray call tags) are masked where a
token would complete one (late_trigger.py; most free-text tokens are skipped with one
byte lookup, and a row is masked in a step only where its state bans a token).
Generated text is read as token bytes, special tokens included (a trigger may be one).
When the trigger appears, a fresh guide walks the text from the trigger's first byte to
the end of the latest token with ordinary vocabulary tokens (the Index is a DFA over
bytes, so any tokenisation of the same text reaches the same state) and masking starts.

A sampled token the guide rejects (only possible when the trigger arrived glued to text
the grammar forbids) leaves the row unconstrained from then on (`failed_rows`, and a
warning in the log); the strict parser downstream then reports the malformed call.

Budget closing (budget.py): a row knows its budget (`SamplingParams.max_tokens` minus its
outputs so far). In the last `BudgetCloser.bound` (512) tokens, the mask is narrowed to the
tokens from which a complete output (then EOS) still fits in what is left; when only the
shortest completion still fits, the row follows it. So a constrained output always ends
in the grammar's language, with EOS at or before max_tokens: a free-text value the model
would not close is cut short so that the call closes, and the server then reports
`finish_reason: "length"` (it used all of max_tokens). A lazy row before its trigger is
free text; once its tokens left cannot hold a whole call (trigger included) and EOS, the
tokens that would complete the trigger are masked (late_trigger.py), so no call starts that
could not close. A row whose max_tokens is below its grammar's shortest output is cut as
before. Rows without a `max_tokens` (tests' fakes) are left alone, and so is a request
that opts out with `"budget_closing": false` (its mask is the grammar's alone, so a
max_tokens below a whole output cuts it without changing which tokens it may pick: a
caller that only reads the first tokens (a quick head deciding a label) can stop it
in the engine).

Every `apply` records its time (guide advance + mask fill + budget closing + kernel launch)
in `timings` and in the process-wide `STEP_TIMINGS` (`mask_time_summary()`: p50/p99 per
step and per constrained token). With a CUDA device the kernel runs asynchronously; the time
is host time. With `CALLGATE_MASK_TIMINGS=/path/file` in the environment each step is also
appended to that file (step_log.py), readable from outside vLLM's engine process.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import outlines_core
import torch

from callgate.constraints.budget import BudgetCloser
from callgate.constraints.cache import TokenVocabulary, get_index, token_vocabulary
from callgate.constraints.free_text import CALL, CONTENT, START, FreeText
from callgate.constraints.grammar import free_text
from callgate.constraints.late_trigger import TriggerGuard
from callgate.constraints.step_log import StepLog
from callgate.kernels import apply_token_bitmask, apply_token_bitmask_rows, backend_for
from callgate.kernels import cpu as cpu_kernel

log = logging.getLogger("callgate.constraints.processor")

EXTRA_ARGS_KEY = "callgate"
NEVER = 1 << 62  # an output length no request reaches


@dataclass(frozen=True, slots=True)
class TokenTable:
    """What the processor needs of the tokenizer: the outlines-core vocabulary, token
    bytes -> ids for walking text, and id -> bytes (special tokens too) for triggers."""

    vocabulary: TokenVocabulary
    by_bytes: Mapping[bytes, Sequence[int]]
    pieces: Mapping[int, bytes]
    longest: int

    @classmethod
    def build(
        cls, tokens: Mapping[bytes, Sequence[int]], eos_token_id: int, specials: Mapping[int, bytes]
    ) -> TokenTable:
        """From `Tokenizer.vocabulary()` (ordinary tokens), the EOS id and special-token texts."""
        ordinary = {data: [i for i in ids if i != eos_token_id] for data, ids in tokens.items() if data}
        pieces = {i: data for data, ids in ordinary.items() for i in ids}
        pieces.update(specials)
        longest = max((len(data) for data in ordinary), default=0)
        vocab = token_vocabulary({d: list(ids) for d, ids in ordinary.items() if ids}, eos_token_id)
        return cls(vocab, ordinary, pieces, longest)


@dataclass(frozen=True, slots=True)
class RowSpec:
    """The per-request arguments, read from `extra_args["callgate"]`."""

    key: str
    regex: str
    trigger: bytes | None
    index_path: str | None = None
    budget_closing: bool = True
    thinking: bool | None = None  # GrammarRequest.thinking: False, the prompt closed a block


def row_spec(extra_args: Mapping[str, Any] | None) -> RowSpec | None:
    """The spec of a request, None when unconstrained. Raises ValueError when malformed."""
    raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"] must be a mapping, got {type(raw).__name__}')
    key, regex, trigger = raw.get("key"), raw.get("regex"), raw.get("trigger")
    if not isinstance(key, str) or not key or not isinstance(regex, str) or not regex:
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"] needs non-empty string "key" and "regex"')
    if trigger is not None and (not isinstance(trigger, str) or not trigger):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"]["trigger"] must be a non-empty string or null')
    path = raw.get("index_path")
    if path is not None and (not isinstance(path, str) or not path):
        raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"]["index_path"] must be a non-empty string or null')
    closing, thinking = raw.get("budget_closing"), raw.get("thinking")
    for name, flag in (("budget_closing", closing), ("thinking", thinking)):
        if flag is not None and not isinstance(flag, bool):
            raise ValueError(f'extra_args["{EXTRA_ARGS_KEY}"]["{name}"] must be a boolean or null')
    encoded = trigger.encode() if trigger is not None else None
    return RowSpec(key, regex, encoded, path, closing is not False, thinking)


def walk_text(guide: Any, index: Any, data: bytes, table: TokenTable) -> bool:
    """Advance `guide` over `data` with ordinary tokens, longest allowed piece first.

    True when all of `data` was consumed. Greedy is enough: the Index is a byte DFA, so
    every allowed piece leads to the state the text itself leads to."""
    pos = 0
    while pos < len(data):
        state = guide.get_state()
        step = _allowed_piece(index, state, data, pos, table)
        if step is None:
            return False
        token, pos = step
        guide.advance(token, return_tokens=False)
    return True


def _allowed_piece(index: Any, state: int, data: bytes, pos: int, table: TokenTable) -> tuple[int, int] | None:
    for end in range(min(len(data), pos + table.longest), pos, -1):
        for token in table.by_bytes.get(data[pos:end], ()):
            if index.get_next_state(state, token) is not None:
                return token, end
    return None


class Row:
    """One constrained request: its live output list, how much of it the guide has seen,
    and the guide (None while a lazy row waits for its trigger)."""

    __slots__ = (
        "banning",
        "call",
        "closing",
        "consumed",
        "failed",
        "guide",
        "hold_at",
        "index",
        "marks",
        "max_tokens",
        "output",
        "phase",
        "rules",
        "spec",
        "tables",
        "tail",
    )

    def __init__(
        self,
        spec: RowSpec,
        index: Any,
        output: list[int],
        max_tokens: int | None = None,
        rules: FreeText | None = None,
        marks: bytes = b"",
    ) -> None:
        self.spec, self.index, self.output = spec, index, output
        # a lazy row's free-text rules (the trigger alone by default), and their
        # TriggerGuard.marks: tokens that may begin or contain a pattern (without them,
        # every free-text token is looked at)
        self.rules = rules if rules is not None or spec.trigger is None else FreeText(spec.trigger)
        self.marks = marks
        self.consumed = 0
        self.failed = False
        self.max_tokens = max_tokens
        # budget closing on (off when the request opts out, or after a capped search)
        self.closing = max_tokens is not None and spec.budget_closing
        self.tables: Any = None  # budget closing's ByteAutomaton, once needed
        self.call: int | None = None  # a lazy row's shortest call in tokens (D of the start), once needed
        # output length from which the processor asks whether to hold the trigger back
        # (set by the processor for a lazy row that closes; never for the others)
        self.hold_at = NEVER
        # the free-text state (free_text.py): phase, and the longest proper prefix of a
        # pattern the text ends with; `banning`: the guard bans some token in this state
        self.phase, self.tail = self.rules.start() if self.rules is not None else (CONTENT, b"")
        self.banning = False
        self.guide: Any = None if spec.trigger is not None else outlines_core.Guide(index)

    def catch_up(self, table: TokenTable, guard: TriggerGuard | None = None) -> bool:
        """Feed the tokens sampled since the last step; True when the row's guide masks it
        (a lazy row in free text is masked by its guard where `banning`).

        Stops at -1: with async scheduling vLLM appends placeholders that it fills in
        just before sampling, so they are real by the next call."""
        output = self.output
        if self.guide is None:
            if self.failed:
                return False
            marks = self.marks
            if marks and not self.tail:
                # free text with no pattern begun: an unmarked token leaves it so (one
                # lookup per token: the common case of a lazy row)
                consumed, end, n_marks = self.consumed, len(output), len(marks)
                while consumed < end:
                    token = output[consumed]
                    if token < 0 or (token < n_marks and marks[token]):
                        break
                    consumed += 1
                if consumed > self.consumed and self.phase == START:
                    self.phase = CONTENT  # text that opened no reasoning block is content
                    self.judge(guard)
                self.consumed = consumed
                if consumed == end:
                    return False
        while self.consumed < len(output) and not self.failed:
            token = output[self.consumed]
            if token < 0:
                break
            self.consumed += 1
            self._feed(token, table, guard)
        return self.guide is not None and not self.failed

    def remaining(self) -> int | None:
        """Tokens left to sample, this step's included; None when budget closing is off."""
        return self.max_tokens - len(self.output) if self.closing and self.max_tokens is not None else None

    def _feed(self, token: int, table: TokenTable, guard: TriggerGuard | None) -> None:
        if self.guide is None:
            if token != table.vocabulary.eos_token_id:  # EOS ends the output: nothing to read
                self._free_text(table.pieces.get(token, b""), table, guard)
        elif token == table.vocabulary.eos_token_id and self.guide.is_finished():
            return
        else:
            try:
                self.guide.advance(token, return_tokens=False)
            except ValueError:
                self._fail(f"token {token} not allowed by the grammar")

    def _free_text(self, piece: bytes, table: TokenTable, guard: TriggerGuard | None) -> None:
        rules = self.rules
        assert rules is not None
        after = rules.step((self.phase, self.tail), piece)
        if after is None:  # only where the guard's mask was not applied (or a replayed output)
            self._fail(f"free text breaks the format's rules at {piece!r}")
            return
        self.phase, self.tail = after
        if after[0] != CALL:
            self.judge(guard)
            return
        self.banning = False
        self.guide = outlines_core.Guide(self.index)
        if not walk_text(self.guide, self.index, after[1], table):
            self._fail(f"text after the trigger is outside the grammar: {after[1]!r}")

    def judge(self, guard: TriggerGuard | None) -> None:
        """Set `banning` for the current free-text state (False without a guard)."""
        assert self.rules is not None
        self.banning = guard is not None and guard.verdict(self.rules, (self.phase, self.tail)).bans

    def _fail(self, why: str) -> None:
        self.failed = True
        self.banning = False
        log.warning("constraint %s: %s; the row is unconstrained from here", self.spec.key[:16], why)


class MaskTimings:
    """Recent per-step mask times (bounded), and per constrained token."""

    def __init__(self, capacity: int = 65536) -> None:
        self.step_ns: deque[int] = deque(maxlen=capacity)
        self.token_ns: deque[float] = deque(maxlen=capacity)

    def record(self, elapsed_ns: int, rows: int) -> None:
        if rows:
            self.step_ns.append(elapsed_ns)
            self.token_ns.append(elapsed_ns / rows)

    def summary(self) -> dict[str, float]:
        """{"steps", "p50_step_us", "p99_step_us", "p50_token_us", "p99_token_us"} (0 when empty)."""
        return {
            "steps": float(len(self.step_ns)),
            "p50_step_us": _percentile(self.step_ns, 50) / 1e3,
            "p99_step_us": _percentile(self.step_ns, 99) / 1e3,
            "p50_token_us": _percentile(self.token_ns, 50) / 1e3,
            "p99_token_us": _percentile(self.token_ns, 99) / 1e3,
        }


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))])


STEP_TIMINGS = MaskTimings()


def mask_time_summary() -> dict[str, float]:
    """Mask-time percentiles of every ConstrainedBatch in this process."""
    return STEP_TIMINGS.summary()


class StateMasks:
    """Bitmask rows by (grammar key, guide state, width), least recently used first out.

    A state's mask is a pure function of the state, and filling one from the guide costs
    up to hundreds of microseconds where most of a large vocabulary is allowed (inside a
    JSON string); reusing a cached row costs about one (on a CPU the kernel reads it where
    it lies; for a GPU it is copied into the pinned host rows). Bounded by `budget_bytes`.
    Keyed by the grammar key, not the Index object: an Index evicted from the cache and
    recompiled from the same regex and vocabulary numbers its states the same way.
    Rows are numpy arrays: a numpy row copy costs less than a torch op's dispatch, and in
    vLLM's engine process every host-side operation costs several times what it costs in
    isolation (measured on 2 cores: a one-row step ~190 us there against ~20 us alone)."""

    def __init__(self, budget_bytes: int = 64 << 20) -> None:
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[str, int, int], tuple[numpy.ndarray, int]] = OrderedDict()
        self.used_bytes = 0

    def row(self, key: str, guide: Any, width: int) -> tuple[numpy.ndarray, int]:
        """The mask of `guide`'s current state (`width` int32 words) and its address.
        The caller reads it and never writes it; it stays valid while the caller holds it
        (an evicted row is freed when its last holder lets go)."""
        slot = (key, int(guide.get_state()), width)
        cached = self.entries.get(slot)
        if cached is not None:
            self.entries.move_to_end(slot)
            return cached
        mask = numpy.empty(width, dtype=numpy.int32)
        address = int(mask.ctypes.data)
        guide.write_mask_into(address, width, 4)
        entry = self.entries[slot] = (mask, address)
        self.used_bytes += width * 4
        while self.used_bytes > self.budget_bytes and self.entries:
            _, (evicted, _) = self.entries.popitem(last=False)
            self.used_bytes -= evicted.size * 4
        return entry


class MaskBuffer:
    """The host bitmask of `_mask_through_buffer` (pinned when copying to a GPU; `host_np`
    is the same memory as a numpy array), its device twin, and the row numbers handed to
    the kernel, grown on demand."""

    def __init__(self, device: torch.device, pin_memory: bool) -> None:
        self.device, self.pin = device, pin_memory and device.type == "cuda"
        self._grow(0, 0)

    def _grow(self, n_rows: int, n_words: int) -> None:
        self.host = torch.zeros(n_rows, n_words, dtype=torch.int32, pin_memory=self.pin)
        self.host_np = self.host.numpy()
        self.on_device = self.host if self.device.type == "cpu" else torch.empty_like(self.host, device=self.device)
        self.row_ids = torch.zeros(n_rows, dtype=torch.int64)
        self.row_ids_np = self.row_ids.numpy()

    def rows(self, n_rows: int, n_words: int) -> numpy.ndarray:
        if self.host.shape[0] < n_rows or self.host.shape[1] != n_words:
            self._grow(max(n_rows, 2 * self.host.shape[0]), n_words)
        return self.host_np

    def for_kernel(self, n_rows: int) -> torch.Tensor:
        # The host rows are rewritten only at the next step, after vLLM has synchronised
        # on this step's sampled tokens, so the asynchronous copy has finished by then.
        if self.device.type == "cpu":
            return self.host[:n_rows]
        target = self.on_device[:n_rows]
        target.copy_(self.host[:n_rows], non_blocking=True)
        return target

    def row_numbers(self, rows: Sequence[int]) -> torch.Tensor:
        """`rows` (ascending, distinct, each below the buffer's height) as an int64 tensor."""
        self.row_ids_np[: len(rows)] = rows
        return self.row_ids[: len(rows)]


class RowPointers:
    """The two int64 arrays the CPU pointer kernel reads: the masked rows' mask addresses
    (`masks`, at `masks_at`) and their row numbers (`rows`, at `rows_at`). Plain `array`s:
    setting an item costs a fraction of what a numpy item or slice assignment does."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = 0
        self.reserve(capacity)

    def reserve(self, n: int) -> None:
        if n > self.capacity:
            self.capacity = max(n, 2 * self.capacity)
            self.masks, self.rows = array("q", bytes(8 * self.capacity)), array("q", bytes(8 * self.capacity))
            self.masks_at, self.rows_at = self.masks.buffer_info()[0], self.rows.buffer_info()[0]


class ConstrainedBatch:
    """vLLM v1 logits-processor logic for callgate's grammars (vllm-free; see module doc)."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.vllm_config = vllm_config
        self.device = torch.device(device)
        self.tokens = self.load_tokens()
        self.rows: dict[int, Row] = {}
        self.buffer = MaskBuffer(self.device, is_pin_memory)
        self.timings = MaskTimings()
        self.masks = StateMasks()
        self.closer = BudgetCloser(self.tokens.by_bytes, self.tokens.vocabulary.eos_token_id)
        self.guard = TriggerGuard(self.tokens.pieces, self.tokens.vocabulary.eos_token_id)
        self.step_log = StepLog.from_environment()
        self.budget_ns = 0
        self.masked = 0  # rows the last apply masked (its time is recorded per masked row)
        # Choosing the backend builds the CPU kernel: at engine start, not in the first step.
        self.backend = backend_for(self.device)
        self.pointer_lane = cpu_kernel.pointer_kernels() if self.backend == "cpu" else None
        self.pointers = RowPointers()

    def load_tokens(self) -> TokenTable:
        """The served model's tokens. Default: the tokenizer folder named in vllm_config.

        The one upward import (serving.tokenizer): this runs inside vLLM's engine core,
        where the config is all there is. Tests override it with a tiny table."""
        from callgate.serving.tokenizer import HfTokenizer

        tok = HfTokenizer(self.vllm_config.model_config.tokenizer)
        specials = {int(i): str(t.content).encode() for i, t in tok.hf.added_tokens_decoder.items()}
        return TokenTable.build(tok.vocabulary(), tok.eos_token_id, specials)

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
            self._move(a, b, swap=getattr(direction, "name", str(direction)) == "SWAP")

    def _new_row(self, params: Any, output_ids: list[int]) -> Row | None:
        """A Row for a constrained request (loading or compiling its Index on a cache miss).

        A grammar that cannot be built here (validate_params and the server's own compile
        normally stop it first) must not take down the engine and every other request:
        the row is logged and left unconstrained, and the strict parser still judges it."""
        try:
            spec = row_spec(getattr(params, "extra_args", None))
            if spec is None:
                return None
            index = get_index(spec.key, spec.regex, self.tokens.vocabulary, spec.index_path)
            max_tokens = getattr(params, "max_tokens", None)
            budget = max_tokens if isinstance(max_tokens, int) else None
            if spec.trigger is None:
                return Row(spec, index, output_ids, budget)
            # keys begin with the format's name (request.py); quick heads and tests' keys name none
            rules = free_text(spec.key.partition(":")[0], spec.trigger, may_open=spec.thinking is None)
            row = Row(spec, index, output_ids, budget, rules, self.guard.marks(rules))
            row.judge(self.guard)
            if row.closing and row.max_tokens is not None:
                row.hold_at = row.max_tokens - self.closer.bound  # from here on its tokens left are counted
            return row
        except ValueError as exc:
            log.error("constrained decoding disabled for a request: %s", exc)
            return None

    def _move(self, a: int, b: int, *, swap: bool) -> None:
        row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
        if row_a is not None:
            self.rows[b] = row_a
        if swap and row_b is not None:
            self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Advance every constrained row's guide, then mask its logits row in place."""
        self.budget_ns = self.masked = 0
        if not self.rows:
            return logits
        start = time.perf_counter_ns()
        n_rows = logits.shape[0]
        tokens, guard, active, held = self.tokens, self.guard, [], []
        for i, row in self.rows.items():
            if i < n_rows:
                if row.catch_up(tokens, guard):
                    active.append(i)
                elif row.banning or (len(row.output) >= row.hold_at and self._holds_back_trigger(row)):
                    held.append(i)  # free text whose state bans a token, or held back from its trigger
        if active or held:
            lane = self.pointer_lane.get(logits.dtype) if self.pointer_lane is not None else None
            if lane is not None and logits.is_cpu and logits.dim() == 2 and logits.stride(1) == 1:
                self._mask_in_place(logits, lane, active + held)
            else:
                self._mask_through_buffer(logits, sorted(active + held))
        elapsed, masked = time.perf_counter_ns() - start, len(active) + len(held)
        self.masked = masked
        self.timings.record(elapsed, masked)
        STEP_TIMINGS.record(elapsed, masked)
        if self.step_log is not None and masked:
            self.step_log.record(elapsed, masked, self.budget_ns)
        return logits

    def _words(self, width: int) -> int:
        if width < self.tokens.vocabulary.size:
            # outlines-core would write bits past the row: a wrong tokenizer, not bad output.
            raise ValueError(f"logits have {width} columns but the vocabulary has {self.tokens.vocabulary.size} ids")
        return (width + 31) // 32

    def _mask_in_place(self, logits: torch.Tensor, lane: Any, masked: list[int]) -> None:
        """CPU logits: the C kernel reads each row's mask where it is kept (no copy, no
        torch op; `pointer_kernels` in callgate.kernels.cpu). Rows are below the batch
        size (apply keeps no other); `kept` holds every mask until the kernel is done."""
        n_words = self._words(logits.shape[1])
        table, rows, kept = self.pointers, self.rows, []
        table.reserve(len(masked))
        addresses, row_ids = table.masks, table.rows
        for k, i in enumerate(masked):
            mask, addresses[k] = self._row_mask(rows[i], n_words)
            row_ids[k] = i
            kept.append(mask)
        lane(logits.data_ptr(), logits.stride(0), table.masks_at, table.rows_at, len(masked), logits.shape[1], n_words)

    def _mask_through_buffer(self, logits: torch.Tensor, masked: list[int]) -> None:
        """Other devices (and a CPU without the C kernel): masks copied into the host rows
        (pinned for a GPU, then copied asynchronously), then the device's kernel."""
        n_rows, width = logits.shape
        n_words = self._words(width)
        host = self.buffer.rows(n_rows, n_words)
        for i in masked:
            host[i] = self._row_mask(self.rows[i], n_words)[0]
        masks = self.buffer.for_kernel(n_rows)
        if logits.device.type == "cpu":  # row numbers built here: no need to check them again
            apply_token_bitmask_rows(logits, masks, self.buffer.row_numbers(masked))
        else:
            apply_token_bitmask(logits, masks, masked)

    def _row_mask(self, row: Row, n_words: int) -> tuple[numpy.ndarray, int]:
        """A masked row's int32 mask and its address: its grammar state's (narrowed by
        budget closing in its last tokens), or, for a lazy row in free text, every token
        its rules allow next (held back from its trigger: none that would start a call)."""
        if row.guide is None:
            assert row.rules is not None  # only lazy rows are masked without a guide
            held = len(row.output) >= row.hold_at and self._holds_back_trigger(row)
            return self.guard.row(row.rules, (row.phase, row.tail), n_words, held=held)
        mask, address = self.masks.row(row.spec.key, row.guide, n_words)
        remaining = row.remaining()
        if remaining is not None and remaining <= self.closer.bound:
            closing = self._close_within_budget(row, remaining, mask)
            if closing is not None:
                return closing, int(closing.ctypes.data)
        return mask, address

    def _close_within_budget(self, row: Row, remaining: int, allowed: numpy.ndarray) -> numpy.ndarray | None:
        """`allowed` narrowed to the tokens that still let the row end within its budget
        (None: it stands as it is)."""
        start = time.perf_counter_ns()
        spec = row.spec
        closing = None
        try:
            tables = row.tables
            if tables is None:  # looked up once per row (the closer keeps them per grammar)
                tables = row.tables = self.closer.automaton(spec.key, row.index, spec.index_path)
            if remaining < tables.farthest + 2:  # else no token of the grammar needs more: nothing to do
                state = int(row.guide.get_state())
                closing = self.closer.restrict(spec.key, tables, state, remaining, allowed)
        except LookupError as exc:
            self._stop_closing(row, exc)
        self.budget_ns += time.perf_counter_ns() - start
        return closing

    def _holds_back_trigger(self, row: Row) -> bool:
        """A lazy row still in free text whose tokens left cannot hold a whole call and EOS
        (the call's distance counts its trigger, so this holds back a little early)."""
        remaining = row.remaining()
        if row.guide is not None or row.failed or remaining is None or remaining > self.closer.bound:
            return False
        call = row.call
        if call is None:  # the shortest call, looked up once per row
            start = time.perf_counter_ns()
            try:
                spec, index = row.spec, row.index
                call = row.call = self.closer.distance(spec.key, index, index.get_initial_state(), spec.index_path)
                if row.max_tokens is not None:  # held exactly from this output length on
                    row.hold_at = max(row.hold_at, row.max_tokens - call - 1)
            except LookupError as exc:
                self._stop_closing(row, exc)
                return False
            finally:
                self.budget_ns += time.perf_counter_ns() - start
        return remaining < call + 2

    def _stop_closing(self, row: Row, exc: LookupError) -> None:
        row.closing = False
        row.hold_at = NEVER
        log.warning("constraint %s: budget closing off for a request: %s", row.spec.key[:16], exc)

    @property
    def failed_rows(self) -> list[int]:
        """Batch rows whose guide rejected a token (unconstrained since; see module doc)."""
        return sorted(i for i, row in self.rows.items() if row.failed)
