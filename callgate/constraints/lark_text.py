"""Lark pieces for llguidance grammars: literals, markers, free text, embedded JSON schemas.

Knows: the Lark dialect llguidance 1.7 reads (docs/syntax.md there): `%json {schema}` as a
non-terminal, `<name>` for a special token of the vocabulary (only in rules, never inside a
terminal), terminals built with `&` / `~` (and / not) outside `/.../`, and `[lazy]` rules.
Does not know: any format; callers pass markers and schemas.

Two facts of llguidance's lexer shape everything here (measured with a byte vocabulary):
* its lexemes are greedy: a free-text terminal that merely excludes a marker dies on the
  marker's last byte instead of ending before it, so text that a marker ends is ONE
  terminal, the text then the marker (the text cannot hold the marker, so the match ends
  at its first occurrence) — not a `[lazy]` rule, which llguidance's slicer skips;
* a special token is never produced by a regex: free text cannot hold one, and a marker that
  is a special token of the vocabulary must be written `<name>` to be produced at all.
  `Builder.marker` writes both spellings where the vocabulary has the token (by id,
  `<[151657]>`): the strict parser reads text, and the token's text is the same text.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ANY = "/(?s:.*)/"
# The JSON the formats write: one optional space after `,` and `:` (json.dumps' and the
# models'), no newlines.
JSON_OPTIONS: Mapping[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,
}


def lit(text: str) -> str:
    """A Lark string literal matching exactly `text`."""
    return json.dumps(text, ensure_ascii=False)


def regex_literal(text: str) -> str:
    """`text` escaped for use inside `/.../` (a control character as `\\xHH`: a raw newline
    ends the regex there)."""
    escaped = re.escape(text).replace("/", "\\/")
    return re.sub(r"\\?([\x00-\x1f])", lambda c: f"\\x{ord(c.group(1)):02x}", escaped)


def without(markers: Iterable[str]) -> str:
    """A terminal body: any text (valid UTF-8) that contains none of `markers` — nor, where a
    marker holds another's first character past its own start, the marker's rest from there
    (`\n</parameter>` keeps `</parameter>` out: slightly stricter, see `_kept_out`).

    Written without `~` where it can be: llguidance's mask skips walking the vocabulary's
    trie for a whole slice of tokens (SLICES in constraints/llg.py) only where it can prove
    the slice's regex inside the lexer state's language, and it cannot through a negation:
    a raw value's mask took ~330 us on 49k ids with `~`, ~5 us without."""
    return _without(frozenset(m for m in markers if m))


@functools.lru_cache(maxsize=256)
def _without(markers: frozenset[str]) -> str:
    """`without`, once per marker set (a format has a few; building one takes milliseconds)."""
    alts = _kept_out(markers)
    if not alts:
        return ANY
    plain = _pivoted(alts) or avoiding(alts)
    if plain is not None:
        return f"/{plain}/"
    body = "|".join(regex_literal(m) for m in alts)
    return f"{ANY} & ~/(?s:.*)({body})(?s:.*)/"


_TAIL = 4  # the shortest tail kept out for its marker: a shorter one would keep out too much


def _kept_out(markers: Iterable[str]) -> list[str]:
    """The texts `without` keeps out: of each marker, its tail from the first character past
    its start that begins some marker (where `_TAIL` characters or more are left), so that no
    text lies inside two markers at once and `_pivoted`'s short form applies (llguidance's
    slicer proves nothing through the nested loops `avoiding` writes otherwise); and of
    those only the ones that hold no other (a text without `｜` holds no DSML marker)."""
    words = set(markers)
    while True:
        firsts = {w[0] for w in words}
        cut = {next((w[i:] for i in range(1, len(w) - _TAIL + 1) if w[i] in firsts), w) for w in words}
        if cut == words:
            break
        words = cut
    return sorted((w for w in words if not any(o != w and o in w for o in words)), key=lambda m: (len(m), m))


