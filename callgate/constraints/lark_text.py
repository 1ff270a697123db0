"""Lark pieces for llguidance grammars: literals, markers, free text, embedded JSON schemas.

Knows: the Lark dialect llguidance 1.7 reads (docs/syntax.md there): `%json {schema}` as a
non-terminal, `<name>` for a special token of the vocabulary (only in rules, never inside a
terminal), terminals built with `&` / `~` (and / not) outside `/.../`, and `[lazy]` rules.
Does not know: any format; callers pass markers and schemas.

Two facts of llguidance's lexer shape everything here (measured with a byte vocabulary):
* its lexemes are greedy: a free-text terminal that merely excludes a marker dies on the
  marker's last byte instead of ending before it, so text that a marker ends is a `[lazy]`
  rule (shortest match, it ends at the marker's first occurrence);
* a special token is never produced by a regex: free text cannot hold one, and a marker that
  is a special token of the vocabulary must be written `<name>` to be produced at all.
  `Builder.marker` writes both spellings where the vocabulary has the token (by id,
  `<[151657]>`): the strict parser reads text, and the token's text is the same text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
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
    """A terminal body: any text (valid UTF-8) that contains none of `markers`."""
    alts = sorted({m for m in markers if m}, key=lambda m: (len(m), m))
    if not alts:
        return ANY
    body = "|".join(regex_literal(m) for m in alts)
    return f"{ANY} & ~/(?s:.*)({body})(?s:.*)/"


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
        return self.rule(stem, f"{body} {lit(end)}", lazy=True)

    def render(self, start: str) -> str:
        """The grammar text with `start` as its start rule."""
        lines = ["%llguidance {}", f"start: {start}", *self._rules.values()]
        return "\n".join(lines) + "\n"
