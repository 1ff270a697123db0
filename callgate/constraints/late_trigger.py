"""Which tokens a lazy row may not write in its free text, as bitmask rows.

Knows: token ids -> bytes (special tokens too, since a trigger or a marker may be one), the
EOS id, and a row's free-text state under its rules (free_text.py). Does not know: grammars,
budgets, vLLM; processor.py decides when to use it.

Before its trigger a lazy row is free text, which may not hold the markers its format keeps
out of content (free_text.py). In each state the tokens that would break the rules are
banned (EOS too, where the text may not end). When the tokens left can no longer hold a
whole call (the trigger included) and EOS, the processor also holds the row back: the
tokens that would start the call (complete the trigger, or write a marker only the trigger
may hold) are banned too, so the model writes text instead of a call that would be cut.

A token can only be banned by a pattern (marker, trigger, reasoning opener or closer) that
it completes: one its bytes contain whole (the same for every state, found by one scan of
the vocabulary per rules, ~15 ms for 49k tokens), or one the tail began (the tokens that
start with its rest: a bisection of the sorted token bytes). Only those candidates are
walked; in a pending state (free_text.py) the few tokens that carry the trigger on are the
allowed ones. Verdicts and rows are kept per (rules, state), and rows are never freed, so
an address stays valid.

`marks(rules)` serves the processor's free-text bookkeeping: a flag per token id, set where
the token's bytes contain a pattern or end with a proper prefix of one. A row with an empty
tail that samples an unflagged token still has an empty tail and broke no rule, so it skips
the token with one lookup (most free-text tokens).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

import numpy

from callgate.constraints.free_text import CALL, FreeText, State, proper_prefixes
from callgate.constraints.walk import pack_bits


@dataclass(frozen=True, slots=True)
class Verdict:
    """The next tokens of one state. `allowed` set: only those (a pending state); else
    `banned` are forbidden, and `starting` too when the row is held back."""

    allowed: frozenset[int] | None
    banned: frozenset[int]
    starting: frozenset[int]
    may_end: bool

    @property
    def bans(self) -> bool:
        return self.allowed is not None or bool(self.banned) or not self.may_end


class TriggerGuard:
    """Bitmask rows (int32) that allow every token a lazy row's free text may take next."""

    def __init__(self, pieces: Mapping[int, bytes], eos_token_id: int | None = None) -> None:
        self.eos = eos_token_id
        self.pieces = {i: data for i, data in pieces.items() if i != eos_token_id}
        self.size = max(pieces, default=-1) + 1
        ordered = sorted(self.pieces.items(), key=lambda item: item[1])
        self._keys, self._ids = [data for _, data in ordered], [i for i, _ in ordered]
        self._by_bytes: dict[bytes, list[int]] = {}
        for i, data in self.pieces.items():
            self._by_bytes.setdefault(data, []).append(i)
        self._scans: dict[FreeText, tuple[bytes, frozenset[int]]] = {}
        self.verdicts: dict[tuple[FreeText, State], Verdict] = {}
        self.masks: dict[tuple[FreeText, State, bool, int], tuple[numpy.ndarray, int]] = {}

    def marks(self, rules: FreeText) -> bytes:
        """Per token id (ids past the end have no bytes): 1 where the token's bytes contain a
        pattern of `rules` or end with a proper prefix of one, else 0. Kept per rules."""
        return self._scan(rules)[0]

    def verdict(self, rules: FreeText, state: State) -> Verdict:
        """What may follow `state` (kept per rules and state)."""
        found = self.verdicts.get((rules, state))
        if found is None:
            found = self.verdicts[(rules, state)] = self._judge(rules, state)
        return found

    def row(self, rules: FreeText, state: State, n_words: int, *, held: bool = False) -> tuple[numpy.ndarray, int]:
        """The allowed-bits row for a row in `state`, and the address of its first word
        (`held`: the tokens that would start a call are banned too, unless only the trigger
        may follow)."""
        slot = (rules, state, held, n_words)
        found = self.masks.get(slot)
        if found is None:
            v = self.verdict(rules, state)
            width = 32 * n_words
            if v.allowed is not None:
                row = pack_bits(sorted(i for i in v.allowed if i < width), n_words).numpy()
            else:
                banned = v.banned | v.starting if held else v.banned
                if not v.may_end and self.eos is not None:
                    banned = banned | {self.eos}
                row = (~pack_bits(sorted(i for i in banned if i < width), n_words)).numpy()
            found = self.masks[slot] = (row, int(row.ctypes.data))
        return found

    def _judge(self, rules: FreeText, state: State) -> Verdict:
        pieces = self.pieces
        candidates = self._candidates(rules, state[1])
        if rules.pending(state):
            allowed = frozenset(i for i in candidates if rules.step(state, pieces[i]) is not None)
            return Verdict(allowed, frozenset(), frozenset(), False)
        banned, starting = [], []
        for i in candidates:
            after = rules.step(state, pieces[i])
            if after is None:
                banned.append(i)
            elif after[0] == CALL or rules.pending(after):
                starting.append(i)
        return Verdict(None, frozenset(banned), frozenset(starting), rules.may_end(state))

    def _candidates(self, rules: FreeText, tail: bytes) -> set[int]:
        """Every token that can complete a pattern after `tail` (or carry one on unfinished)."""
        found = set(self._scan(rules)[1])
        for k in range(1, len(tail) + 1):
            begun = tail[-k:]
            for pattern in rules.patterns:
                if len(pattern) > k and pattern.startswith(begun):
                    rest = pattern[k:]
                    found.update(self._starting_with(rest))
                    for j in range(1, len(rest)):
                        found.update(self._by_bytes.get(rest[:j], ()))
        return found

    def _starting_with(self, rest: bytes) -> list[int]:
        keys, at = self._keys, bisect_left(self._keys, rest)
        end = at
        while end < len(keys) and keys[end].startswith(rest):
            end += 1
        return self._ids[at:end]

    def _scan(self, rules: FreeText) -> tuple[bytes, frozenset[int]]:
        """(the marks, the tokens that hold a whole pattern) of `rules`, kept."""
        found = self._scans.get(rules)
        if found is None:
            whole = re.compile(b"|".join(re.escape(p) for p in rules.patterns))
            first = re.compile(b"[" + b"".join(re.escape(p[:1]) for p in rules.patterns) + b"]")
            prefixes = proper_prefixes(rules.patterns)
            longest = max(len(p) for p in rules.patterns)
            flags, holding = bytearray(self.size), []
            for i, data in self.pieces.items():
                if first.search(data) is None:
                    continue
                if whole.search(data) is not None:
                    flags[i] = 1
                    holding.append(i)
                elif any(data[-k:] in prefixes for k in range(1, min(len(data), longest - 1) + 1)):
                    flags[i] = 1
            found = self._scans[rules] = (bytes(flags), frozenset(holding))
        return found
