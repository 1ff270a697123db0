"""Budget closing: which tokens keep a complete output reachable within the tokens left.

Knows: outlines-core's Index (states, `get_next_state`, `get_allowed_tokens`,
`is_final_state`) and the bitmask layout (bit j of word w is token 32 * w + j). Does not
know: vLLM, formats, HTTP; `processor.py` calls it per row.

Distances are distance.py's D(state) (tokens to a final state, an upper bound kept
consistent). Plans and distances are memoised per (grammar key, state); a distance search
that visits more than `max_states` states gives up (the processor then leaves that row as
it is today, logged), and nothing is computed before a request's last `bound` tokens.

Plan of a state: every token the grammar allows there, grouped by need = D(next) + 2 (the
token, the rest of the completion, EOS); EOS itself needs 1 in a final state. With r tokens
left (r counts the one being sampled) and slack = r - 1 - d, where
d = min need - 1 (at most D(state)):
* slack > 0: allow the tokens with need <= r (a token that opens more than the budget can
  close is masked; the model still chooses among the rest);
* slack = 0: allow only need == r: the model follows a shortest completion and writes EOS
  as its last allowed token, so a closed call ends at exactly max_tokens;
* slack < 0 (the row started with fewer tokens left than its shortest output, or a trigger
  came too late): nothing can close in time; the grammar's mask stands and the output is
  cut at max_tokens as before (the parser reports the unterminated call).

Gate (a heuristic, not a proof; halves the cost on replayed BFCL outputs): most states a
request reaches are new (every request has its own grammar key), and a new state's plan
costs ~1.5 ms (successors + their distances). A state is not planned while its slack
exceeds the largest one-token rise of D seen in this grammar's plans plus a whole call
(D of the initial state, what opening another call costs); a rise never seen before that
is larger than this could make a row late.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from callgate.constraints.distance import UNREACHABLE, TokenDistances

DEFAULT_BOUND = 512  # budget closing looks at the last 512 tokens of a request; before that, today's masks
MAX_GATED_KEYS = 4_096  # grammars whose largest one-token rise of D the gate remembers
DEFAULT_MAX_STATES = 5_000  # ~0.2 s of byte transitions: a distance search visiting more gives up (row left alone)


@dataclass(frozen=True, slots=True)
class StatePlan:
    """The tokens of one state by need. `needs` ascending and distinct; `prefix[k]` is the
    bitmask of every group before k+1 (so `prefix[-1]` is the grammar's own mask);
    `single[k]` the bitmask of group k alone."""

    distance: int
    needs: tuple[int, ...]
    prefix: torch.Tensor  # [len(needs), words] int32
    single: torch.Tensor  # [len(needs), words] int32

    @property
    def nbytes(self) -> int:
        return (self.prefix.numel() + self.single.numel()) * 4


def pack_bits(ids: Sequence[int], n_words: int) -> torch.Tensor:
    """Token ids -> one int32 bitmask row of `n_words` words (little-endian bit order)."""
    bits = numpy.zeros(n_words * 32, dtype=numpy.bool_)
    bits[numpy.asarray(ids, dtype=numpy.int64)] = True
    return torch.from_numpy(numpy.packbits(bits, bitorder="little").view("<i4").astype(numpy.int32))


def successors(index: Any, state: int, eos_token_id: int) -> dict[int, list[int]]:
    """The tokens allowed at `state` (EOS left out) by the state they lead to. One
    `get_next_state` per allowed token: ~6 ms for the 49k tokens of a free string state."""
    found: dict[int, list[int]] = {}
    for token in index.get_allowed_tokens(state):
        nxt = None if token == eos_token_id else index.get_next_state(state, token)
        if nxt is not None:
            found.setdefault(nxt, []).append(token)
    return found


def state_plan(
    edges: Mapping[int, list[int]], final: bool, eos_token_id: int, n_words: int, distance: Callable[[int], int]
) -> StatePlan:
    """The plan of a state from its successors and their distances. Raises LookupError
    for a dead state (outlines-core prunes them; never seen)."""
    by_need: dict[int, list[int]] = {1: [eos_token_id]} if final else {}
    for n, tokens in edges.items():
        by_need.setdefault(min(distance(n), UNREACHABLE) + 2, []).extend(tokens)
    if not by_need:
        raise LookupError("a state with no allowed token")
    needs = tuple(sorted(by_need))
    single = torch.stack([pack_bits(by_need[k], n_words) for k in needs])
    prefix = single.clone()
    for k in range(1, len(needs)):
        prefix[k] |= prefix[k - 1]
    return StatePlan(needs[0] - 1, needs, prefix, single)


def shortest_output_tokens(index: Any, by_bytes: Mapping[bytes, Sequence[int]], key: str = "") -> int:
    """Tokens of a grammar's shortest complete output, EOS included (an upper bound: the
    shortest text spelled with the longest tokens). A max_tokens below this cannot end in a
    whole call: budget closing leaves such a request to be cut. SmolLM2, one small tool:
    about 35 for hermes, 60 for qwen3-xml, 150 for dsml-v4 (three tokens per full-width
    marker character). Raises LookupError when the search gives up."""
    return TokenDistances(by_bytes).get(key, index, index.get_initial_state()) + 1


def choose(plan: StatePlan, remaining: int) -> torch.Tensor | None:
    """The bitmask row for `remaining` tokens left, None when the grammar's own mask stands
    (nothing to restrict, or nothing can close in time)."""
    if plan.distance + 1 == remaining:  # no slack: needs[0] == remaining
        return plan.single[0]
    j = bisect.bisect_right(plan.needs, remaining)
    if j == len(plan.needs) or j == 0:
        return None
    return plan.prefix[j - 1]


class BudgetCloser:
    """Per-engine plans by (grammar key, state, width), least recently used first out."""

    def __init__(
        self,
        by_bytes: Mapping[bytes, Sequence[int]],
        eos_token_id: int,
        *,
        bound: int = DEFAULT_BOUND,
        max_states: int = DEFAULT_MAX_STATES,
        budget_bytes: int = 64 << 20,
    ) -> None:
        self.distances = TokenDistances(by_bytes, max_states=max_states)
        self.eos_token_id, self.bound, self.budget_bytes = eos_token_id, bound, budget_bytes
        self.plans: OrderedDict[tuple[str, int, int], StatePlan] = OrderedDict()
        self.used_bytes = 0
        # per key: the largest max-need - 2 - D(state) seen in a plan; least recently raised
        # key first out (a forgotten key only turns the gate off for it: plans are made again)
        self.jumps: OrderedDict[str, int] = OrderedDict()

    def mask(self, key: str, index: Any, state: int, remaining: int, n_words: int) -> torch.Tensor | None:
        """The restricted bitmask row, or None to keep the grammar's mask. Raises
        LookupError when a distance search gave up: the caller stops closing that row."""
        if remaining > self.bound or self._far(key, index, state, remaining):
            return None
        return choose(self.plan(key, index, state, n_words), remaining)

    def _far(self, key: str, index: Any, state: int, remaining: int) -> bool:
        """Heuristic gate (not a proof): the plan cannot restrict while the slack exceeds
        the largest rise of D seen over one token in this grammar's plans plus a whole
        call (D of the initial state, what opening another call costs)."""
        jump = self.jumps.get(key)
        if jump is None:
            return False
        whole = self.distances.get(key, index, index.get_initial_state())
        return remaining - 1 - self.distances.get(key, index, state) > jump + whole + 2

    def plan(self, key: str, index: Any, state: int, n_words: int) -> StatePlan:
        slot = (key, state, n_words)
        found = self.plans.get(slot)
        if found is not None:
            self.plans.move_to_end(slot)
            return found
        edges = successors(index, state, self.eos_token_id)
        final = bool(index.is_final_state(state))
        found = state_plan(edges, final, self.eos_token_id, n_words, lambda s: self.distances.get(key, index, s))
        self.plans[slot] = found
        rises = [k for k in found.needs if k < UNREACHABLE]
        self.jumps[key] = max(self.jumps.get(key, 0), rises[-1] - 2 - found.distance)
        self.jumps.move_to_end(key)
        if len(self.jumps) > MAX_GATED_KEYS:
            self.jumps.popitem(last=False)
        self.used_bytes += found.nbytes
        while self.used_bytes > self.budget_bytes and len(self.plans) > 1:
            _, evicted = self.plans.popitem(last=False)
            self.used_bytes -= evicted.nbytes
        return found
