"""Budget closing: which tokens keep a complete output reachable within the tokens left.

Knows: outlines-core's Index (only through automaton.py), the bitmask layout, and the
grammar's own mask row of a state (the processor fills it first). Does not know: vLLM,
formats, HTTP; `processor.py` calls it per row.

Per grammar key, the byte automaton and every state's distance D (automaton.py: tokens
to a final state, an upper bound kept consistent) are read from the file the server wrote
beside the Index (closing_store.py, about a millisecond), or built here once (5-40 ms for
BFCL grammars on SmolLM2). Per (key, state) the plan groups the state's allowed tokens by
need = D(next) + 2 (the token, the rest of the completion, EOS; EOS needs 1 in a final
state), walking every allowed token through the byte table in C (walk.py): a few
microseconds for a state with a handful of tokens, ~0.3 ms for a free string's ~49k.
Nothing is computed before a request's last `bound` tokens, nor while the tokens left
exceed every need the grammar has (its largest D plus 2: 32-45 tokens for BFCL hermes
grammars, 34-61 qwen3-xml, 90-156 dsml-v4), nor while they exceed every need the row's
state has (reach + 2, automaton.py); in the replayed BFCL outputs the last skip leaves
about one plan in four.

With r tokens left (r counts the one being sampled) and slack = r - 1 - d, where
d = min need - 1 (at most D(state)):
* slack > 0: allow the tokens with need <= r (a token that opens more than the budget can
  close is masked; the model still chooses among the rest);
* slack = 0: allow only need == r: the model follows a shortest completion and writes EOS
  as its last allowed token, so a closed call ends at exactly max_tokens;
* slack < 0 (the row started with fewer tokens left than its shortest output, or a trigger
  came too late): nothing can close in time; the grammar's mask stands and the output is
  cut at max_tokens as before (the parser reports the unterminated call).

Because D is consistent, a row that starts with slack >= 0 keeps a token with need <= r at
every step, so it always closes in time. Both skips are exact: with r >= largest D + 2,
or r >= reach(state) + 2, no allowed token can need more than r, so the plan would allow
everything (None, or at slack 0 a single group that is the whole mask).
"""

from __future__ import annotations

import bisect
import functools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy
import torch

from callgate.constraints import closing_store
from callgate.constraints.automaton import DEFAULT_MAX_STATES, ByteAutomaton, Spelling, build_automaton
from callgate.constraints.walk import TokenBytes, Walker

K = TypeVar("K")
V = TypeVar("V")

DEFAULT_BOUND = 512  # budget closing looks at the last 512 tokens of a request; before that, today's masks


@dataclass(frozen=True, slots=True)
class StatePlan:
    """The tokens of one state by need. `needs` ascending and distinct; `prefix[k]` is the
    bitmask of every group before k+1 (so `prefix[-1]` is the grammar's own mask);
    `single[k]` the bitmask of group k alone."""

    distance: int
    needs: tuple[int, ...]
    prefix: numpy.ndarray  # [len(needs), words] int32
    single: numpy.ndarray  # [len(needs), words] int32

    @property
    def nbytes(self) -> int:
        return int(self.prefix.nbytes + self.single.nbytes)


def shortest_output_tokens(index: Any, by_bytes: Mapping[bytes, Sequence[int]]) -> int:
    """Tokens of a grammar's shortest complete output, EOS included (an upper bound: the
    fewest tokens spelling one shortest text). A max_tokens below this cannot end in a
    whole call: budget closing leaves such a request to be cut. SmolLM2, one small tool:
    about 35 for hermes, 60 for qwen3-xml, 150 for dsml-v4 (three tokens per full-width
    marker character). Raises LookupError when the grammar is too large to measure."""
    return int(build_automaton(index, Spelling.of(by_bytes)).distance[0]) + 1


def choose(plan: StatePlan, remaining: int) -> numpy.ndarray | None:
    """The bitmask row for `remaining` tokens left, None when the grammar's own mask stands
    (nothing to restrict, or nothing can close in time)."""
    if plan.distance + 1 == remaining:  # no slack: needs[0] == remaining
        row: numpy.ndarray = plan.single[0]
        return row
    j = bisect.bisect_right(plan.needs, remaining)
    if j == len(plan.needs) or j == 0:
        return None
    row = plan.prefix[j - 1]
    return row


