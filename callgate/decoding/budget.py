"""Budget closing: in a row's last `BOUND` tokens, the row is steered so that its output ends
within max_tokens at the end of its grammar, never mid-call.

Knows: closing plans (closing.py: the bytes that end the grammar from the row's state,
planned on a byte-vocabulary twin of its matcher), the vocabulary's longest tokens for a
plan's bytes, the cost of a shortest call, and closing marks (closing_marks.py). A row keeps
its plan up to date, cheaply: a plan is kept while the row writes its first bytes, or while
it (or a tail of it) still ends the grammar from the row's new state — inside a string value
nothing changes — and only then made afresh (~10 masks); a grammar's byte twin and its plan
from the start are made once and copied. Once the tokens left no longer exceed the plan's
tokens plus EOS plus a margin (`SLACK` or two of the format's longest closer, or two more
than the most one free token has added to this row's plan), it follows the plan, token by
token, then EOS, and marks its request (the server flags the call it cut `truncated` and
answers `finish_reason: "length"`). A free row far from that point is looked at again only
where, one margin per token, it could reach it (`_quiet_steps`). Once a whole call is written and
the tokens left could not hold another one, the row ends (EOS) instead of starting a call it
would have to cut short; so such a row is looked at every step, but where its plan closes a
value it must write first (`_value_closer`): then only once it has written that closer's
last byte.
Does not know: vLLM, HTTP, schemas; formats beyond the closers a grammar key names.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy
import torch

from callgate.constraints.llg import LlgVocabulary, matcher
from callgate.decoding import closing_marks
from callgate.decoding.closing import VALUE_CLOSING_KEYS, closing_plan, format_closers
from callgate.decoding.rows import KeptPlan, Row, RowSpec
from callgate.formats import FORMATS

# tokens before max_tokens from which a row keeps a closing plan: more than the longest plan
# (a BFCL call in DSML is up to ~200 tokens on SmolLM2's vocabulary; at 128 such a row's first
# plan was already longer than its budget); a kept plan costs a consume or two per step
BOUND = 512
# What one free token may add to a plan (a `,` that opens another key and its value): the
# row follows its plan this many tokens before the plan alone would still fit.
SLACK = 12
# the longest plan in bytes: a DSML call's markup alone is hundreds of bytes (`｜` is 3), and a
# row with no plan within this is left to run into max_tokens
_PLAN_BYTES = 2048
_KEPT = 256  # grammars whose twin, start plan and call cost are kept
_TOKEN_BYTES = 16  # the longest token a plan is spelled with
# tails of a kept plan tried before planning afresh: a row that left its plan's way (another
# parameter than the plan's) fails them all, and trying every tail of a DSML or qwen3-xml plan
# (~80 bytes) cost more than a fresh plan; the tails that do end the grammar start within its
# first bytes (replayed qwen3-xml outputs: j = 0, 1, 2 but for a handful)
_TAILS = 4


class BudgetClosing:
    """The closing of one batch's rows over one vocabulary (`pieces`: each id's bytes)."""

    def __init__(self, vocab: LlgVocabulary, pieces: dict[int, bytes], closing_dir: str | None) -> None:
        self.vocab = vocab
        self.pieces = pieces
        self.closing_dir = closing_dir
        self._special_ids = frozenset(vocab.specials.values())
        self._trigger_masks: dict[str, numpy.ndarray] = {}
        self._call_costs: dict[str, int | None] = {}  # grammar key -> a shortest call's tokens
        self._start_plans: dict[str, KeptPlan] = {}  # grammar key -> its plan from the start
        self._twins: dict[str, Any] = {}  # grammar key -> its byte twin at the start
        self._margins: dict[str, int] = {}  # format -> its least margin (_markup_margin)
        self.spent_ns = 0  # time `decide` took since the caller last set this to 0

    def decide(self, row: Row) -> int | None:
        """The one token row must take now to end within its budget, NO_CALL (any token
        but one that could start a call: the mask is to be narrowed by `no_trigger`), or
        None (free: nothing to do outside the last BOUND tokens). The time spent is added
        to `spent_ns`."""
        left = row.remaining()
        if left is None or left > BOUND:
            return None
        started = time.perf_counter_ns()
        try:
            return self._forced(row, left)
        finally:
            self.spent_ns += time.perf_counter_ns() - started

    def _forced(self, row: Row, left: int) -> int | None:
        """`decide`'s answer for a row `left` tokens before its budget."""
        eos = self.vocab.eos_token_id
        if row.plan is not None:  # following a plan: its next token, then EOS
            # by the tokens written, not the steps: a step whose token vLLM discards (a row
            # still in chunked prefill is in the batch) writes none, and its token is due again
            del row.plan[: len(row.output) - row.plan_at]
            row.plan_at = len(row.output)
            return row.plan[0] if row.plan else eos
        cost = self._call_cost(row)
        if row.matcher.is_accepting():
            if left <= 1:
                return eos
            if cost is None or left > cost + 1:
                return None
            # a whole call is written: end here; else (auto, text so far) start no call
            return eos if row.spec.needs_call or row.called else NO_CALL
        if len(row.output) < row.check_at and (row.watch < 0 or row.text.find(row.watch, row.watch_from) < 0):
            return None  # far from the budget, or inside the value its plan closes first
        last = None if row.kept is None else len(row.kept.tokens)  # the plan at the last check
        plan = self._plan(row)
        if plan is None:
            return None
        steps = max(1, len(row.output) - row.checked_at)
        row.checked_at = len(row.output)
        if last is not None:  # what a free token added to the plan since (each wrote one)
            row.growth = max(row.growth, -(-(len(plan) - last + steps) // steps))
        if self._free(row, plan, left, cost):
            row.check_at = len(row.output) + 1 + self._quiet_steps(row, plan, left, cost)
            return None
        if row.kept_reused:  # commit on the shorter of the kept plan and one made here
            kept = row.kept
            fresh = self._plan(row, fresh=True)
            if fresh is None or len(fresh) > len(plan):
                row.kept = kept
            else:
                plan = fresh
            if self._free(row, plan, left, cost):
                row.check_at = len(row.output) + 1 + self._quiet_steps(row, plan, left, cost)
                return None
        ended = self._ends_a_call(row, plan)
        row.plan, row.plan_at = list(plan), len(row.output)  # committed: a plan re-made mid-marker would lose its way
        if self.closing_dir and row.spec.request_id and not ended:
            closing_marks.mark(self.closing_dir, row.spec.request_id)
        return plan[0] if plan else eos

    def _free(self, row: Row, plan: list[int], left: int, cost: int | None) -> bool:
        """Whether the row may still write freely: the budget holds its plan, EOS and a
        margin for what the next token may add (and, where the plan only closes the markup
        after a whole call, room for another call)."""
        margin = self._margin(row)
        if left <= len(plan) + 1 + margin:
            return False
        if cost is None or left > cost + len(plan) + 1:  # room for another call
            return True
        return not self._ends_a_call(row, plan)  # only the markup after a whole call is left

    def _margin(self, row: Row) -> int:
        """What one free token may add to the row's plan: the format's least margin, or two
        more than the most one has added so far."""
        return max(self._markup_margin(row.spec.key.partition(":")[0]), row.growth + 2)

    def _quiet_steps(self, row: Row, plan: list[int], left: int, cost: int | None) -> int:
        """Steps a free row may take before it is looked at again, on the margin's own
        premise (a free token adds at most `margin` tokens to the plan): k steps on,
        `_free` would still hold — the budget, k smaller, still holds the plan, k margins
        longer, EOS and a margin; and room for another call where it held now. Where that
        room runs out first, the row is looked at every step (its plan may turn into only
        the markup after a whole call), or, where its plan closes a value it must write
        first, once it has written that closer's last byte (`row.watch`)."""
        margin = self._margin(row)
        quiet = (left - len(plan) - 2 - margin) // (margin + 1)
        row.watch, row.watch_from = -1, len(row.text)
        if cost is not None:
            room = (left - cost - len(plan) - 2) // (margin + 1)
            if room < quiet:
                closer = None if row.kept is None else self._value_closer(row, row.kept.data)
                if closer is None:
                    quiet = room
                else:  # until the value ends, its plan is not only markup: watch for its closer
                    row.watch = closer
        return max(0, quiet)

    def _value_closer(self, row: Row, plan: bytes) -> int | None:
        """The last byte of a value closer the row must write before its plan can be only
        the markup after a whole call (`_ends_a_call`), or None. A value-closing marker in
        the plan (qwen3-xml's `</parameter>`, DSML's) closes a parameter the row is in or
        must still write (a required one): the call is not whole before the row writes it.
        A plan that is a JSON string's `"` and markup: the row is inside its call's last
        string, which ends only at a `"`. Until then `_free`'s verdict cannot turn for
        want of room for another call."""
        if not (row.spec.needs_call or row.called):
            return None
        format = row.spec.key.partition(":")[0]
        for closer in _value_closers(format):
            if closer in plan:
                return closer[-1]
        return ord('"') if plan.startswith(b'"') and _only_markup(format, plan[1:]) else None

    def _markup_margin(self, format: str) -> int:
        """The least margin for `format`: SLACK, or two of its longest closer (in tokens) and
        two more — one free token can open an element whose markup the plan must then close
        (a DSML parameter's tags are a dozen tokens each on a vocabulary without `｜`)."""
        found = self._margins.get(format)
        if found is None:
            longest = max((len(self.vocab.tokenizer.tokenize_bytes(c)) for c in format_closers(format)), default=0)
            found = self._margins[format] = max(SLACK, 2 * longest + 2)
        return found

    def _ends_a_call(self, row: Row, plan: list[int]) -> bool:
        """Whether the row has written a whole call and its plan only closes the markup
        around it (mistral's `]`, DSML's block close): ending there cuts nothing short."""
        if not (row.spec.needs_call or row.called) or len(plan) > 32:
            return False
        return _only_markup(row.spec.key.partition(":")[0], b"".join(self.pieces.get(t, b"\xff") for t in plan))

    def _call_cost(self, row: Row) -> int | None:
        """Tokens of a shortest call from its trigger on, planned once per grammar from its
        start (the trigger, or the separator and trigger where calls follow one another);
        None where the grammar has no trigger to start one."""
        trigger = row.spec.trigger
        if row.call_cost is not None or not trigger:
            return row.call_cost
        key = row.spec.key
        if key not in self._call_costs:
            _keep(self._call_costs, key, self._plan_call(row.spec, trigger.encode()))
        row.call_cost = self._call_costs[key]
        return row.call_cost

    def _plan_call(self, spec: RowSpec, trigger: bytes) -> int | None:
        probe = self._first_twin(spec).deep_copy()
        if probe.is_error() or probe.try_consume_tokens(list(trigger)) != len(trigger):
            return None
        tokens = _planned_tokens(probe, spec.key.partition(":")[0], self.vocab, trigger)
        return None if tokens is None else tokens + 1

    def no_trigger(self, trigger: str) -> numpy.ndarray:
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
            words32 = bits.sum(dim=1).to(torch.int64).apply_(_signed).to(torch.int32)
            found = self._trigger_masks[trigger] = words32.numpy()
        return found

    def _plan(self, row: Row, fresh: bool = False) -> list[int] | None:
        """Tokens from the row's state to the end of its grammar (the plan's bytes in the
        vocabulary's longest tokens the matcher takes; one-byte tokens where it does not).
        A plan is kept while it, or a tail of it, still ends the grammar from the row's new
        state (a token inside a string value, or one the plan itself begins with, leaves
        the way out as it was): checking is a consume or two, planning afresh ~10 masks;
        a grammar's plan from its start is made once. `fresh`: plan from this state."""
        twin = self._twin(row)
        if twin is None:
            return None
        kept = None if fresh else self._kept(row, twin)
        row.kept_reused = kept is not None
        if kept is None:
            closers = format_closers(row.spec.key.partition(":")[0])
            plan = closing_plan(twin, _STEPS, _EOS, closers, max_bytes=_PLAN_BYTES)
            if plan is None:
                row.kept = None
                return None
            kept = KeptPlan(plan, self._tokens(row.matcher, plan), row.twin_bytes, row.consumed)
            if not row.twin_bytes and not row.consumed:
                _keep(self._start_plans, row.spec.key, kept)
        row.kept = kept
        return kept.tokens

    def _kept(self, row: Row, twin: Any) -> KeptPlan | None:
        """The row's kept plan brought to its new state, or None where it no longer ends
        the grammar (or the row has none: a grammar's start takes its start plan)."""
        old = row.kept
        if old is None:
            start = self._start_plans.get(row.spec.key)
            return start if start is not None and not row.twin_bytes and not row.consumed else None
        here = (row.twin_bytes, row.consumed)
        done = bytes(row.text[old.text_at : row.twin_bytes])
        if old.data.startswith(done):  # the row wrote the plan's first bytes: the rest ends it
            written = row.output[old.output_at : row.consumed]
            if old.tokens[: len(written)] == written:
                return KeptPlan(old.data[len(done) :], old.tokens[len(written) :], *here)
            return KeptPlan(old.data[len(done) :], self._tokens(row.matcher, old.data[len(done) :]), *here)
        for j in range(min(len(old.data), _TAILS)):  # the plan, or its longest tail that ends the grammar
            tail = old.data[j:]
            if _still_ends(twin, tail):
                return KeptPlan(tail, old.tokens if not j else self._tokens(row.matcher, tail), *here)
        return None

    def _twin(self, row: Row) -> Any:
        """The row's byte-vocabulary matcher, fed its output so far (a copy of its grammar's
        first twin: building one parses the grammar, milliseconds)."""
        if row.twin is None:
            row.twin = self._first_twin(row.spec).deep_copy()
        feed = bytes(row.text[row.twin_bytes :])
        if feed:
            done = row.twin.try_consume_tokens(list(feed))
            row.twin_bytes += done
            if done < len(feed):  # text the byte twin cannot follow (a special token): no plan
                row.max_tokens = None
                return None
        return row.twin

    def _first_twin(self, spec: RowSpec) -> Any:
        """The byte twin of `spec`'s grammar at its start, built once per grammar."""
        first = self._twins.get(spec.key)
        if first is None:
            first = _keep(self._twins, spec.key, matcher(spec.plain, _BYTES))
        return first

    def _tokens(self, m: Any, plan: bytes) -> list[int]:
        """`plan` in the vocabulary's longest tokens that the row's matcher `m` takes, left
        to right (a shorter token where it refuses the longest). Asked with
        `validate_tokens` (the matcher is not moved; ~10x cheaper than consume and rollback),
        the longest spelling whole first."""
        out = self.vocab.greedy(plan)
        out = out[: m.validate_tokens(out)] if out else []
        pos = sum(len(self.pieces[t]) for t in out)
        by_bytes = self.vocab.by_bytes
        while pos < len(plan):
            for size in range(min(len(plan) - pos, _TOKEN_BYTES), 0, -1):
                ids = by_bytes.get(plan[pos : pos + size])
                if ids and m.validate_tokens([*out, ids[0]]) == len(out) + 1:
                    out.append(ids[0])
                    pos += size
                    break
            else:
                break
        return out


def shortest_output_tokens(plain: str, format: str, vocab: LlgVocabulary) -> int | None:
    """Tokens of the closing plan from the start of the grammar `plain` (markers spelled as
    text) in `vocab`: under `required`, a named tool or `response_format`, the budget the
    shortest output the grammar admits takes — the one budget closing would follow from the
    first token. The plan's bytes are counted in the vocabulary's longest tokens, as the
    processor spells a plan. None where no plan is found (an error, or over _PLAN_BYTES)."""
    probe = matcher(plain, _BYTES)
    return None if probe.is_error() else _planned_tokens(probe, format, vocab)


def _planned_tokens(probe: Any, format: str, vocab: LlgVocabulary, before: bytes = b"") -> int | None:
    """Tokens of `before` and the closing plan from the byte twin `probe`'s state (None: no
    plan), in the vocabulary's longest tokens (as `_tokens` spells a plan, without asking
    the matcher)."""
    plan = closing_plan(probe, _STEPS, _EOS, format_closers(format), max_bytes=_PLAN_BYTES)
    return None if plan is None else len(vocab.greedy(before + plan))


def _keep(kept: dict[str, Any], key: str, value: Any) -> Any:
    """Keep `value` under `key` in a per-grammar map of at most _KEPT entries (oldest out)."""
    kept[key] = value
    while len(kept) > _KEPT:
        kept.pop(next(iter(kept)))
    return value


def _still_ends(twin: Any, plan: bytes) -> bool:
    """Whether `plan` still takes the byte twin from its state to the end of its grammar
    (EOS admitted after it), asked without moving the twin."""
    return bool(twin.validate_tokens([*plan, _EOS]) == len(plan) + 1)


def _signed(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


# The vocabulary closing plans on: one token per byte, EOS 256.
_EOS = 256
_BYTES = LlgVocabulary.build({bytes([b]): [b] for b in range(256)}, _EOS, {_EOS: "<eos>"}, 257)
_STEPS = {b: b for b in range(256)}
NO_CALL = -1


def _only_markup(format: str, text: bytes) -> bool:
    """Whether `text` only closes the markup after a whole call of `format`: its markers,
    brackets and blanks."""
    for marker in _markup(format):
        text = text.replace(marker, b"")
    return not text.strip(b" \n]}")


@functools.cache
def _value_closers(format: str) -> tuple[bytes, ...]:
    """The markers of `format` that end a parameter's raw value (qwen3-xml's, DSML's)."""
    fmt = FORMATS.get(format)
    return () if fmt is None else tuple(v.encode() for k, v in fmt.markers.named_texts() if k in VALUE_CLOSING_KEYS)


@functools.cache
def _markup(format: str) -> tuple[bytes, ...]:
    """The format's markers that may follow a whole call, longest first: its closers but a
    JSON string's and those that end a parameter's raw value (qwen3-xml's `</parameter>`,
    DSML's): a plan that writes one cuts the value it closes, as a JSON string's `"` does."""
    fmt = FORMATS.get(format)
    values = [] if fmt is None else [v.encode() for k, v in fmt.markers.named_texts() if k in VALUE_CLOSING_KEYS]
    kept = (c for c in format_closers(format) if b'"' not in c and not any(v in c for v in values))
    return tuple(sorted(kept, key=len, reverse=True))