def avoiding(words: Sequence[str]) -> str | None:
    """A regex without negation of the texts that hold none of `words`; None where it would
    be longer than `_AVOIDING_CHARS` (the caller then writes the negation).

    The texts are the paths of the words' Aho-Corasick automaton that never complete a word;
    every state accepts (a text may end inside a word's prefix). Its states are eliminated
    deepest first: a state's edges lead back to shallower states (the longest suffix that
    begins a word) or on to its children, already gone, so an elimination mostly substitutes
    and the regex stays about as long as the words' trie times their first characters."""
    prefixes = {w[:i] for w in words for i in range(len(w))}
    prefixes = {p for p in prefixes if not any(p.endswith(w) for w in words)}
    chars = sorted({c for w in words for c in w})
    edges: dict[str, dict[str, list[str]]] = {}  # state -> target ("$": the end) -> regexes
    for p in prefixes:
        out: dict[str, list[str]] = {"$": [""]}
        elsewhere = []  # chars that do not go back to the start
        for c in chars:
            text = p + c
            if any(text.endswith(w) for w in words):
                elsewhere.append(c)
                continue
            q = next(text[i:] for i in range(len(text) + 1) if text[i:] in prefixes)
            if q:
                elsewhere.append(c)
                out.setdefault(q, []).append(_char(c))
        out.setdefault("", []).append(f"[^{''.join(map(_char, elsewhere))}]")
        edges[p] = out
    for p in sorted((p for p in prefixes if p), key=lambda p: (-len(p), p)):
        _eliminate(edges, p)
        if sum(len(r) for targets in edges.values() for rs in targets.values() for r in rs) > _AVOIDING_CHARS:
            return None
    loop, end = _alt(edges[""].get("", [])), _alt(edges[""].get("$", []))
    return f"(?:{loop})*" + (f"(?:{end})" if end else "")


_AVOIDING_CHARS = 50_000


def _pivoted(words: Sequence[str]) -> str | None:
    """`avoiding` in a shorter form, for words no first character of which recurs inside
    any of them (what `_kept_out` leaves of every format's markers); None for other words.
    A text is free characters and runs that begin with a first character: `Q` walks into a
    word's trie and stops where another first character begins the next run, `W` walks in
    and leaves it on a character that goes nowhere in the trie; a text may end inside one."""
    firsts = sorted({w[0] for w in words})
    if any(c in firsts for w in words for c in w[1:]):
        return None
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for c in w:
            node = node.setdefault(c, {})
        node[""] = {}  # a whole word ends here

    def walk(node: dict[str, Any], leave: bool) -> str:
        alts = [] if not leave else [f"[^{''.join(_char(c) for c in sorted({*firsts, *node} - {''}))}]"]
        alts += [_char(c) + _group(walk(child, leave)) for c, child in sorted(node.items()) if c and "" not in child]
        if not leave:
            alts = ["", *alts]
        return _alt(alts)

    q = _alt([_char(c) + _group(walk(trie[c], False)) for c in firsts if "" not in trie[c]])
    w = _alt([_char(c) + _group(walk(trie[c], True)) for c in firsts if "" not in trie[c]])
    free = f"[^{''.join(_char(c) for c in firsts)}]"
    runs = f"(?:{q})*" if q else ""
    return f"(?:{free}|{runs}{_group(w)})*{runs}" if w else f"{free}*"


def _eliminate(edges: dict[str, dict[str, list[str]]], state: str) -> None:
    """Remove `state`: each path into it, around its loop and out of it becomes one edge."""
    out = edges.pop(state)
    loop = _alt(out.pop(state, []))
    star = f"(?:{loop})*" if loop else ""
    for targets in edges.values():
        into = targets.pop(state, None)
        if into is None:
            continue
        head = _group(_alt(into))
        for target, regexes in out.items():
            targets.setdefault(target, []).append(head + star + _group(_alt(regexes)))


