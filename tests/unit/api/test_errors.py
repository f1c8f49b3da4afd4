from __future__ import annotations

import anthropic
import openai
import pytest
from anthropic.types.shared import ErrorResponse

from agentserve.api.errors import (
    ApiError,
    AuthenticationError,
    ContextLengthError,
    GatewayTimeoutError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
)

from .helpers import Recorder, anthropic_client, openai_client

A, OA = anthropic, openai
CASES: list[tuple[ApiError, int, str, int, type[Exception], type[Exception]]] = [
    (InvalidRequestError("bad", param="messages"), 400, "invalid_request_error", 400,
     A.BadRequestError, OA.BadRequestError),
    (ContextLengthError(200_000, 131_072), 400, "invalid_request_error", 400,
     A.BadRequestError, OA.BadRequestError),
    (AuthenticationError("no key"), 401, "authentication_error", 401,
     A.AuthenticationError, OA.AuthenticationError),
    (PermissionDeniedError("no"), 403, "permission_error", 403,
     A.PermissionDeniedError, OA.PermissionDeniedError),
    (NotFoundError("nothing here"), 404, "not_found_error", 404, A.NotFoundError, OA.NotFoundError),
    (RequestTooLargeError("too big"), 413, "request_too_large", 413, A.APIStatusError, OA.APIStatusError),
    (RateLimitError("slow down"), 429, "rate_limit_error", 429, A.RateLimitError, OA.RateLimitError),
    (InternalError("oops"), 500, "api_error", 500, A.InternalServerError, OA.InternalServerError),
    (OverloadedError("busy"), 529, "overloaded_error", 503, A.InternalServerError, OA.InternalServerError),
    (GatewayTimeoutError("slow"), 504, "timeout_error", 504, A.InternalServerError, OA.InternalServerError),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_shapes_statuses_and_sdk_exceptions(
    case: tuple[ApiError, int, str, int, type[Exception], type[Exception]],
) -> None:
    error, a_status, a_type, o_status, a_exc, o_exc = case
    assert error.status_for("anthropic") == a_status and error.status_for("openai") == o_status
    body = error.anthropic_body(request_id="req_1")
    if a_type != "request_too_large":  # in Anthropic's documented error table, not in the SDK's union
        ErrorResponse.model_validate(body)
    assert body["error"]["type"] == a_type and body["request_id"] == "req_1"
    client = anthropic_client(Recorder(body, status=a_status))
    with pytest.raises(a_exc) as got:
        client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert got.value.body["error"]["type"] == a_type  # type: ignore[attr-defined]

    oai = error.openai_body()
    assert set(oai["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(o_exc) as got_o:
        openai_client(Recorder(oai, status=o_status)).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert got_o.value.body == oai["error"]  # type: ignore[attr-defined]


def test_context_length_speaks_each_clients_language() -> None:
    error = ContextLengthError(200_000, 131_072, param="messages")
    # Claude Code compacts on "prompt is too long"; the Anthropic message must start with it.
    assert error.anthropic_body()["error"]["message"].startswith("prompt is too long: 200000 tokens > 131072")
    assert error.openai_body()["error"]["code"] == "context_length_exceeded"
    assert error.openai_body()["error"]["param"] == "messages"


def test_anthropic_message_names_the_field_openai_has_param() -> None:
    error = InvalidRequestError("field required", param="messages[0].content")
    assert error.anthropic_body()["error"]["message"] == "messages[0].content: field required"
    assert error.openai_body()["error"]["message"] == "field required"
    assert "param='messages[0].content'" in repr(error)


def test_codes() -> None:
    assert ModelNotFoundError("x").code == "model_not_found"
    assert InvalidRequestError("x", code="custom").code == "custom"
    assert OverloadedError("x").openai_body()["error"]["type"] == "server_error"
