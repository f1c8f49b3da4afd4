"""The HTTP frontend: the three agent APIs, model discovery, health and metrics (FastAPI).

Routes are thin: each reads the body (size-limited), checks the API key, decodes with the API's
codec and hands over to `service.Frontend`. Every error a client can cause is answered in the
API's own shape and status (`http.error_response`); anything unexpected is logged with its
traceback here and answered as the API's 500 (`api_error` / `server_error`) with the request id.
`/openapi.json` documents every body from `api.schema`'s models (the codecs, not the models,
validate requests: 400 in the API's shape, never FastAPI's 422).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentserve import __version__
from agentserve.api import schema as S
from agentserve.api.catalog import anthropic_model, anthropic_models, codex_catalog, find_model, openai_model
from agentserve.api.catalog import openai_models as openai_model_list
from agentserve.api.errors import (
    ApiError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    RequestTooLargeError,
)
from agentserve.api.signing import Signer
from agentserve.config import ApiName, FrontendConfig
from agentserve.drain import DrainState
from agentserve.frontend.backend import Backend
from agentserve.frontend.contract import (
    ANTHROPIC_ERROR,
    OPENAI_ERROR,
    cached_openapi,
    errors,
    generate_spec,
    ok,
    request_body,
)
from agentserve.frontend.http import (
    RAW_SEND,
    ApiKeys,
    ChunkWriter,
    DeferredResponse,
    EventStreamResponse,
    error_kind_for,
    error_response,
    id_headers,
    json_response,
    new_request_id,
    read_body,
)
from agentserve.frontend.service import Frontend, Refused
from agentserve.frontend.surfaces import SURFACES, AnthropicSurface, last_resort_frames
from agentserve.prompt.pipeline import PromptPipeline
from agentserve.telemetry import Telemetry, accepted_body

log = logging.getLogger("agentserve.frontend")


def _generate_route(frontend: Frontend, api: ApiName) -> Any:
    surface = SURFACES[api]
    config = frontend.config

    async def route(request: Request) -> Response:
        request_id = new_request_id()
        outcome = await frontend.handle(
            surface, request.headers, lambda: read_body(request, config.max_body_bytes), request_id
        )
        if isinstance(outcome, Refused):
            if outcome.frames is not None:
                return _one_shot_stream(outcome.frames, request_id)
            error = outcome.error
            return error_response(
                error, surface.error_kind, request_id, close=isinstance(error, RequestTooLargeError)
            )
        prepared, gen = outcome.prepared, outcome.generation
        out_headers = id_headers(request_id)
        if prepared.request.options.stream:
            # The prepared request: what the frontend did to it (context edits) is reported.
            writer = surface.writer(prepared.request, frontend.ctx, prepared.request.options.model)
            return EventStreamResponse(
                lambda write: frontend.stream(prepared, gen, writer, write),
                headers=out_headers,
                ping=writer.ping,
                ping_interval=config.ping_interval_s,
                on_disconnect=gen.aclose,
                on_error=lambda: last_resort_frames(
                    api, InternalError(f"internal error (request {request_id})")
                ),
            )

        async def produce() -> Response:
            try:
                body = await frontend.complete(prepared, gen)
            except ApiError as error:
                return error_response(error, surface.error_kind, request_id)
            except Exception:
                log.exception("%s: %s request failed", request_id, api)
                return error_response(
                    InternalError(f"internal error (request {request_id})"), surface.error_kind, request_id
                )
            return json_response(body, headers=out_headers)

        return DeferredResponse(produce, gen.aclose)

    return route


def _one_shot_stream(frames: bytes, request_id: str) -> Response:
    async def produce(write: ChunkWriter) -> bytes:
        return frames  # sent with the end of the body

    async def nothing() -> None:
        return None

    return EventStreamResponse(
        produce, headers=id_headers(request_id), ping=lambda: b"", ping_interval=0, on_disconnect=nothing
    )


class _FrontendApp(FastAPI):
    """The FastAPI app, plus the server's own `send` in the scope (`http.RAW_SEND`) for the event
    streams' body frames, and a fast path for the generate POSTs.

    The generate routes take a `Request` and answer every error themselves (in the API's shape), so
    they need none of the framework's layers: FastAPI's middleware stack, exception wrappers and
    router were ~17 % of the frontend's CPU per request under bench/peers.py. POSTs to those exact
    paths go straight to the route; everything else (other methods, paths, query-less variants
    alike) takes the framework's way, so 404/405 and the OpenAPI document are unchanged.
    """

    hot_routes: dict[str, Callable[[Request], Awaitable[Response]]]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.hot_routes.get(scope["path"])
            if route is not None:
                scope["app"] = self
                response = await route(Request(scope, receive))
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    config: FrontendConfig,
    backend: Backend,
    *,
    pipeline: PromptPipeline | None = None,
    signer: Signer | None = None,
    keys: ApiKeys | None = None,
    telemetry: Telemetry | None = None,
) -> FastAPI:
    """The frontend app over `backend` (started and stopped with the app's lifespan)."""
    pipeline = pipeline or PromptPipeline.from_config(config)
    frontend = Frontend(
        config, backend, pipeline, signer=signer or Signer.random(), telemetry=telemetry, keys=keys
    )
    keys = frontend.keys

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        endpoint = frontend.telemetry.start()  # the harness tool-event socket, when configured
        if endpoint is not None:
            log.info("harness tool events on %s", endpoint)
        await backend.start()
        try:
            yield
        finally:
            await frontend.cancel_retention_updates()  # hints in flight: nothing waits for them
            await backend.stop()
            await frontend.state.close()
            frontend.telemetry.close()

    app = _FrontendApp(
        title="agentserve",
        version=__version__,
        description="Anthropic Messages, OpenAI Chat Completions and Responses over self-hosted models.",
        lifespan=lifespan,
    )
    app.openapi = lambda: app.openapi_schema or cached_openapi(app)  # type: ignore[method-assign]
    app.state.frontend = frontend
    app.state.drain = drain = DrainState()
    app.state.betas = frontend.betas

    def kind(request: Request) -> str:
        return error_kind_for(request.url.path, request.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        rid = new_request_id()
        error: ApiError
        if exc.status_code == 404:
            error = NotFoundError(f"{request.method} {request.url.path} is not an endpoint of this server")
        elif exc.status_code == 405:
            error = InvalidRequestError(f"method {request.method} is not allowed on {request.url.path}")
        else:
            error = InvalidRequestError(str(exc.detail))
        response = error_response(error, kind(request), rid)  # type: ignore[arg-type]
        if exc.status_code == 405:
            response.status_code = 405
        return response

    async def validation_error(request: Request, exc: Exception) -> Response:
        return error_response(InvalidRequestError(str(exc)), kind(request), new_request_id())  # type: ignore[arg-type]

    async def internal_error(request: Request, exc: Exception) -> Response:
        rid = new_request_id()
        log.error("%s: unhandled error on %s %s", rid, request.method, request.url.path, exc_info=exc)
        return error_response(InternalError(f"internal error (request {rid})"), kind(request), rid)  # type: ignore[arg-type]

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)

    # -- the agent APIs ----------------------------------------------------------------------------

    enabled = set(config.apis)
    summaries: dict[ApiName, tuple[str, str, str]] = {
        "anthropic": ("/v1/messages", "Anthropic Messages: create a message", "createMessage"),
        "chat": ("/v1/chat/completions", "OpenAI Chat Completions", "createChatCompletion"),
        "responses": ("/v1/responses", "OpenAI Responses", "createResponse"),
    }
    app.hot_routes = {}
    for api, (path, summary, operation_id) in summaries.items():
        if api in enabled:
            app.hot_routes[path] = _generate_route(frontend, api)
            app.add_api_route(
                path,
                app.hot_routes[path],
                methods=["POST"],
                summary=summary,
                tags=[api],
                operation_id=operation_id,
                **generate_spec(api),
            )

    if "responses" in enabled:

        @app.get(
            "/v1/responses/{response_id}",
            summary="OpenAI Responses: retrieve a stored response",
            operation_id="getResponse",
            tags=["responses"],
            responses={
                200: ok(S.ResponseObject, "the stored Response"),
                **errors(OPENAI_ERROR, (401, 404)),
            },
        )
        async def get_response(request: Request, response_id: str) -> Response:
            rid = new_request_id()
            try:
                scope = keys.check(request.headers)
                body = await frontend.state.response_body(scope or "", response_id)
                if body is None:
                    raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
            except ApiError as error:
                return error_response(error, "openai", rid)
            return json_response(body, headers=id_headers(rid))

        @app.delete(
            "/v1/responses/{response_id}",
            summary="OpenAI Responses: delete a stored response",
            operation_id="deleteResponse",
            tags=["responses"],
            responses={200: ok(S.ResponseDeleted, "deleted"), **errors(OPENAI_ERROR, (401, 404))},
        )
        async def delete_response(request: Request, response_id: str) -> Response:
            rid = new_request_id()
            try:
                scope = keys.check(request.headers)
                if not await frontend.state.delete_response(scope or "", response_id):
                    raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
            except ApiError as error:
                return error_response(error, "openai", rid)
            body = {"id": response_id, "object": "response.deleted", "deleted": True}
            return json_response(body, headers=id_headers(rid))

    if "anthropic" in enabled:
        anthropic_surface = SURFACES["anthropic"]
        assert isinstance(anthropic_surface, AnthropicSurface)

        @app.post(
            "/v1/messages/count_tokens",
            summary="Anthropic: count input tokens",
            operation_id="countTokens",
            tags=["anthropic"],
            openapi_extra=request_body(S.AnthropicCountTokensRequest),
            responses={
                200: ok(
                    S.AnthropicCountTokensResponse, "exact: the real request's decode, render and tokenizer"
                ),
                **errors(ANTHROPIC_ERROR, (400, 401, 404, 413, 500)),
            },
        )
        async def count_tokens(request: Request) -> Response:
            rid = new_request_id()
            try:
                counted = await frontend.count_tokens(
                    anthropic_surface, request.headers, lambda: read_body(request, config.max_body_bytes)
                )
            except ApiError as error:
                return error_response(error, "anthropic", rid, close=isinstance(error, RequestTooLargeError))
            except Exception:
                log.exception("%s: count_tokens failed", rid)
                return error_response(InternalError(f"internal error (request {rid})"), "anthropic", rid)
            return json_response(counted, headers=id_headers(rid))

    # -- model discovery ---------------------------------------------------------------------------

    def wants_anthropic(request: Request) -> bool:
        return "anthropic-version" in request.headers

    @app.get(
        "/v1/models",
        summary="List models (Anthropic shape with anthropic-version, else OpenAI + Codex)",
        operation_id="listModels",
        tags=["models"],
        responses={
            200: {
                "description": "Anthropic's list with anthropic-version, else OpenAI's (+ Codex's models)",
                "content": {
                    "application/json": {
                        "schema": {"anyOf": [S.ref(S.AnthropicModelList), S.ref(S.OpenAIModelList)]}
                    }
                },
            },
            **errors({"anyOf": [ANTHROPIC_ERROR, OPENAI_ERROR]}, (400, 401)),
        },
    )
    async def list_models(
        request: Request, limit: str | None = None, after_id: str | None = None, before_id: str | None = None
    ) -> Response:
        rid = new_request_id()
        shape = "anthropic" if wants_anthropic(request) else "openai"
        try:
            keys.check(request.headers)
            if shape == "anthropic":
                body = anthropic_models(
                    frontend.models, limit=_limit(limit), after_id=after_id, before_id=before_id
                )
            else:
                body = openai_model_list(frontend.models, codex=config.codex_catalog)
        except ApiError as error:
            return error_response(error, shape, rid)  # type: ignore[arg-type]
        return json_response(body, headers=id_headers(rid))

    @app.get(
        "/v1/models/{model_id:path}",
        summary="One model (Anthropic or OpenAI shape)",
        operation_id="getModel",
        tags=["models"],
        responses={
            200: {
                "description": "Anthropic's shape when `anthropic-version` is sent, else OpenAI's",
                "content": {
                    "application/json": {"schema": {"anyOf": [S.ref(S.AnthropicModel), S.ref(S.OpenAIModel)]}}
                },
            },
            **errors({"anyOf": [ANTHROPIC_ERROR, OPENAI_ERROR]}, (401, 404)),
        },
    )
    async def get_model(request: Request, model_id: str) -> Response:
        rid = new_request_id()
        shape = "anthropic" if wants_anthropic(request) else "openai"
        try:
            keys.check(request.headers)
            facts = find_model(frontend.models, model_id)
        except ApiError as error:
            return error_response(error, shape, rid)  # type: ignore[arg-type]
        body = anthropic_model(facts, model_id) if shape == "anthropic" else openai_model(facts, model_id)
        return json_response(body, headers=id_headers(rid))

    if config.codex_catalog:

        @app.get(
            "/backend-api/codex/models",
            summary="Codex model catalog ({models: [ModelInfo]})",
            operation_id="listCodexModels",
            tags=["models"],
            responses={200: ok(S.CodexCatalog, "the catalog"), **errors(OPENAI_ERROR, (401,))},
        )
        async def codex_models(request: Request) -> Response:
            rid = new_request_id()
            try:
                keys.check(request.headers)
            except ApiError as error:
                return error_response(error, "openai", rid)
            return json_response(codex_catalog(frontend.models), headers=id_headers(rid))

    # -- operations --------------------------------------------------------------------------------

    def identity() -> Response:
        models = [m.id for m in frontend.models]
        return json_response({"name": "agentserve", "version": __version__, "models": models})

    identity_doc: dict[int | str, dict[str, Any]] = {
        200: ok(S.ServiceIdentity, "name, version and the served models")
    }

    @app.get("/", summary="Service identity", tags=["ops"], responses=identity_doc)
    async def root() -> Response:
        return identity()

    @app.head(
        "/",
        summary="Connectivity probe (Claude Code sends HEAD / at start)",
        tags=["ops"],
        responses=identity_doc,
    )
    async def root_head() -> Response:
        return identity()

    @app.get("/health", summary="Liveness", tags=["ops"], responses={200: ok(S.Health, "alive")})
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get(
        "/ready",
        summary="Readiness: at least one worker takes requests",
        tags=["ops"],
        responses={
            200: ok(S.Readiness, "ready"),
            503: ok(S.Readiness, "not ready (no worker, or draining)"),
        },
    )
    async def ready() -> Response:
        # The key's fingerprint (never the key): replicas behind one Service must show the same one.
        ready = backend.ready and not drain.draining
        body = {
            "ready": ready,
            "draining": drain.draining,
            **backend.describe(),
            "signing_key": frontend.ctx.signer.fingerprint,
        }
        return json_response(body, 200 if ready else 503)

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        tags=["ops"],
        responses={
            200: {
                "description": "the Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def metrics() -> Response:
        data, content_type = frontend.telemetry.metrics.exposition()
        return Response(data, media_type=content_type)

    @app.post(
        "/v1/agent/tool_events",
        summary="Harness tool events (start/end/error), joined to the request that dispatched the call",
        operation_id="submitToolEvents",
        tags=["telemetry"],
        status_code=202,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "anyOf": [
                                S.ref(S.ToolEvent),
                                {
                                    "type": "array",
                                    "items": S.ref(S.ToolEvent),
                                    "minItems": 1,
                                    "maxItems": 100,
                                },
                            ]
                        }
                    }
                },
            }
        },
        responses={
            202: ok(S.ToolEventsAccepted, "how many events were accepted and joined a request"),
            **errors(OPENAI_ERROR, (400, 401, 413)),
        },
    )
    async def tool_events(request: Request) -> Response:
        rid = new_request_id()
        try:
            keys.check(request.headers)
            records = frontend.telemetry.submit_tool_events(await read_body(request, config.max_body_bytes))
        except ApiError as error:  # ToolEventError is an InvalidRequestError
            return error_response(error, "openai", rid, close=isinstance(error, RequestTooLargeError))
        return json_response(accepted_body(records), 202, id_headers(rid))

    return app


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError("must be an integer", param="limit") from None


def frontend_of(app: FastAPI) -> Frontend:
    frontend: Frontend = app.state.frontend
    return frontend


__all__ = ["create_app", "frontend_of"]