def _alt(regexes: Sequence[str]) -> str:
    """One regex of the alternatives (an empty one matches the empty text)."""
    unique = list(dict.fromkeys(regexes))
    return unique[0] if len(unique) == 1 else "|".join(unique)


def _group(regex: str) -> str:
    return f"(?:{regex})" if "|" in regex else regex


def _char(c: str) -> str:
    """`c` in a regex or a character class, whatever it is."""
    if c.isascii() and c.isalnum():
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\x{{{ord(c):x}}}"


@dataclass(slots=True)
class Builder:
    """Accumulates the rules of one grammar. `specials`: the vocabulary's special tokens,
    text -> id (a marker among them is also written as that token)."""

    specials: Mapping[str, int] = field(default_factory=dict)
    json_options: Mapping[str, Any] = field(default_factory=lambda: dict(JSON_OPTIONS))
    _rules: dict[str, str] = field(default_factory=dict)
    _names: dict[str, str] = field(default_factory=dict)

    def rule(self, stem: str, body: str, *, lazy: bool = False) -> str:
        """Add `stem: body` (a rule) under a fresh name; returns the name. The same body
        under the same stem is added once."""
        return self._add(stem.lower(), body, "[lazy]" if lazy else "")

    def parametric(self, stem: str, body_of: Callable[[str], str]) -> str:
        """Add a rule parameterised by a 64-bit value (llguidance's `name::_`, its docs/
        parametric.md): `body_of(name)` is its body, which may refer to itself as
        `name::set_bit(k)` and hold `%if` conditions. Use it as `name::0x0`."""
        name = self._fresh(stem.lower())
        self._rules[name] = f"{name}::_: {body_of(name)}"
        return name

    def terminal(self, stem: str, body: str) -> str:
        """Add a terminal (a regex: literals, `/.../`, `&`, `~`, other terminals)."""
        return self._add(stem.upper(), body, "")

    def _add(self, stem: str, body: str, attrs: str) -> str:
        slot = f"{stem}{attrs}\0{body}"
        found = self._names.get(slot)
        if found is not None:
            return found
        name = self._fresh(stem)
        self._rules[name] = f"{name}{attrs}: {body}"
        self._names[slot] = name
        return name

    def _fresh(self, stem: str) -> str:
        return stem if stem not in self._rules else f"{stem}_{len(self._rules)}"

    def marker(self, text: str) -> str:
        """An expression producing `text`: the literal, or the special token too."""
        token = self.specials.get(text)
        if token is not None:
            return f"(<[{token}]> | {lit(text)})"
        return lit(text)

    def json(self, schema: Mapping[str, Any]) -> str:
        """A rule for JSON text of `schema` (llguidance's JSON-schema compiler)."""
        doc = dict(schema)
        doc["x-guidance"] = {**dict(self.json_options), **dict(doc.get("x-guidance") or {})}
        return self.rule("json", "%json " + json.dumps(doc, ensure_ascii=False, sort_keys=False))

    def text(self, stem: str, markers: Iterable[str]) -> str:
        """A terminal of free text holding none of `markers`."""
        return self.terminal(stem, without(markers))

    def text_until(self, stem: str, markers: Iterable[str], end: str) -> str:
        """Free text holding none of `markers`, then `end` (its first occurrence): a lazy rule,
        or where `end` is a special token of the vocabulary, the text and that token alone
        (the text cannot hold the token, and its plain spelling is kept out of the text)."""
        body = self.text(stem + "_text", [*markers, end])
        token = self.specials.get(end)
        if token is not None:
            return self.rule(stem, f"{body} <[{token}]>")
        # one terminal: the text cannot hold `end`, so the match ends where `end` first ends,
        # as a lazy rule's would; and llguidance's slicer skips lazy lexemes
        return self.terminal(stem, f"{body} {lit(end)}")

    def render(self, start: str) -> str:
        """The grammar text with `start` as its start rule."""
        lines = ["%llguidance {}", f"start: {start}", *self._rules.values()]
        return "\n".join(lines) + "\n"
