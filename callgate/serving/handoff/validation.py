"""The validator handoff: envelopes, verdicts, the `Validator` role and the built-in check.

Knows: what a validator receives for one candidate (`ValidationRequest`, serialised by
`envelope_dict`), what it answers (`Verdict`), the published JSON Schemas of both
(`ENVELOPE_SCHEMA`, `VERDICT_SCHEMA`; `schemas/*.schema.json` are copies a test keeps
equal), how a verdict document from elsewhere is read (`parse_verdict`), and the built-in
`JsonSchemaValidator`: a strict Draft 2020-12 check of the arguments against the tool's
declared `parameters`.
Does not know: HTTP (see `validation_http`), the chat flow, repair rounds or the audit log.

Errors in a verdict are `{path, message, kind}`: `path` is a JSON Pointer (RFC 6901) into the
arguments, `kind` a short label (the failing JSON Schema keyword, or `unknown_tool`) used for
metrics; a downstream validator may omit `kind`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import referencing
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, relevance
from referencing.exceptions import Unresolvable

from callgate.serving.handoff.idempotency import idempotency_key as idempotency_key
from callgate.strict_tools import strict_schema as strict_schema

VerdictName = Literal["accepted", "rejected"]

_POINTER_PATTERN = "^(/([^/~]|~[01])*)*$"

VERDICT_SCHEMA: Mapping[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:callgate:validation-verdict",
    "title": "callgate validation verdict",
    "description": "A downstream validator's answer for one tool-call candidate. Unknown fields are ignored.",
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "verdict": {"const": "accepted"},
                "arguments": {
                    "type": "object",
                    "description": "normalised arguments; when present they replace the model's",
                },
            },
            "required": ["verdict"],
        },
        {
            "type": "object",
            "properties": {
                "verdict": {"const": "rejected"},
                "errors": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/error"}},
                "retryable": {"type": "boolean", "description": "whether the model could fix the call"},
            },
            "required": ["verdict", "errors", "retryable"],
        },
    ],
    "$defs": {
        "error": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "pattern": _POINTER_PATTERN,
                    "description": "JSON Pointer into the arguments",
                },
                "message": {"type": "string", "minLength": 1},
                "kind": {"type": "string", "description": "optional label, e.g. the failing keyword"},
            },
            "required": ["path", "message"],
        }
    },
}

ENVELOPE_SCHEMA: Mapping[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:callgate:validation-envelope",
    "title": "callgate validation envelope",
    "description": (
        "What callgate POSTs to a downstream validator for one tool-call candidate. "
        "Validators must ignore fields they do not know."
    ),
    "type": "object",
    "properties": {
        "request_id": {"type": "string", "minLength": 1},
        "call_id": {"type": "string", "minLength": 1},
        "tool": {"type": "string", "description": "the name as the model wrote it"},
        "arguments": {"type": "object", "description": "the decoded arguments, as the model wrote them"},
        "raw": {"type": "string", "description": "the exact text of the call in the model output"},
        "format": {"type": "string", "description": "the tool-call wire format, e.g. hermes"},
        "model": {"type": "string"},
        "schema": {
            "type": ["object", "boolean", "null"],
            "description": "the tool's declared parameters; null when the tool was not declared",
        },
        "strict": {"type": "boolean", "description": "the tool was declared strict: unknown fields are errors"},
        "constrained": {"type": "boolean", "description": "whether the grammar held the call"},
        "actor": {
            "type": "string",
            "minLength": 1,
            "description": (
                "who asks: the x-callgate-actor header (when the server trusts it), else the request's "
                "user field (user / safety_identifier / metadata.user_id), else anonymous"
            ),
        },
        "scope": {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "sha256 of the canonical conversation before the call (the request's messages)",
        },
        "idempotency_key": {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": (
                "sha256 of actor, tool, canonical arguments and scope: a retried request repeats it, "
                "a later turn does not; also the Idempotency-Key header"
            ),
        },
        "truncated": {
            "type": "boolean",
            "description": (
                "budget closing cut these arguments short to end the output within max_tokens: they are "
                "valid under the grammar but not what the model would have written"
            ),
        },
    },
    "required": [
        "request_id",
        "call_id",
        "tool",
        "arguments",
        "raw",
        "format",
        "model",
        "schema",
        "strict",
        "constrained",
        "actor",
        "scope",
        "idempotency_key",
        "truncated",
    ],
}

_VERDICT_CHECK = Draft202012Validator(VERDICT_SCHEMA)


class Envelope(Protocol):
    """Anything with the envelope's fields (ValidationRequest, or the chat service's own)."""

    @property
    def request_id(self) -> str: ...
    @property
    def call_id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def arguments(self) -> Any: ...
    @property
    def raw(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def schema(self) -> Mapping[str, Any] | bool | None: ...
    @property
    def constrained(self) -> bool: ...
    @property
    def actor(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def strict(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ValidationRequest:
    """One candidate for a validator. `schema` is None when the tool was not declared; `actor`,
    `scope` and `idempotency_key` are callgate.serving.handoff.idempotency's."""

    request_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    raw: str
    format: str
    model: str
    schema: Mapping[str, Any] | bool | None
    constrained: bool
    actor: str
    scope: str
    idempotency_key: str
    strict: bool = False
    truncated: bool = False  # budget closing cut its arguments short (max_tokens)


