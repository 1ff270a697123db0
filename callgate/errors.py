"""Typed errors. Each class carries its HTTP status and OpenAI error type.

Bad *model output* is never an exception (it is a Diagnostic in a ParseResult);
these classes are for bad *requests* and for failures at the wire.
"""

from __future__ import annotations


class CallgateError(Exception):
    """Base class. `status` and `error_type` map the error onto the wire; `retry_after_s`,
    where set, is sent as a Retry-After header (the official clients wait that long)."""

    status: int = 500
    error_type: str = "internal_error"
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


class InvalidRequestError(CallgateError):
    status = 400
    error_type = "invalid_request_error"


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


class NotFoundError(CallgateError):
    status = 404
    error_type = "invalid_request_error"


class RateLimitError(CallgateError):
    status = 429
    error_type = "rate_limit_error"
    retry_after_s = 1


class ModelOutputError(CallgateError):
    """The model's output held a call block that could not be parsed."""

    status = 502
    error_type = "model_output_error"


class ToolCallRejectedError(CallgateError):
    status = 422
    error_type = "tool_call_rejected"


class ValidatorUnavailableError(CallgateError):
    status = 503
    error_type = "validator_unavailable"


class CompilerBusyError(CallgateError):
    """Every grammar compile worker stayed busy past the time limit: retry later (what an
    OpenAI client does by itself for a 503; `server_error` is OpenAI's type for overload)."""

    status = 503
    error_type = "server_error"
    retry_after_s = 1


class EngineError(CallgateError):
    status = 500
    error_type = "server_error"