class SizedLRU(Generic[K, V]):
    """A mapping that keeps at most `budget_bytes` of values (each entry's size given
    when it is put), least recently used first out; the newest entry always stays."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes, self.used_bytes = budget_bytes, 0
        self.entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self.entries.get(key)
        if found is None:
            return None
        self.entries.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V, nbytes: int) -> V:
        self.entries[key] = (value, nbytes)
        self.used_bytes += nbytes
        while self.used_bytes > self.budget_bytes and len(self.entries) > 1:
            _, (_, evicted) = self.entries.popitem(last=False)
            self.used_bytes -= evicted
        return value

    def __len__(self) -> int:
        return len(self.entries)


class BudgetCloser:
    """Per-engine automata by grammar key and plans by (key, state, width), each least
    recently used first out within its byte budget."""

    def __init__(
        self,
        by_bytes: Mapping[bytes, Sequence[int]],
        eos_token_id: int,
        *,
        bound: int = DEFAULT_BOUND,
        max_states: int = DEFAULT_MAX_STATES,
        budget_bytes: int = 64 << 20,
        automata_bytes: int = 256 << 20,
    ) -> None:
        self.by_bytes, self.eos_token_id, self.bound = by_bytes, eos_token_id, bound
        self.max_states = max_states
        self.plans: SizedLRU[tuple[str, int, int], StatePlan] = SizedLRU(budget_bytes)
        self.automata: SizedLRU[str, ByteAutomaton] = SizedLRU(automata_bytes)

    @property
    def spelling(self) -> Spelling:
        """Built on first use (~0.2 s for 49k tokens): engines that never close skip it.
        Raises LookupError (every time) when the vocabulary lacks a one-byte token."""
        found = self._spelling()
        if isinstance(found, LookupError):
            raise found
        return found

    @functools.cache  # noqa: B019 - one closer per engine, kept for its life
    def _spelling(self) -> Spelling | LookupError:
        found = Spelling.usable(self.by_bytes)
        if found is None:
            return LookupError("a token uses a byte with no one-byte token: budget closing needs one per byte")
        return found

    @functools.cached_property
    def walker(self) -> Walker:
        return Walker(TokenBytes.of(self.by_bytes), self.eos_token_id, self.bound + 2)

    def automaton(self, key: str, index: Any, index_path: str | None = None) -> ByteAutomaton:
        """The byte automaton of grammar `key`: kept, else the tables the server wrote beside
        `index_path` (closing_store), else built here. Raises LookupError when the grammar
        is too large (more than `max_states` byte states) or the vocabulary lacks one-byte tokens."""
        found = self.automata.get(key)
        if found is not None:
            return found
        found = None if index_path is None else closing_store.load(index_path)
        if found is None:
            found = build_automaton(index, self.spelling, self.max_states)
        return self.automata.put(key, found, found.nbytes)

    def distance(self, key: str, index: Any, state: int, index_path: str | None = None) -> int:
        """D of an Index state (UNREACHABLE: no completion). Raises LookupError (see automaton)."""
        automaton = self.automaton(key, index, index_path)
        return int(automaton.distance[automaton.state(state)])

    def mask(
        self, key: str, index: Any, state: int, remaining: int, allowed: torch.Tensor, index_path: str | None = None
    ) -> torch.Tensor | None:
        """The restricted bitmask row, or None to keep the grammar's mask `allowed` (the
        state's own int32 row). Raises LookupError when the grammar cannot be measured:
        the caller stops closing that row. (The processor calls `restrict` with the
        tables it keeps per row.)"""
        if remaining > self.bound:
            return None
        found = self.restrict(key, self.automaton(key, index, index_path), state, remaining, allowed.numpy())
        return None if found is None else torch.from_numpy(found)

    def restrict(
        self, key: str, automaton: ByteAutomaton, state: int, remaining: int, allowed: numpy.ndarray
    ) -> numpy.ndarray | None:
        """`mask` for grammar `key` whose tables are `automaton`; `allowed` the state's own
        row as an int32 array. No plan while `remaining` covers every need at this state
        (its reach + 2, exact; reach is at most the grammar's farthest D, so this also
        covers the grammar-wide skip, which the processor takes before reading the state)."""
        dense = automaton.state(state)
        if remaining >= automaton.reach[dense] + 2:
            return None
        return choose(self._plan(key, automaton, state, dense, allowed), remaining)

    def plan(self, key: str, index: Any, state: int, allowed: torch.Tensor, index_path: str | None = None) -> StatePlan:
        """The plan of Index state `state` (kept per key, state and row width)."""
        automaton = self.automaton(key, index, index_path)
        return self._plan(key, automaton, state, automaton.state(state), allowed.numpy())

    def _plan(self, key: str, automaton: ByteAutomaton, state: int, dense: int, allowed: numpy.ndarray) -> StatePlan:
        slot = (key, state, allowed.size)
        found = self.plans.get(slot)
        if found is not None:
            return found
        groups = self.walker.groups(automaton, dense, allowed)
        prefix = numpy.bitwise_or.accumulate(groups.single, axis=0) if len(groups.needs) > 1 else groups.single
        found = StatePlan(groups.needs[0] - 1, groups.needs, prefix, groups.single)
        return self.plans.put(slot, found, found.nbytes)
