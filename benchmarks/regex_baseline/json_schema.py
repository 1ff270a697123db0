"""JSON Schema -> regular expression of the JSON texts that satisfy it.

Knows: a subset of Draft 2020-12 that it can enforce exactly or more strictly, written in
the JSON lexical pieces of json_text.py (RFC 8259 as `json.dumps` writes it).
Does not know: formats or vocabularies; of tools only how a refusal names a tool's schema
(`tool_param`, an OpenAI-style `param` built with `at`).

Why not `outlines_core.json_schema.build_regex_from_schema`: checked on outlines-core
0.2.14, it silently ignores `minimum`/`maximum`/`multipleOf`/`uniqueItems`/
`maxProperties`/`patternProperties`/..., compiles `oneOf` as a plain alternation (a value
matching two branches passes), and its string pattern refuses valid JSON (`\\uXXXX`
escapes and raw U+007F..U+009F, which `json.dumps(ensure_ascii=False)` writes). A grammar
must never be weaker than the schema, so this module names any keyword it cannot enforce
(SchemaTooComplexError) instead of dropping it.

`unevaluatedProperties` is enforced as `true` or `false` (what `strict: true` adds, see
callgate.strict_tools): `false` closes the objects of its schema and of the schemas it
applies in place (`$ref`, `allOf`, `anyOf`, `oneOf` branches), so a free-form object there
is `{}`, unless `additionalProperties` says otherwise.

Deliberately stricter than the schema (documented, never weaker):
* object properties appear in `properties` order and undeclared keys are not produced when
  `properties` is given; a free-form value (`{}`, untyped `items`/`additionalProperties`)
  nests containers at most `GENERIC_DEPTH` deep;
* under `unevaluatedProperties: false`, an object's keys all come from one `anyOf`/`oneOf`
  branch (the validator also accepts keys spread over several valid branches);
* whitespace is at most one space around `:` and `,` (what `json.dumps` writes, or none);
* strings never hold `\\u` escapes of surrogates; integers have no fraction or exponent;
* a number has at most `MAX_INTEGER_DIGITS` digits before its point and an exponent that
  keeps it below 1e308 (callgate.constraints.json_lexemes NUMBER; the parsers refuse a number past a double's 1.8e308);
* recursive `$ref` is unrolled `REF_DEPTH` times;
* `format` is an annotation in 2020-12; `date`, `time`, `date-time` and `uuid` are
  enforced anyway, other formats are left unchecked (as a 2020-12 validator does).

Known gap: a regex cannot forbid a repeated key in a free-form object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from callgate.constraints.json_lexemes import FORMATS, INTEGER, NUMBER
from callgate.constraints.param_path import at
from callgate.constraints.value_schema import ANNOTATIONS, with_closure
from callgate.errors import SchemaTooComplexError
from callgate.schema_ref import RefError, ref_target

from .json_text import (
    BOOLEAN,
    GENERIC_DEPTH,
    NULL,
    STRING,
    STRING_CHAR,
    WS,
    const_regex,
    ordered_members,
    typed_generic,
)
from .text import alternation

REF_DEPTH = 3
MAX_REPEAT = 256
# each `prefixItems` entry nests the regex one level deeper (outlines-core refuses ~100)
MAX_PREFIX_ITEMS = 32
# A schema's regex; past this its byte DFA alone takes seconds (measured: 333 KB, 3.6 s)
MAX_REGEX_CHARS = 512 * 1024

_BY_TYPE: Mapping[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
}
_GENERAL = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "unevaluatedProperties"})
# keywords that may stand next to `$ref` or to the combinators (they apply in place)
_IN_PLACE = frozenset({"unevaluatedProperties"})
# keywords that `type` beside them narrows (see _narrowed)
_APPLIED = frozenset({"const", "enum", "anyOf", "oneOf", "allOf"})
_KINDS = ("null", "boolean", "object", "array", "number", "string")
# a schema with a keyword the grammar cannot enforce is refused, never constrained less
_UNSUPPORTED = "is not supported by the grammar, which enforces " + ", ".join(
    sorted(_GENERAL | frozenset().union(*_BY_TYPE.values()), key=str.lower)
)


def _too_complex(path: str, keyword: str, why: str) -> SchemaTooComplexError:
    return SchemaTooComplexError(f"schema keyword {keyword!r} at {path or 'the schema root'} {why}", param=path or None)


@dataclass(frozen=True, slots=True)
class Context:
    """The root schema (for `$ref`), the remaining depth budgets, whether an
    `unevaluatedProperties: false` closes the object of the schema at hand, and the types a
    `type` beside `const`/`enum`/`anyOf`/`oneOf`/`allOf` allows it (None: any). Both reach
    through in-place applicators, never into property or item values."""

    root: Mapping[str, Any]
    generic_depth: int = GENERIC_DEPTH
    ref_depth: int = REF_DEPTH
    closed: bool = False
    types: frozenset[str] | None = None


def _values(ctx: Context) -> Context:
    """The context of a property or item value: `unevaluatedProperties` does not reach it."""
    return replace(ctx, closed=False, types=None) if ctx.closed or ctx.types is not None else ctx


def _value_regex(value: Any, path: str, keyword: str) -> str:
    try:
        return const_regex(value)
    except ValueError:
        raise _too_complex(path, keyword, "holds a number outside a double's range, which JSON cannot write") from None


def schema_regex(schema: Any, ctx: Context | None = None, path: str = "") -> str:
    """Regex of the JSON texts valid under `schema`.

    Raises SchemaTooComplexError naming the first keyword it cannot enforce, or when the
    schema admits no value it can produce.
    """
    rx = value_regex(schema, ctx, path)
    if rx is None:
        raise SchemaTooComplexError(
            f"schema at {path or 'the schema root'} admits no value the grammar can write (bounds that"
            " contradict each other, an empty enum after filtering, or a $ref recursion deeper than"
            " the grammar unrolls)",
            param=path or None,
        )
    return rx


def value_regex(schema: Any, ctx: Context | None = None, path: str = "") -> str | None:
    """`schema_regex`, or None when the schema admits no value (a part of a schema, such as
    its non-string values, may have none)."""
    ctx = ctx or Context(root=schema if isinstance(schema, Mapping) else {})
    return _regex(schema, ctx, path)


def object_regex(schema: Any, ctx: Context | None = None, path: str = "") -> str:
    """Regex of the JSON objects valid under `schema`: what function arguments may be.

    Arguments are always an object, whatever else the schema admits: an empty schema,
    `true` or one without `type` means any object (keywords of other types do not apply
    to an object). Raises SchemaTooComplexError as `schema_regex` does, or when the schema
    admits no object.
    """
    ctx = ctx or Context(root=schema if isinstance(schema, Mapping) else {})
    rx = _regex(_objects_only(schema, ctx, path, ctx.ref_depth), ctx, path)
    if rx is None:
        where = path or "the schema root"
        raise SchemaTooComplexError(
            f"schema at {where} admits no JSON object; arguments are always one", param=path or None
        )
    return rx


def _objects_only(schema: Any, ctx: Context, path: str, ref_depth: int) -> Any:
    """`schema` narrowed to its object values (False: it has none). Looks through a leading
    `$ref` and into the branches of `anyOf`/`oneOf`/`allOf`; below that `_regex` decides."""
    if schema is True:
        return {"type": "object"}
    if not isinstance(schema, Mapping):
        return schema
    _check_keywords(schema, path)
    if "$ref" in schema:
        target = with_closure(_ref_target(schema["$ref"], ctx, path), schema)
        return _objects_only(target, ctx, at(path, "$ref"), ref_depth - 1) if ref_depth > 0 else False
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            narrowed = [_objects_only(b, ctx, at(path, key, i), ref_depth) for i, b in enumerate(schema[key])]
            kept = narrowed if key == "allOf" else [b for b in narrowed if b is not False]
            return {**schema, key: kept} if kept else False
    if "const" in schema:
        return schema if isinstance(schema["const"], Mapping) else False
    if isinstance(schema.get("enum"), list):
        objects = [v for v in schema["enum"] if isinstance(v, Mapping)]
        return {**schema, "enum": objects} if objects else False
    if "type" in schema and "object" not in declared_types(schema, path):
        return False
    return {**schema, "type": "object"}


def _regex(schema: Any, ctx: Context, path: str) -> str | None:
    """None: no value can be produced (a `false` schema, or a recursion cut off). Raises
    SchemaTooComplexError as soon as a subschema's regex passes MAX_REGEX_CHARS: an array's
    item regex stands twice in it, so nested bounded arrays double it per level (16 levels:
    21 MB of regex, minutes of DFA building; 30 levels would not fit in memory)."""
    rx = _build(schema, ctx, path)
    if rx is not None and len(rx) > MAX_REGEX_CHARS:
        raise _too_complex(path, "schema", f"makes a grammar of over {MAX_REGEX_CHARS} characters; simplify it")
    return rx


def _build(schema: Any, ctx: Context, path: str) -> str | None:
    if schema is True or schema == {}:
        return typed_generic(ctx.generic_depth, ctx.closed, ctx.types)
    if schema is False:
        return None
    if not isinstance(schema, Mapping):
        raise _too_complex(path, "schema", "is neither an object nor a boolean")
    _check_keywords(schema, path)
    if "unevaluatedProperties" in schema:
        closes = schema["unevaluatedProperties"] is False
        rest = {k: v for k, v in schema.items() if k != "unevaluatedProperties"}
        return _regex(rest, replace(ctx, closed=closes), path)
    if "type" in schema and schema.keys() & _APPLIED:
        return _narrowed(schema, ctx, path)
    if "$ref" in schema:
        return _ref(schema, ctx, path)
    if "allOf" in schema:
        return _all_of(schema, ctx, path)
    if "const" in schema:
        value = schema["const"]
        return None if _unevaluated(value, ctx) or not _fits(value, ctx) else _value_regex(value, path, "const")
    if "enum" in schema:
        return _enum(schema, ctx, path)
    if "anyOf" in schema or "oneOf" in schema:
        return _any_of(schema, ctx, path)
    return _typed(schema, declared_types(schema, path), ctx, path)


def _check_keywords(schema: Mapping[str, Any], path: str) -> None:
    known = ANNOTATIONS | _GENERAL | frozenset().union(*_BY_TYPE.values())
    for key in schema:
        if key not in known:
            raise _too_complex(path, key, _UNSUPPORTED)
    if not isinstance(schema.get("unevaluatedProperties", False), bool):
        raise _too_complex(path, "unevaluatedProperties", f"other than true or false {_UNSUPPORTED}")
    if "$ref" in schema and len(schema.keys() - ANNOTATIONS - _IN_PLACE) > 1:
        raise _too_complex(path, "$ref", f"with sibling keywords {_UNSUPPORTED}")
    combined = [k for k in ("const", "enum", "anyOf", "oneOf", "allOf") if k in schema]
    if len(combined) > 1 or (combined and schema.keys() & frozenset().union(*_BY_TYPE.values())):
        raise _too_complex(path, combined[0], f"combined with other validation keywords {_UNSUPPORTED}")


def declared_types(schema: Mapping[str, Any], path: str) -> list[str]:
    declared = schema.get("type")
    if declared is None:
        inferred = [t for t, kws in _BY_TYPE.items() if schema.keys() & kws]
        return inferred or [*_KINDS, "integer"]
    types = [declared] if isinstance(declared, str) else list(declared)
    for t in types:
        if t not in (*_KINDS, "integer"):
            raise _too_complex(path, "type", f"names unknown type {t!r}")
    return types


def _narrowed(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    """A `type` beside `const`/`enum`/`anyOf`/`oneOf`/`allOf`: both apply, so the rest of the
    schema is built for the declared types only (exact: a value must satisfy both)."""
    types = _meet(ctx.types, declared_types(schema, path))
    rest = {k: v for k, v in schema.items() if k != "type"}
    return _regex(rest, replace(ctx, types=types), path)


def _meet(outer: frozenset[str] | None, declared: Sequence[str]) -> frozenset[str]:
    """The types allowed by both (an integer is a number)."""
    if outer is None:
        return frozenset(declared)
    both = set(outer) & set(declared)
    if ("integer" in outer and "number" in declared) or ("number" in outer and "integer" in declared):
        both.add("integer")
    return frozenset(both)


def _fits(value: Any, ctx: Context) -> bool:
    """Whether a `const`/`enum` value is of the types the context allows. For `integer`, a
    whole float (`2.0`) is left out: stricter, as the qwen3-xml parser reads no point there."""
    if ctx.types is None:
        return True
    kind = _kind_of(value)
    if kind == "number" and "number" not in ctx.types:
        return isinstance(value, int) and "integer" in ctx.types
    return kind in ctx.types


def _typed(schema: Mapping[str, Any], types: list[str], ctx: Context, path: str) -> str | None:
    if ctx.types is not None:
        met = _meet(ctx.types, types)
        types = [t for t in types if t in met] + sorted(met - set(types))
    if set(types) >= {"integer", "number"}:
        types = [t for t in types if t != "integer"]
    builders: dict[str, Callable[[], str | None]] = {
        "null": lambda: NULL,
        "boolean": lambda: BOOLEAN,
        "integer": lambda: INTEGER,
        "number": lambda: NUMBER,
        "string": lambda: _string(schema, path),
        "array": lambda: _array(schema, ctx, path),
        "object": lambda: _object(schema, ctx, path),
    }
    alts = [rx for t in types if (rx := builders[t]()) is not None]
    return alternation(alts) if alts else None


def _bound(schema: Mapping[str, Any], key: str, path: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _too_complex(path, key, "must be a non-negative integer")
    if value > MAX_REPEAT:
        raise _too_complex(path, key, f"above {MAX_REPEAT} makes the grammar too large")
    return value


def _repeat(lo: int | None, hi: int | None) -> str:
    lo = lo or 0
    if hi is None:
        return "*" if lo == 0 else ("+" if lo == 1 else f"{{{lo},}}")
    return f"{{{lo},{hi}}}"


def _string(schema: Mapping[str, Any], path: str) -> str | None:
    """The JSON strings of a string schema; None when `minLength` exceeds `maxLength`."""
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMATS and not schema.keys() & {"minLength", "maxLength"}:
        return f'"{FORMATS[fmt]}"'
    lo, hi = _bound(schema, "minLength", path), _bound(schema, "maxLength", path)
    if lo is not None and hi is not None and lo > hi:
        return None
    if lo is None and hi is None:
        return STRING
    return f'"{STRING_CHAR}{_repeat(lo, hi)}"'


def _enum(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise _too_complex(path, "enum", "must be a non-empty array")
    kept = [v for v in values if not _unevaluated(v, ctx) and _fits(v, ctx)]
    return alternation(_value_regex(v, path, "enum") for v in kept) if kept else None


def _unevaluated(value: Any, ctx: Context) -> bool:
    """Whether a `const`/`enum` value is an object with fields that a closing
    `unevaluatedProperties` rejects (neither keyword evaluates any field)."""
    return ctx.closed and isinstance(value, Mapping) and bool(value)


def _all_of(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    parts = schema["allOf"]
    if not isinstance(parts, list) or len(parts) != 1:
        raise _too_complex(path, "allOf", f"with more than one schema (an intersection) {_UNSUPPORTED}")
    return _regex(parts[0], ctx, at(path, "allOf", 0))


def _kinds(schema: Any) -> frozenset[str] | None:
    """JSON kinds a branch can produce, when evident from `type`/`const`/`enum`."""
    if not isinstance(schema, Mapping):
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        return frozenset(_kind_of(v) for v in values)
    declared = schema.get("type")
    if declared is None or schema.keys() & {"anyOf", "oneOf", "allOf", "$ref"}:
        return None
    types = {declared} if isinstance(declared, str) else set(declared)
    return frozenset("number" if t == "integer" else t for t in types)


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _any_of(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    key = "anyOf" if "anyOf" in schema else "oneOf"
    branches = schema[key]
    if not isinstance(branches, list) or not branches:
        raise _too_complex(path, key, "must be a non-empty array")
    if key == "oneOf":
        _check_disjoint(branches, path)
    alts = [rx for i, b in enumerate(branches) if (rx := _regex(b, ctx, at(path, key, i))) is not None]
    return alternation(alts) if alts else None


def _check_disjoint(branches: Sequence[Any], path: str) -> None:
    seen: set[str] = set()
    for b in branches:
        kinds = _kinds(b)
        if kinds is None or seen & kinds:
            raise _too_complex(
                path, "oneOf", f"with branches that may overlap (not evidently of distinct types) {_UNSUPPORTED}"
            )
        seen |= kinds


def _ref(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    if ctx.ref_depth <= 0:
        return None
    inner = replace(ctx, ref_depth=ctx.ref_depth - 1)
    return _regex(_ref_target(schema["$ref"], ctx, path), inner, at(path, "$ref"))


def _ref_target(ref: Any, ctx: Context, path: str) -> Any:
    try:
        return ref_target(ref, ctx.root)
    except RefError as exc:
        raise _too_complex(path, "$ref", f"to a remote document {_UNSUPPORTED}" if exc.remote else str(exc)) from None


def _array(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    """Item i matches `prefixItems[i]`, later items `items` (any value when absent); an
    array may stop anywhere, within `minItems`..`maxItems`. A `false` position ends it."""
    lo, hi = _bound(schema, "minItems", path) or 0, _bound(schema, "maxItems", path)
    prefix = schema.get("prefixItems", [])
    if not isinstance(prefix, list):
        raise _too_complex(path, "prefixItems", "must be an array")
    if len(prefix) > MAX_PREFIX_ITEMS:
        raise _too_complex(
            path, "prefixItems", f"with more than {MAX_PREFIX_ITEMS} entries makes the grammar too large"
        )
    inner = _values(ctx)
    slots: list[str] = []
    for i, sub in enumerate(prefix):
        rx = _regex(sub, inner, at(path, "prefixItems", i))
        if rx is None:
            break
        slots.append(rx)
    items = _regex(schema.get("items", True), inner, at(path, "items")) if len(slots) == len(prefix) else None
    longest = len(slots) if items is None else None
    if hi is not None:
        longest = hi if longest is None else min(hi, longest)
    if longest is not None and lo > longest:
        return None
    body = _elements(slots, items, lo, longest, 0)
    return rf"\[{WS}{body}{WS}\]" if body else rf"\[{WS}\]"


def _elements(slots: Sequence[str], items: str | None, lo: int, hi: int | None, i: int) -> str:
    """Elements i.. of an array with at least `lo` and at most `hi` of them in all: slot i
    (then i+1, ...) while the prefix lasts, then `items` repeated."""
    sep = f"{WS},{WS}" if i else ""
    if hi is not None and i >= hi:
        return ""
    if i < len(slots):
        body = sep + slots[i] + _elements(slots, items, lo, hi, i + 1)
    elif items is None:
        return ""
    elif i:
        return f"(?:{sep}{items}){_repeat(max(lo - i, 0), None if hi is None else hi - i)}"
    else:
        body = items + f"(?:{WS},{WS}{items}){_repeat(max(lo - 1, 0), None if hi is None else hi - 1)}"
    return body if i < lo else f"(?:{body})?"


def _object(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    props = schema.get("properties")
    required = schema.get("required", [])
    if not isinstance(required, list):
        raise _too_complex(path, "required", "must be an array")
    if props is None:
        if required:
            raise _too_complex(path, "required", "without `properties` is not supported")
        return _free_object(schema, ctx, path)
    if not isinstance(props, Mapping):
        raise _too_complex(path, "properties", "must be an object")
    missing = [r for r in required if r not in props]
    if missing:
        raise _too_complex(path, "required", f"names undeclared properties {missing!r}")
    members: list[tuple[str, bool]] = []
    for name, sub in props.items():
        rx = _regex(sub, _values(ctx), at(path, "properties", name))
        if rx is None:
            if name in required:
                return None
            continue
        members.append((f"{const_regex(name)}{WS}:{WS}{rx}", name in required))
    return rf"\{{{WS}{ordered_members(members, f'{WS},{WS}')}{WS}\}}"


def _free_object(schema: Mapping[str, Any], ctx: Context, path: str) -> str | None:
    extra = schema.get("additionalProperties", not ctx.closed)
    value = _regex(extra, _values(ctx), at(path, "additionalProperties"))
    if value is None:
        return rf"\{{{WS}\}}"
    member = f"{STRING}{WS}:{WS}{value}"
    return rf"\{{{WS}(?:{member}(?:{WS},{WS}{member})*)?{WS}\}}"
