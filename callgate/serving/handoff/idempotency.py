"""The identity of one tool-call action, the same when a client retries the request and new
when it asks again in a later turn: `idempotency_key(actor, tool, arguments, scope)`.

Knows: who asks (`actor`: the surface's own field — chat completions' `user`, which the other
surfaces map into `ChatRequest.actor` too — or the `x-callgate-actor` header a trusted gateway
sets, honoured only when the server trusts it; "anonymous" without either), what the action
was asked in reply to (`scope`: sha256 of the canonical conversation before the call) and the
canonical JSON that both are hashed over. Does not know: HTTP beyond the header's name,
validators, the chat flow.

Invariants: equal (actor, tool, arguments, scope) give equal keys whatever the request id, the
call id the model wrote or the order of keys in the arguments; a different actor, tool,
argument value or conversation gives a different key. Two identical calls in one turn share
their key: they are one action.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

ACTOR_HEADER = "x-callgate-actor"
ANONYMOUS = "anonymous"


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, non-ASCII kept as UTF-8: one text per JSON value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def resolve_actor(body_actor: str | None, header_actor: str | None, *, trust_header: bool) -> str:
    """Who asks: the trusted header (only with `trust_header`), else the surface's own field,
    else ANONYMOUS. Empty values count as absent."""
    if trust_header and header_actor:
        return header_actor
    return body_actor or ANONYMOUS


def conversation_scope(messages: Sequence[Mapping[str, Any]]) -> str:
    """sha256 (hex) of the canonical conversation a call answers: the request's messages,
    tool results included, before this turn's output. A retried request repeats it; a later
    turn (which carries this turn's output and its results) does not."""
    return hashlib.sha256(canonical_json([dict(m) for m in messages]).encode()).hexdigest()


def idempotency_key(actor: str, tool: str, arguments: Mapping[str, Any], scope: str) -> str:
    """sha256 (hex) of (actor, tool name, canonical arguments, scope), hashed as one canonical
    JSON array: no two different tuples give the same text."""
    return hashlib.sha256(canonical_json([actor, tool, dict(arguments), scope]).encode()).hexdigest()
