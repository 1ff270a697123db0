"""Regex pieces for text: literals, character classes, and free text that avoids markers.

Knows: the regex dialect outlines-core compiles (Rust `regex-syntax`: no look-around, no
back-references) and how to say "any text that does not contain these markers" in it
without look-around. Does not know: any format; callers pass the markers.

Free text is the costly part of a grammar (every token of the vocabulary may be allowed in
it, and outlines-core walks every token from every state), so `text_without` builds the
exact Aho-Corasick language as a regex whose DFA has one state per marker prefix plus one,
with one shared set of UTF-8 continuation states: compile cost grows with the total marker
length, never with the text length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

_META = frozenset("\\.+*?()|[]{}^$#&-~")
_CLASS_META = frozenset("\\]^-[&~")


def literal(text: str) -> str:
    """A regex matching exactly `text`."""
    return "".join("\\" + c if c in _META else c for c in text)


def _class_char(c: str) -> str:
    if c in _CLASS_META:
        return "\\" + c
    if c == "\n":
        return "\\n"
    return c


def char_class_excluding(chars: Iterable[str]) -> str:
    """`[^...]`: any single character except those given (newline included unless given)."""
    body = "".join(_class_char(c) for c in sorted(set(chars)))
    return f"[^{body}]" if body else "(?s:.)"


def ascii_class_excluding(chars: Iterable[str]) -> str:
    """`[...]`: any single ASCII character except those given."""
    excluded = {ord(c) for c in chars}
    allowed = [b for b in range(128) if b not in excluded]
    runs: list[tuple[int, int]] = []
    for b in allowed:
        if runs and runs[-1][1] == b - 1:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    body = "".join(f"\\x{a:02X}" if a == b else f"\\x{a:02X}-\\x{b:02X}" for a, b in runs)
    return f"[{body}]"


def alternation(parts: Iterable[str]) -> str:
    """`(?:a|b|...)`; a single part is returned grouped as well."""
    return "(?:" + "|".join(parts) + ")"


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    terminal: bool = False


def _trie(words: Iterable[str]) -> dict[str, _Node]:
    roots: dict[str, _Node] = {}
    for word in words:
        node = roots.setdefault(word[0], _Node())
        for c in word[1:]:
            if node.terminal:
                break
            node = node.children.setdefault(c, _Node())
        else:
            node.terminal = True
            node.children.clear()
    return roots


def _check_restartable(words: list[str]) -> frozenset[str]:
    starts = frozenset(w[0] for w in words)
    for w in words:
        inner = starts.intersection(w[1:])
        if inner:
            raise ValueError(
                f"marker {w!r} contains {sorted(inner)!r}, which also starts a marker; "
                "text_without needs markers whose first characters occur nowhere else"
            )
    return starts


def _stay(node: _Node) -> str:
    """Strings read from `node` that stay inside the trie (a marker prefix), including ''."""
    alts = [literal(c) + _stay(child) for c, child in node.children.items() if not child.terminal]
    return alternation(alts) + "?" if alts else ""


def _leave(node: _Node, excluded: frozenset[str]) -> str:
    """Strings read from `node` that leave the trie back to plain text on an ASCII character
    (never via a restart); non-ASCII exits are shared by the caller."""
    alts = [literal(c) + _leave(child, excluded) for c, child in node.children.items() if not child.terminal]
    alts.append(ascii_class_excluding(excluded | node.children.keys()))
    return alternation(alts)


def text_without(markers: Iterable[str], *, banned: str = "", nonempty: bool = False) -> str:
    """Regex of every text (possibly empty; at least one character with `nonempty`) that
    contains none of `markers` and none of the characters in `banned`.

    Exact, not an approximation, under one condition checked here: the first character of
    each marker occurs in no marker at any later position (then, after a mismatch inside a
    marker, the only way to start another marker is that first character). Markers that
    hold a banned character can never occur and are dropped. Raises ValueError otherwise.
    """
    banned_set = frozenset(banned)
    words = sorted({m for m in markers if m and not banned_set.intersection(m)})
    single = {w for w in words if len(w) == 1}
    banned_set |= single
    words = [w for w in words if len(w) > 1]
    starts = _check_restartable(words)
    excluded = banned_set | starts
    if not words:
        return char_class_excluding(excluded) + ("+" if nonempty else "*")
    if not all(c.isascii() for w in words for c in w):
        raise ValueError("text_without needs ASCII markers (ban non-ASCII marker characters instead)")
    roots = _trie(words)
    stay = alternation(literal(k) + _stay(node) for k, node in sorted(roots.items()))
    leave = alternation(literal(k) + _leave(node, excluded) for k, node in sorted(roots.items()))
    # One shared non-ASCII exit: the compiled DFA is not minimised, and a separate UTF-8
    # sub-automaton per marker prefix would multiply its states.
    wide = "[^\\x00-\\x7F" + "".join(_class_char(c) for c in sorted(banned_set) if not c.isascii()) + "]"
    plain = ascii_class_excluding(excluded)
    step = f"(?:{plain}|{stay}*(?:{leave}|{wide}))"
    return f"(?:{step}+{stay}*|{stay}+)" if nonempty else f"{step}*{stay}*"