@dataclass(frozen=True, slots=True)
class Verdict:
    """`accepted` (with normalised arguments, or None to keep the model's) or `rejected`
    (with at least one `{path, message, kind}` error, and whether a retry could help)."""

    verdict: VerdictName
    arguments: dict[str, Any] | None = None
    errors: tuple[Mapping[str, str], ...] = ()
    retryable: bool = False
    validator: str = ""

    @staticmethod
    def accept(validator: str, arguments: dict[str, Any] | None = None) -> Verdict:
        return Verdict("accepted", arguments=arguments, validator=validator)

    @staticmethod
    def reject(validator: str, errors: Iterable[Mapping[str, str]], *, retryable: bool) -> Verdict:
        return Verdict("rejected", errors=tuple(errors), retryable=retryable, validator=validator)


class Validator(Protocol):
    """A verdict per candidate. Raises ValidatorUnavailableError (503) when none can be had."""

    name: str

    async def validate(self, req: Envelope) -> Verdict: ...


def envelope_dict(req: Envelope) -> dict[str, Any]:
    """The envelope as the JSON object of ENVELOPE_SCHEMA."""
    schema = req.schema
    return {
        "request_id": req.request_id,
        "call_id": req.call_id,
        "tool": req.tool,
        "arguments": req.arguments,
        "raw": req.raw,
        "format": req.format,
        "model": req.model,
        "schema": dict(schema) if isinstance(schema, Mapping) else schema,
        "strict": req.strict,
        "constrained": req.constrained,
        "actor": req.actor,
        "scope": req.scope,
        "idempotency_key": req.idempotency_key,
        "truncated": bool(getattr(req, "truncated", False)),
    }


def verdict_dict(v: Verdict) -> dict[str, Any]:
    """The verdict as the JSON object of VERDICT_SCHEMA (plus the validator's identity)."""
    out: dict[str, Any] = {"verdict": v.verdict, "validator": v.validator}
    if v.verdict == "accepted":
        if v.arguments is not None:
            out["arguments"] = v.arguments
    else:
        out["errors"] = [dict(e) for e in v.errors]
        out["retryable"] = v.retryable
    return out


def verdict_problems(doc: Any) -> list[str]:
    """Why `doc` is not a verdict of VERDICT_SCHEMA (empty when it is one)."""
    return [f"{pointer(e.absolute_path)}: {e.message}" for e in _VERDICT_CHECK.iter_errors(doc)]


