"""One error hierarchy for the three APIs, rendered in each API's own shape and status.

Decoders raise these for every malformed input; the HTTP layer turns any `ApiError` into
`anthropic_error_body` / `openai_error_body` with `status_for(api)`, so a client never sees a 500 or a
traceback for something it sent. `param` is a JSON path into the request (`messages[2].content[0]`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

ApiKind = Literal["anthropic", "openai"]


class ApiError(Exception):
    """Base of every error a client may see. Subclasses fix the status and the type names."""

    status: ClassVar[int] = 500
    anthropic_status: ClassVar[int | None] = None  # when it differs from `status` (overloaded: 529)
    anthropic_type: ClassVar[str] = "api_error"
    openai_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def status_for(self, api: ApiKind) -> int:
        if api == "anthropic" and self.anthropic_status is not None:
            return self.anthropic_status
        return self.status

    def anthropic_body(self, request_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": self.anthropic_type, "message": self.anthropic_message()},
        }
        if request_id is not None:
            body["request_id"] = request_id
        return body

    def anthropic_message(self) -> str:
        # Anthropic's messages name the offending field as a prefix ("messages.0.content: ...").
        if self.param:
            return f"{self.param}: {self.message}"
        return self.message

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r}, code={self.code!r})"


class InvalidRequestError(ApiError):
    status = 400
    anthropic_type = "invalid_request_error"
    openai_type = "invalid_request_error"


class ContextLengthError(InvalidRequestError):
    """The prompt (plus max tokens) does not fit the model's context window.

    Claude Code compacts on messages saying "prompt is too long"; Codex and OpenAI clients key on the
    `context_length_exceeded` code (also used for Responses' `response.failed`).
    """

    default_code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, limit: int, *, param: str | None = None) -> None:
        super().__init__(
            f"prompt is too long: {prompt_tokens} tokens > {limit} maximum",
            param=param,
        )
        self.prompt_tokens = prompt_tokens
        self.limit = limit

    def anthropic_message(self) -> str:
        return self.message  # keep the phrase Claude Code matches at the start


class AuthenticationError(ApiError):
    status = 401
    anthropic_type = "authentication_error"
    openai_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(ApiError):
    status = 403
    anthropic_type = "permission_error"
    openai_type = "invalid_request_error"


class NotFoundError(ApiError):
    status = 404
    anthropic_type = "not_found_error"
    openai_type = "invalid_request_error"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"

    def __init__(self, model: str, *, param: str | None = "model") -> None:
        super().__init__(f"The model '{model}' does not exist", param=param)
        self.model = model


class RequestTooLargeError(ApiError):
    status = 413
    anthropic_type = "request_too_large"
    openai_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimitError(ApiError):
    status = 429
    anthropic_type = "rate_limit_error"
    openai_type = "requests"
    default_code = "rate_limit_exceeded"


class InternalError(ApiError):
    status = 500
    anthropic_type = "api_error"
    openai_type = "server_error"


class OverloadedError(ApiError):
    """No capacity now; clients retry with backoff (Anthropic uses 529 for this, OpenAI 503)."""

    status = 503
    anthropic_status = 529
    anthropic_type = "overloaded_error"
    openai_type = "server_error"
    default_code = "overloaded"


class GatewayTimeoutError(ApiError):
    status = 504
    anthropic_type = "timeout_error"
    openai_type = "server_error"
    default_code = "timeout"


__all__ = [
    "ApiError",
    "ApiKind",
    "AuthenticationError",
    "ContextLengthError",
    "GatewayTimeoutError",
    "InternalError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "NotFoundError",
    "OverloadedError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
]
