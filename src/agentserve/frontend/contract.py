"""The published contract: how `/openapi.json` documents each route (bodies from `api.schema`'s
models, SSE events, each API's errors per status, links), and the document itself.

The routes read raw bytes and the codecs decode them (faster than model validation, and the
decoders' 400s name each API's fields its own way); this module only describes them.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from agentserve.api import schema as S
from agentserve.config import ApiName

STATUS_TEXT = {
    400: "invalid request: a wrong type, a missing field, a value out of range (the field is named)",
    401: "missing or invalid API key (when keys are configured)",
    404: "unknown model (with accept_any_model off), or no such response / endpoint",
    405: "method not allowed on this path",
    413: "request body larger than max_body_bytes",
    500: "our bug: logged with its traceback, answered with the request id",
    503: "overloaded: no worker can take the request now (retry-after: 1)",
    529: "overloaded (Anthropic's status for it; retry-after: 1)",
}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": S.ref(model)}}}}


def errors(error: dict[str, Any], statuses: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    return {
        status: {"description": STATUS_TEXT[status], "content": {"application/json": {"schema": error}}}
        for status in statuses
    }


def ok(
    model: type[BaseModel],
    description: str,
    events: tuple[type[BaseModel], ...] = (),
    done: str | None = None,
) -> dict[str, Any]:
    """A 200 in `model`'s shape; with `events`, also `text/event-stream` whose schema is one event
    (as OpenAPI 3.2's itemSchema, and as schemathesis reads it): `event:` and `data:` fields, the
    data a JSON object of one of `events` — or the literal `done` (Chat's `[DONE]`)."""
    content: dict[str, Any] = {"application/json": {"schema": S.ref(model)}}
    if events:
        refs = [S.ref(e) for e in events]
        data: dict[str, Any] = {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": refs[0] if len(refs) == 1 else {"anyOf": refs},
        }
        if done is not None:
            data = {"anyOf": [{"const": done}, data]}
        content["text/event-stream"] = {
            "schema": {
                "type": "object",
                "description": inspect.cleandoc(events[0].__doc__ or ""),
                "properties": {
                    "event": {"type": "string"},
                    "data": data,
                    "id": {"type": "string"},
                    "retry": {"type": "integer"},
                },
            }
        }
    return {"description": description, "content": content}


ANTHROPIC_ERROR = S.ref(S.AnthropicError)
OPENAI_ERROR = S.ref(S.OpenAIError)
_Events = tuple[type[BaseModel], ...]
GENERATE: dict[ApiName, tuple[type[BaseModel], type[BaseModel], _Events, dict[str, str], int]] = {
    "anthropic": (
        S.AnthropicMessagesRequest,
        S.AnthropicMessage,
        (S.AnthropicStreamEvent,),
        ANTHROPIC_ERROR,
        529,
    ),
    # Chat: chunks (and `tool_call_dispatch` events, chunk-shaped), an error chunk after a failure
    "chat": (
        S.ChatCompletionRequest,
        S.ChatCompletion,
        (S.ChatCompletionChunk, S.OpenAIError),
        OPENAI_ERROR,
        503,
    ),
    "responses": (S.ResponsesRequest, S.ResponseObject, (S.ResponsesStreamEvent,), OPENAI_ERROR, 503),
}


def generate_spec(api: ApiName) -> dict[str, Any]:
    request, response, events, error, overloaded = GENERATE[api]
    responses: dict[int | str, dict[str, Any]] = {
        200: ok(
            response,
            "the answer; server-sent events when `stream` is true (they end with the API's "
            "terminal event, after a failure with its error event)",
            events,
            "[DONE]" if api == "chat" else None,
        ),
        **errors(error, (400, 401, 404, 413, 500, overloaded)),
    }
    if api == "responses":
        responses[200]["links"] = RESPONSE_LINKS
    return {"openapi_extra": request_body(request), "responses": responses}


# A stored Response leads on: fetch it, delete it, or continue the conversation from it.
RESPONSE_ID = "$response.body#/id"
RESPONSE_LINKS = {
    "GetResponse": {"operationId": "getResponse", "parameters": {"response_id": RESPONSE_ID}},
    "DeleteResponse": {"operationId": "deleteResponse", "parameters": {"response_id": RESPONSE_ID}},
    "ContinueResponse": {
        "operationId": "createResponse",
        "requestBody": {
            "model": "$request.body#/model",
            "previous_response_id": RESPONSE_ID,
            "input": "go on",
        },
        "description": "the next turn, from the stored response (`previous_response_id`)",
    },
}


def published(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with our components, and without the 422 it assumes for parameters
    (validation errors are the API's 400 here)."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for path_item in doc.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None and "400" not in responses:
                responses["400"] = {
                    "description": STATUS_TEXT[400],
                    "content": {"application/json": {"schema": OPENAI_ERROR}},
                }
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas.update(S.component_schemas())
    return doc


def cached_openapi(app: FastAPI) -> dict[str, Any]:
    app.openapi_schema = published(app)
    return app.openapi_schema
