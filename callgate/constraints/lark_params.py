"""A tool's parameter object as alternative parameter sets, for formats that write one tag
per parameter (DSML, qwen3-xml) instead of a JSON object.

Knows: how a JSON-Schema object splits into the sets of parameters a call may write:
`properties`/`required` of the object, of its `allOf` parts (merged) and of each
`anyOf`/`oneOf` branch (one set per branch, the shared `properties` merged in: the shape
pydantic and zod write for a discriminated union), through local `$ref`s;
`additionalProperties` (a closed object keeps its own properties only, a schema applies to
the others) and `patternProperties` (apply to the declared keys they match). Does not know:
how a value is written (callers read each member's schemas).

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

from callgate.constraints.json_schema import at
from callgate.schema_ref import RefError, follow_refs

MAX_SETS = 64  # branch combinations of one tool (an anyOf of anyOfs multiplies)
_UNENFORCED = ("minProperties", "maxProperties", "enum", "const")


@dataclass(frozen=True, slots=True)
class Member:
    """One parameter of a set: its key, every schema that applies to its value (all of
    them must hold), and whether the set requires it."""

    key: str
    schemas: tuple[Any, ...]
    required: bool


@dataclass(slots=True)
class _Set:
    props: dict[str, list[Any]] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)

    def merged(self, other: _Set) -> _Set:
        props = {k: list(v) for k, v in self.props.items()}
        for key, schemas in other.props.items():
            props.setdefault(key, []).extend(schemas)
        return _Set(props, self.required | other.required)


def parameter_sets(schema: Mapping[str, Any], path: str, bad: list[str]) -> list[tuple[Member, ...]]:
    """The parameter sets of a tool's parameter schema (declared order, the object's own
    properties first); [] when no object fits it."""
    sets = _sets(schema, schema, path, bad, 8)
    return [tuple(Member(k, tuple(v), k in s.required) for k, v in s.props.items()) for s in sets]


def _sets(node: Any, root: Mapping[str, Any], path: str, bad: list[str], depth: int) -> list[_Set]:
    try:
        node = follow_refs(node, root)
    except RefError:
        bad.append(at(path, "$ref"))
        return []
    if node is True:
        return [_Set()]
    if not isinstance(node, Mapping) or "$ref" in node or depth <= 0:
        return []  # False, or a $ref chain past its bound: no object
    kind = node.get("type", "object")
    if "object" not in (kind if isinstance(kind, list) else [kind]):
        return []
    bad += [at(path, k) for k in _UNENFORCED if k in node]
    own = node.get("properties") or {}
    sets = [_Set({k: [v] for k, v in own.items()}, set(node.get("required") or []))]
    for i, sub in enumerate(node.get("allOf") or []):
        sets = [a.merged(b) for a in sets for b in _sets(sub, root, at(path, "allOf", i), bad, depth - 1)]
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list):
            alts = [s for i, br in enumerate(branches) for s in _sets(br, root, at(path, key, i), bad, depth - 1)]
            sets = [a.merged(b) for a in sets for b in alts]
    if len(sets) > MAX_SETS:
        bad.append(at(path, "anyOf"))
        return []
    return [s for s in (_closed(s, node) for s in sets) if s is not None]


def _closed(s: _Set, node: Mapping[str, Any]) -> _Set | None:
    """`s` under `node`'s `additionalProperties`/`patternProperties`, its required keys
    declared; None when the node forbids a key the set requires."""
    own = node.get("properties") or {}
    patterns = node.get("patternProperties") or {}
    extra = node.get("additionalProperties", True)
    closed_late = node.get("unevaluatedProperties", True) is False
    for key in sorted(s.required - s.props.keys()):
        if closed_late:
            return None
        s.props[key] = [True]
    props: dict[str, list[Any]] = {}
    for key, schemas in s.props.items():
        matched = [v for p, v in patterns.items() if _search(p, key)]
        if key not in own and not matched:
            if extra is False:
                if key in s.required:
                    return None
                continue
            if extra is not True:
                schemas = [*schemas, extra]
        props[key] = [*schemas, *matched]
    return _Set(props, s.required)


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False
