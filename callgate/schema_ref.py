"""Local `$ref`s of a JSON Schema: `#...` JSON Pointers (RFC 6901) into the same document.

Knows: how a local `$ref` names a subschema of the root (`~1` is `/`, `~0` is `~`), and how
to follow a chain of them. Does not know: remote documents, `$id`/`$anchor`, what keywords
beside a `$ref` mean (callers decide), grammars or parsers.

Shared by the grammar (callgate.constraints: json_schema, values) and the qwen3-xml parser
(which reads a parameter's value by the type of its schema, callgate.parsers.
qwen3_xml_values), so that the two read the same target. Pure: imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# A `$ref` chain longer than this is not followed (a cycle like `{"$ref": "#"}` never ends);
# the grammar refuses chains longer than its own REF_DEPTH (3) before reading a target.
MAX_CHAIN = 8


class RefError(ValueError):
    """A `$ref` that is not local (`remote`) or names nothing in the document."""

    def __init__(self, message: str, *, remote: bool) -> None:
        super().__init__(message)
        self.remote = remote


def ref_target(ref: Any, root: Mapping[str, Any]) -> Any:
    """The subschema of `root` that the local `$ref` `ref` names. Raises RefError."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise RefError(f"{ref!r} is not a local reference", remote=True)
    target: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, Mapping) or part not in target:
            raise RefError(f"{ref!r} does not resolve", remote=False)
        target = target[part]
    return target


def follow_refs(
    schema: Any,
    root: Mapping[str, Any],
    keep: Callable[[Any, Mapping[str, Any]], Any] = lambda target, _outer: target,
) -> Any:
    """The schema that `schema`'s chain of `$ref`s leads to (at most MAX_CHAIN of them; the
    last `$ref` schema when the chain is longer). `keep(target, outer)` carries what the
    caller keeps of the keywords beside each `$ref`. Raises RefError."""
    for _ in range(MAX_CHAIN):
        if not isinstance(schema, Mapping) or "$ref" not in schema:
            return schema
        schema = keep(ref_target(schema["$ref"], root), schema)
    return schema
