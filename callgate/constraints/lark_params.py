"""A tool's parameter object as alternative parameter sets, for formats that write one tag
per parameter (DSML, qwen3-xml) instead of a JSON object.

Knows: how a JSON-Schema object splits into the sets of parameters a call may write:
`properties`/`required` of the object, of its `allOf` parts (merged) and of each
`anyOf`/`oneOf` branch (one set per branch, the shared `properties` merged in: the shape
pydantic and zod write for a discriminated union), through local `$ref`s (applied with
their sibling keywords, as 2020-12 reads them); what each object schema of a set says of the
keys it does not evaluate, checked once the set is whole: `additionalProperties` (keys
outside its own `properties`/`patternProperties`), `unevaluatedProperties` (keys it and
its in-place parts do not evaluate) -- `false` forbids the key, a schema applies to its
value -- and `patternProperties` (apply to the keys they match). So a branch closed on its
own keys forbids the shared ones, as a validator reads it. Does not know: how a value is
written (callers read each member's schemas).

    parameter_sets(schema, path, bad) -> list[tuple[Member, ...]]

Only declared parameters are ever written (a free-form object gets none but its required
ones): the keys of a set are then known and unique. `oneOf` is read as `anyOf` (the
validator, checking the exact schema, has the last word). A keyword the sets cannot
enforce (`minProperties`, `maxProperties`, an object `enum`/`const`, too many branch
combinations) is appended to `bad`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from callgate.constraints.param_path import at
from callgate.schema_ref import RefError, ref_target

MAX_SETS = 64  # branch combinations of one tool (an anyOf of anyOfs multiplies)
_UNENFORCED = ("minProperties", "maxProperties", "enum", "const")


@dataclass(frozen=True, slots=True)
class Member:
    """One parameter of a set: its key, every schema that applies to its value (all of
    them must hold), and whether the set requires it."""

    key: str
    schemas: tuple[Any, ...]
    required: bool


@dataclass(frozen=True, slots=True)
class _Closure:
    """What one object schema says of the keys it does not evaluate: `extra` (its
    `additionalProperties`, or `unevaluatedProperties`) for every key outside `keys`
    that none of `patterns` matches; `patterns` add their schemas where `apply`."""

    keys: frozenset[str]
    patterns: Mapping[str, Any]
    extra: Any
    apply: bool


@dataclass(slots=True)
class _Set:
    props: dict[str, list[Any]] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)
    closures: list[_Closure] = field(default_factory=list)

    def merged(self, other: _Set) -> _Set:
        props = {k: list(v) for k, v in self.props.items()}
        for key, schemas in other.props.items():
            props.setdefault(key, []).extend(schemas)
        return _Set(props, self.required | other.required, [*self.closures, *other.closures])

    def members(self) -> tuple[Member, ...] | None:
        """The set's parameters under every closure; None when one forbids a required key."""
        props = {**self.props, **{k: [True] for k in sorted(self.required - self.props.keys())}}
        out: list[Member] = []
        for key, schemas in props.items():
            extra = _extra(key, self.closures)
            if extra is None:
                if key in self.required:
                    return None
                continue
            out.append(Member(key, (*schemas, *extra), key in self.required))
        return tuple(out)


def _extra(key: str, closures: list[_Closure]) -> list[Any] | None:
    """The schemas the closures add to `key`'s value; None when one forbids the key."""
    out: list[Any] = []
    for c in closures:
        matched = [v for p, v in c.patterns.items() if _search(p, key)]
        if c.apply:
            out += matched
        if key in c.keys or matched or c.extra is True:
            continue
        if c.extra is False:
            return None
        out.append(c.extra)
    return out


def parameter_sets(schema: Mapping[str, Any], path: str, bad: list[str]) -> list[tuple[Member, ...]]:
    """The parameter sets of a tool's parameter schema (declared order, the object's own
    properties first); [] when no object fits it."""
    sets = _sets(schema, schema, path, bad, 8)
    return [m for s in sets if (m := s.members()) is not None]


def _sets(node: Any, root: Mapping[str, Any], path: str, bad: list[str], depth: int) -> list[_Set]:
    if node is True:
        return [_Set()]
    if not isinstance(node, Mapping) or depth <= 0:
        return []  # False, or a $ref chain past its bound: no object
    kind = node.get("type", "object")
    if "object" not in (kind if isinstance(kind, list) else [kind]):
        return []
    bad += [at(path, k) for k in _UNENFORCED if k in node]
    own = node.get("properties") or {}
    sets = [_Set({k: [v] for k, v in own.items()}, set(node.get("required") or []))]
    parts = [(at(path, "allOf", i), sub) for i, sub in enumerate(node.get("allOf") or [])]
    if "$ref" in node:  # beside other keywords it applies with them (2020-12), as allOf
        try:
            parts.append((at(path, "$ref"), ref_target(node["$ref"], root)))
        except RefError:
            bad.append(at(path, "$ref"))
            return []
    for where, sub in parts:
        sets = [a.merged(b) for a in sets for b in _sets(sub, root, where, bad, depth - 1)]
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list):
            alts = [s for i, br in enumerate(branches) for s in _sets(br, root, at(path, key, i), bad, depth - 1)]
            sets = [a.merged(b) for a in sets for b in alts]
    if len(sets) > MAX_SETS:
        bad.append(at(path, "anyOf"))
        return []
    patterns = node.get("patternProperties") or {}
    for s in sets:
        if "additionalProperties" in node or patterns:
            s.closures.append(_Closure(frozenset(own), patterns, node.get("additionalProperties", True), True))
        if "unevaluatedProperties" in node:  # sees what this schema and its parts evaluate
            s.closures.append(_Closure(frozenset(s.props), patterns, node["unevaluatedProperties"], False))
    return sets


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False
