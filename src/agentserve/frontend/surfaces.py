"""The three API surfaces behind one shape: decode a body, encode a stream, build a response.

Each `Surface` adapts one API codec (`agentserve.api.*`) to the request path in `service.py`; each
`StreamWriter` adapts that codec's sans-IO stream encoder. What differs per API and is not the
codec's job lives here: when the stream's first frame can go out (Anthropic's `message_start`
carries the prompt's cache hits, known at the first engine step), what a keep-alive ping is (an
Anthropic `ping` event once the message started, else an SSE comment), which error event ends a
stream, and what is remembered after a turn (the call memory for Anthropic and Chat clients, the
response store for Responses). The call memory is read after decoding (`restore`), once the
frontend knows which conversation the request belongs to: its scope is the API key *and* the
conversation (`memory.call_scope`), so two conversations never get each other's turns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from starlette.datastructures import Headers

from agentserve.api import anthropic, chat, responses
from agentserve.api.anthropic.context import applied_json
from agentserve.api.errors import ApiError, ApiKind, ContextLengthError
from agentserve.api.memory import CallMemory, restore_history
from agentserve.api.request import AnthropicRequest, DecodedRequest, ResponsesRequest
from agentserve.api.responses import ResponseStore
from agentserve.api.signing import Signer
from agentserve.api.sse import DONE, PING_COMMENT, dumps
from agentserve.api.turn import TurnAccumulator
from agentserve.config import ApiName
from agentserve.conversation import Finish, OutputEvent, Usage
from agentserve.frontend.betas import BetaLog


class StreamWriter(Protocol):
    def opening(self) -> bytes:
        """Sent with the response headers, before any engine step."""
        ...

    def started(self, usage: Usage) -> bytes:
        """At the first engine step (prefill done, prompt usage known)."""
        ...

    def feed(self, event: OutputEvent) -> bytes: ...

    def finish(self, finish: Finish, stop_sequence: str | None) -> bytes: ...

    def error(self, error: ApiError) -> bytes:
        """End the stream with the API's error event (the HTTP status is already 200)."""
        ...

    def ping(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Context:
    """What a surface needs from the deployment."""

    signer: Signer
    memory: CallMemory
    store: ResponseStore
    dispatch: bool  # streaming tool dispatch


class Surface(Protocol):
    name: ApiName
    error_kind: ApiKind

    def decode(self, body: Any, ctx: Context, scope: str) -> DecodedRequest: ...

    def note_headers(self, headers: Headers, betas: BetaLog) -> None:
        """Headers of this API the deployment keeps a record of (Anthropic's beta flags)."""
        ...

    def reports_in_stream(self, request: DecodedRequest, error: ApiError) -> bool:
        """An error before the stream started that the API still reports as a 200 event stream."""
        ...

    def restore(self, request: DecodedRequest, ctx: Context, memory_scope: str) -> DecodedRequest:
        """The request with the turns the call memory recognises (under `memory_scope`) put back."""
        ...

    def writer(self, request: DecodedRequest, ctx: Context, model: str) -> StreamWriter: ...

    def build(
        self, turn: TurnAccumulator, request: DecodedRequest, ctx: Context, model: str, stop: str | None
    ) -> tuple[dict[str, Any], str]:
        """The non-streaming body and its id (raises ApiError if generation failed)."""
        ...

    def remember(
        self,
        request: DecodedRequest,
        turn: TurnAccumulator,
        response_id: str,
        ctx: Context,
        scope: str,
        *,
        memory_scope: str,
    ) -> None:
        """Keep the finished turn: the call memory under `memory_scope` (the conversation's), the
        response store under `scope` (the API key's: `previous_response_id` is looked up by it)."""
        ...


def _restore(
    request: DecodedRequest, ctx: Context, memory_scope: str, *, whole_turns: bool
) -> DecodedRequest:
    conversation = request.conversation
    if not ctx.memory or not any(m.role == "assistant" for m in conversation.messages):
        return request
    messages, restored = restore_history(
        conversation.messages, ctx.memory, memory_scope, whole_turns=whole_turns
    )
    if not restored:
        return request
    return replace(request, conversation=replace(conversation, messages=messages), restored=restored)


class _OpenAIWriter:
    """Chat's and Responses' streams: the opening frame goes with the headers, pings are SSE
    comments, and the encoder's own terminal error event ends a failed stream."""

    __slots__ = ("_enc", "_error", "feed")

    def __init__(self, encoder: chat.ChatStreamEncoder | responses.ResponsesStreamEncoder) -> None:
        self._enc = encoder
        self.feed: Callable[[OutputEvent], bytes] = encoder.feed
        self._error: Callable[[ApiError], bytes] = (
            encoder.fail if isinstance(encoder, responses.ResponsesStreamEncoder) else encoder.error
        )

    @property
    def response_id(self) -> str | None:
        """The id a streamed Responses turn is stored under (None for Chat)."""
        enc = self._enc
        return enc.response_id if isinstance(enc, responses.ResponsesStreamEncoder) else None

    def opening(self) -> bytes:
        return self._enc.start()

    def started(self, usage: Usage) -> bytes:
        return b""

    def finish(self, finish: Finish, stop_sequence: str | None) -> bytes:
        return self._enc.finish(finish)

    def error(self, error: ApiError) -> bytes:
        return self._error(error)

    def ping(self) -> bytes:
        return PING_COMMENT


class _SurfaceDefaults:
    """What most surfaces do alike (a surface overrides what its API does otherwise)."""

    def note_headers(self, headers: Headers, betas: BetaLog) -> None:
        pass

    def reports_in_stream(self, request: DecodedRequest, error: ApiError) -> bool:
        return False

    def remember(
        self,
        request: DecodedRequest,
        turn: TurnAccumulator,
        response_id: str,
        ctx: Context,
        scope: str,
        *,
        memory_scope: str,
    ) -> None:
        ctx.memory.remember(turn.message(ctx.signer), memory_scope)


# -- Anthropic ------------------------------------------------------------------------------------


class _AnthropicWriter:
    __slots__ = ("_enc", "_started", "feed")

    def __init__(self, encoder: anthropic.AnthropicStreamEncoder) -> None:
        self._enc = encoder
        self._started = False
        self.feed: Callable[[OutputEvent], bytes] = encoder.feed  # per event: no call in between

    def opening(self) -> bytes:
        return b""

    def started(self, usage: Usage) -> bytes:
        self._started = True
        return self._enc.start(usage)

    def finish(self, finish: Finish, stop_sequence: str | None) -> bytes:
        return self._enc.finish(finish, stop_sequence)

    def error(self, error: ApiError) -> bytes:
        return self._enc.error(error)

    def ping(self) -> bytes:
        # `ping` events belong inside a message; before `message_start` an SSE comment does the job.
        return self._enc.ping() if self._started else PING_COMMENT


class AnthropicSurface(_SurfaceDefaults):
    name: ApiName = "anthropic"
    error_kind: ApiKind = "anthropic"

    def decode(self, body: Any, ctx: Context, scope: str) -> DecodedRequest:
        return anthropic.decode_messages(body, signer=ctx.signer)

    def decode_count_tokens(self, body: Any, ctx: Context, scope: str) -> DecodedRequest:
        return anthropic.decode_count_tokens(body, signer=ctx.signer)

    def note_headers(self, headers: Headers, betas: BetaLog) -> None:
        betas.note(headers.getlist("anthropic-beta"))

    @staticmethod
    def _omit(request: DecodedRequest) -> bool:
        return request.options.reasoning.display == "omitted"

    @staticmethod
    def _context_management(request: DecodedRequest) -> dict[str, Any] | None:
        """`{applied_edits: […]}` for a request that asked for context edits (None otherwise)."""
        if not isinstance(request, AnthropicRequest) or request.context_management is None:
            return None
        return applied_json(request.applied_edits)

    def writer(self, request: DecodedRequest, ctx: Context, model: str) -> StreamWriter:
        encoder = anthropic.AnthropicStreamEncoder(
            model,
            signer=ctx.signer,
            dispatch=ctx.dispatch,
            omit_thinking=self._omit(request),
            context_management=self._context_management(request),
        )
        return _AnthropicWriter(encoder)

    def build(
        self, turn: TurnAccumulator, request: DecodedRequest, ctx: Context, model: str, stop: str | None
    ) -> tuple[dict[str, Any], str]:
        body = anthropic.build_message(
            turn,
            model=model,
            signer=ctx.signer,
            stop_sequence=stop,
            omit_thinking=self._omit(request),
            context_management=self._context_management(request),
        )
        return body, body["id"]

    def restore(self, request: DecodedRequest, ctx: Context, memory_scope: str) -> DecodedRequest:
        return _restore(request, ctx, memory_scope, whole_turns=False)


# -- Chat Completions -----------------------------------------------------------------------------


class ChatSurface(_SurfaceDefaults):
    name: ApiName = "chat"
    error_kind: ApiKind = "openai"

    def decode(self, body: Any, ctx: Context, scope: str) -> DecodedRequest:
        return chat.decode_chat(body)

    def writer(self, request: DecodedRequest, ctx: Context, model: str) -> StreamWriter:
        encoder = chat.ChatStreamEncoder(
            model,
            include_usage=request.options.include_usage,
            dispatch=ctx.dispatch,
            custom_tools=request.custom_tools,
        )
        return _OpenAIWriter(encoder)

    def build(
        self, turn: TurnAccumulator, request: DecodedRequest, ctx: Context, model: str, stop: str | None
    ) -> tuple[dict[str, Any], str]:
        body = chat.build_chat_completion(
            turn,
            model=model,
            custom_tools=request.custom_tools,
            logprobs=request.options.logprobs is not None,
        )
        return body, body["id"]

    def restore(self, request: DecodedRequest, ctx: Context, memory_scope: str) -> DecodedRequest:
        return _restore(request, ctx, memory_scope, whole_turns=True)


# -- Responses ------------------------------------------------------------------------------------


def _responses_request(request: DecodedRequest) -> ResponsesRequest:
    assert isinstance(request, ResponsesRequest)
    return request


class ResponsesSurface(_SurfaceDefaults):
    name: ApiName = "responses"
    error_kind: ApiKind = "openai"

    def decode(self, body: Any, ctx: Context, scope: str) -> DecodedRequest:
        return responses.decode_responses(body, signer=ctx.signer, store=ctx.store, scope=scope)

    def reports_in_stream(self, request: DecodedRequest, error: ApiError) -> bool:
        # Codex reads a context overflow from `response.failed` (then compacts), not from a status.
        return request.options.stream and isinstance(error, ContextLengthError)

    def writer(self, request: DecodedRequest, ctx: Context, model: str) -> StreamWriter:
        encoder = responses.ResponsesStreamEncoder(
            _responses_request(request), signer=ctx.signer, dispatch=ctx.dispatch
        )
        return _OpenAIWriter(encoder)

    def build(
        self, turn: TurnAccumulator, request: DecodedRequest, ctx: Context, model: str, stop: str | None
    ) -> tuple[dict[str, Any], str]:
        body = responses.build_response(turn, _responses_request(request), signer=ctx.signer)
        return body, body["id"]

    def restore(self, request: DecodedRequest, ctx: Context, memory_scope: str) -> DecodedRequest:
        return request  # its history comes back whole: reasoning items and the response store

    def remember(
        self,
        request: DecodedRequest,
        turn: TurnAccumulator,
        response_id: str,
        ctx: Context,
        scope: str,
        *,
        memory_scope: str,
    ) -> None:
        ctx.store.remember(_responses_request(request), response_id, turn.message(), scope)


def last_resort_frames(api: ApiName, error: ApiError) -> bytes:
    """The API's error event and terminal frame, built without the stream's encoder: what ends a
    stream whose encoder itself failed. Anthropic: an `error` event (the SDKs raise on it and stop);
    Chat: an error chunk, then `[DONE]`; Responses: an `error` event (its terminal event on failure)."""
    if api == "anthropic":
        return anthropic.error_event(error)
    if api == "chat":
        return ("data: " + dumps(error.openai_body()) + "\n\n").encode() + DONE
    body = {
        "type": "error",
        "code": error.code or error.openai_type,
        "message": error.message,
        "param": error.param,
    }
    return ("event: error\ndata: " + dumps(body) + "\n\n").encode()


def stream_response_id(writer: StreamWriter) -> str | None:
    """The id a streamed Responses turn is stored under (None for the other APIs)."""
    return writer.response_id if isinstance(writer, _OpenAIWriter) else None


SURFACES: Mapping[ApiName, Surface] = {
    "anthropic": AnthropicSurface(),
    "chat": ChatSurface(),
    "responses": ResponsesSurface(),
}
