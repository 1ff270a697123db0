"""The validator seam: the `Validator` role and the built-in check, with the envelope and
verdict (envelope.py) and the HTTP validator (validation_http.py) re-exported, so one import
names every piece.

Knows: the built-in `JsonSchemaValidator`: a strict Draft 2020-12 check of the arguments
against the tool's declared `parameters`.
Does not know: HTTP (see `validation_http`), the chat flow, repair rounds or the audit log.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import referencing
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, relevance
from referencing.exceptions import Unresolvable

from callgate.serving.handoff.envelope import ENVELOPE_SCHEMA as ENVELOPE_SCHEMA
from callgate.serving.handoff.envelope import VERDICT_SCHEMA as VERDICT_SCHEMA
from callgate.serving.handoff.envelope import Envelope as Envelope
from callgate.serving.handoff.envelope import ValidationRequest as ValidationRequest
from callgate.serving.handoff.envelope import Verdict as Verdict
from callgate.serving.handoff.envelope import VerdictName as VerdictName
from callgate.serving.handoff.envelope import envelope_dict as envelope_dict
from callgate.serving.handoff.envelope import parse_verdict as parse_verdict
from callgate.serving.handoff.envelope import pointer as pointer
from callgate.serving.handoff.envelope import verdict_dict as verdict_dict
from callgate.serving.handoff.envelope import verdict_problems as verdict_problems
from callgate.serving.handoff.idempotency import idempotency_key as idempotency_key
from callgate.serving.handoff.validation_http import HttpValidator as HttpValidator
from callgate.strict_tools import strict_schema as strict_schema


class Validator(Protocol):
    """A verdict per candidate. Raises ValidatorUnavailableError (503) when none can be had."""

    name: str

    async def validate(self, req: Envelope) -> Verdict: ...


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
