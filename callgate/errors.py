"""Typed errors. Each class carries its HTTP status and OpenAI error type.

Bad *model output* is never an exception (it is a Diagnostic in a ParseResult);
these classes are for bad *requests* and for failures at the wire.

Whether a retry can help is a property of the class too (`retryable`), and `headers()`
turns it into what clients read: `x-should-retry: false` where a retry cannot fix the error
(the official OpenAI and Anthropic SDKs would otherwise retry 5xx, 408, 409 and 429 by
themselves: a 502 `model_output_error` three times over for a greedy request that fails the
same way each time), `x-should-retry: true` plus `Retry-After` (seconds) where waiting does
help. `retryable = None` leaves the decision to the client's defaults (an unexpected 500).
"""

from __future__ import annotations


class CallgateError(Exception):
    """Base class. `status` and `error_type` map the error onto the wire; `retryable` says
    whether the same request sent again can succeed (None: unknown); `retry_after_s`, set on
    retryable errors, is how long to wait first (the official clients wait that long)."""

    status: int = 500
    error_type: str = "internal_error"
    retryable: bool | None = None
    retry_after_s: int | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_body(self) -> dict[str, object]:
        """OpenAI error body: {"error": {message, type, param, code}}."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        """The response headers that tell a client whether and when to retry."""
        if self.retryable is None:
            return {}
        if not self.retryable:
            return {"x-should-retry": "false"}
        out = {"x-should-retry": "true"}
        if self.retry_after_s is not None:
            out["Retry-After"] = str(self.retry_after_s)
        return out

    @classmethod
    def for_status(cls, status: int, message: str, *, error_type: str = "invalid_request_error") -> CallgateError:
        """An error for a status the framework chose (an unknown route's 404, a 405): a 4xx
        is final unless it is one a client is meant to retry (408, 409, 429)."""
        err = cls(message)
        err.status, err.error_type = status, error_type
        if 400 <= status < 500:
            err.retryable = status in (408, 409, 429)
        return err


class InvalidRequestError(CallgateError):
    status = 400
    error_type = "invalid_request_error"
    retryable = False


class TemplateError(InvalidRequestError):
    """Input the format cannot represent; the message names the message index and field."""


class SchemaTooComplexError(InvalidRequestError):
    """A grammar could not be compiled in time, or uses an unsupported keyword."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "schema_too_complex") -> None:
        super().__init__(message, param=param, code=code)


class PayloadTooLargeError(InvalidRequestError):
    status = 413


class AuthenticationError(CallgateError):
    status = 401
    error_type = "authentication_error"
    retryable = False


class NotFoundError(CallgateError):
    status = 404
    error_type = "invalid_request_error"
    retryable = False


class RateLimitError(CallgateError):
    status = 429
    error_type = "rate_limit_error"
    retryable = True
    retry_after_s = 1


class ModelOutputError(CallgateError):
    """The model's output held a call block that could not be parsed. Not retryable: with
    constrained decoding it means `max_tokens` was too small for a whole call, and a greedy
    request writes the same output again."""

    status = 502
    error_type = "model_output_error"
    retryable = False


class ToolCallRejectedError(CallgateError):
    """The validator still rejected the calls after the repair rounds: the same request
    meets the same validator again."""

    status = 422
    error_type = "tool_call_rejected"
    retryable = False


class ValidatorUnavailableError(CallgateError):
    """No verdict could be had (down, too slow, a malformed answer): fail closed, retry later."""

    status = 503
    error_type = "validator_unavailable"
    retryable = True
    retry_after_s = 1


class CompilerBusyError(CallgateError):
    """Every grammar compile worker stayed busy past the time limit: retry later (what an
    OpenAI client does by itself for a 503; `server_error` is OpenAI's type for overload)."""

    status = 503
    error_type = "server_error"
    retryable = True
    retry_after_s = 1


class ShuttingDownError(CallgateError):
    """The server is stopping: another replica (or this one, restarted) can answer."""

    status = 503
    error_type = "server_error"
    retryable = True
    retry_after_s = 1

    def __init__(self, message: str = "the server is shutting down; retry on another replica") -> None:
        super().__init__(message, code="server_shutting_down")


class EngineError(CallgateError):
    status = 500
    error_type = "server_error"
