"""What a validator exchanges for one tool-call candidate: the envelope it receives
(`ValidationRequest`, any `Envelope`, serialised by `envelope_dict`), the verdict it answers
(`Verdict`), the published JSON Schemas of both (`ENVELOPE_SCHEMA`, `VERDICT_SCHEMA`;
`schemas/*.schema.json` are copies a test keeps equal) and how a verdict document from
elsewhere is read (`parse_verdict`).
Does not know: how a verdict is reached (validation.py, validation_http.py), HTTP, the chat flow.

Errors in a verdict are `{path, message, kind}`: `path` is a JSON Pointer (RFC 6901) into the
arguments, `kind` a short label (the failing JSON Schema keyword, or `unknown_tool`) used for
metrics; a downstream validator may omit `kind`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from jsonschema import Draft202012Validator

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