def parse_verdict(doc: Any, validator: str) -> Verdict:
    """A verdict document (already decoded JSON) -> Verdict. Raises ValueError, naming the
    first problem, when the document is not a verdict."""
    problems = verdict_problems(doc)
    if problems:
        raise ValueError(f"not a verdict ({problems[0]})")
    if doc["verdict"] == "accepted":
        return Verdict.accept(validator, doc.get("arguments"))
    errors = ({k: e[k] for k in ("path", "message", "kind") if k in e} for e in doc["errors"])
    return Verdict.reject(validator, errors, retryable=doc["retryable"])


def pointer(path: Iterable[str | int]) -> str:
    """A JSON Pointer (RFC 6901) for a path of keys and indices; "" is the whole document."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


# ---- the built-in validator ---------------------------------------------------------------


class JsonSchemaValidator:
    """Draft 2020-12 check of the arguments against the declared parameters.

    * An undeclared tool (`schema is None`) is rejected (`kind: unknown_tool`).
    * A tool declared `strict: true` additionally rejects unknown fields anywhere: see
      `strict_schema` (callgate.strict_tools, the rule the grammar is built from too).
    * `format` is an annotation, as Draft 2020-12 specifies by default.
    * `$ref`s resolve only within the schema, the JSON Schema metaschemas and `registry`;
      nothing is ever fetched over the network. An unresolvable `$ref` or a schema that is
      not a schema rejects the call as not retryable (the model cannot fix it).
    Accepted verdicts carry the arguments unchanged (this validator normalises nothing).
    """

    name = "builtin-jsonschema"
    cache_size = 256  # prepared schemas kept (checking a schema against the metaschema costs ms)

    def __init__(self, registry: referencing.Registry[Any] | None = None) -> None:
        self._registry: referencing.Registry[Any] = registry if registry is not None else referencing.Registry()
        self._prepared: OrderedDict[str, Draft202012Validator | SchemaError] = OrderedDict()

    async def validate(self, req: Envelope) -> Verdict:
        if req.schema is None:
            error = {"path": "", "message": f"tool {req.tool!r} is not declared in the request", "kind": "unknown_tool"}
            return Verdict.reject(self.name, [error], retryable=True)
        try:
            errors = self.errors(req.schema, req.arguments, strict=req.strict)
        except (SchemaError, Unresolvable) as exc:
            error = {"path": "", "message": f"the tool's schema cannot be used: {_first_line(exc)}", "kind": "schema"}
            return Verdict.reject(self.name, [error], retryable=False)
        if errors:
            return Verdict.reject(self.name, errors, retryable=True)
        return Verdict.accept(self.name, req.arguments)

    def errors(self, schema: Mapping[str, Any] | bool, instance: Any, *, strict: bool = False) -> list[dict[str, str]]:
        """`{path, message, kind}` for each top-level failure, most relevant first.
        Raises SchemaError for an invalid schema and a referencing error for a bad `$ref`."""
        checker = self._checker(schema, strict)
        found: list[ValidationError] = sorted(checker.iter_errors(instance), key=relevance)
        return [{"path": pointer(e.absolute_path), "message": e.message, "kind": str(e.validator)} for e in found]

    def _checker(self, schema: Mapping[str, Any] | bool, strict: bool) -> Draft202012Validator:
        """The prepared validator of `schema` (strict or not), from a small LRU by canonical JSON."""
        key = ("strict:" if strict else "plain:") + json.dumps(schema, sort_keys=True, separators=(",", ":"))
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare(strict_schema(schema) if strict else schema)
            self._prepared[key] = prepared
            if len(self._prepared) > self.cache_size:
                self._prepared.popitem(last=False)
        else:
            self._prepared.move_to_end(key)
        if isinstance(prepared, SchemaError):
            raise prepared
        return prepared

    def _prepare(self, schema: Mapping[str, Any] | bool) -> Draft202012Validator | SchemaError:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            return exc
        return Draft202012Validator(schema, registry=self._registry)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def __getattr__(name: str) -> Any:
    """`HttpValidator` is part of this seam but lives in `validation_http` (which imports
    this module), so it is loaded on first use."""
    if name == "HttpValidator":
        from callgate.serving.handoff.validation_http import HttpValidator

        return HttpValidator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
