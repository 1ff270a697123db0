"""Errors on the Anthropic surface: `{"type": "error", "error": {"type", "message"}}` with
Anthropic's error types, and the retry headers every error carries.

Knows: Anthropic's error types per status (400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
rate_limit_error, 500 api_error, 503 / 529 overloaded_error; other 4xx invalid_request_error,
other 5xx api_error); callgate's own code and `callgate` block ride along. The retry rule:
an error a retry can fix (429, 503, or one with `retry_after_s`) gets `Retry-After`; one it
cannot (every other 4xx, and 502 model output errors: deterministic for a given request)
gets `x-should-retry: false`, which the official SDKs obey. Does not know: routes or HTTP
frameworks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.errors import CallgateError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_RETRYABLE = frozenset({408, 409, 429, 503, 529})


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(exc: CallgateError, callgate: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Anthropic's error object; callgate's code and `callgate` block, where there are, ride along."""
    error: dict[str, Any] = {"type": error_type(exc.status), "message": exc.message}
    if exc.code is not None:
        error["code"] = exc.code
    body: dict[str, Any] = {"type": "error", "error": error}
    if callgate is not None:
        body["callgate"] = dict(callgate)
    return body


def retry_headers(exc: CallgateError) -> dict[str, str]:
    """`Retry-After` for an error a retry can fix, `x-should-retry: false` for one it cannot;
    none for a 500 (unexpected: the client's own policy decides)."""
    if exc.retry_after_s is not None or exc.status in _RETRYABLE:
        return {"Retry-After": str(exc.retry_after_s or 1)}
    if exc.status < 500 or exc.status == 502:
        return {"x-should-retry": "false"}
    return {}
