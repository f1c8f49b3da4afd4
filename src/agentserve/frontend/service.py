"""The request path, from a decoded request to bytes on the wire (design.md, steps 2–7).

    decode (surface) → identity + agent hints → prompt pipeline (strip, render, tokens, hashes)
    → context-length check → Backend.generate (router + worker) → steps → family parser
    → OutputEvents → the API's encoder → SSE frames or one JSON body
    → after the turn: call memory / response store, the session's drift detector, the trace record

`Frontend` holds what lives as long as the process: the prompt pipeline, the backend, the signer,
the call memory, the response store, the drift detector and the telemetry hub (trace records and
metrics). HTTP specifics stay in `app.py` and `http.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from starlette.datastructures import Headers

from agentserve.api.anthropic.context import apply_edits
from agentserve.api.catalog import ModelFacts
from agentserve.api.errors import (
    ApiError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
)
from agentserve.api.identity import AgentIdentity
from agentserve.api.memory import CallMemory, call_scope
from agentserve.api.request import AnthropicRequest, DecodedRequest, ResponsesRequest
from agentserve.api.responses import ResponseStore
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator
from agentserve.config import ApiName, FrontendConfig
from agentserve.constraints.build import calls_askable
from agentserve.constraints.spec import Constraint
from agentserve.conversation import (
    Conversation,
    FinishReason,
    Message,
    OutputEvent,
    Text,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
)
from agentserve.frontend.backend import Backend
from agentserve.frontend.betas import BetaLog
from agentserve.frontend.constrain import Constrainer
from agentserve.frontend.generate import Generation
from agentserve.frontend.http import ApiKeys, ChunkWriter, parse_json
from agentserve.frontend.logprobs import AnswerLogprobs
from agentserve.frontend.models import served_models
from agentserve.frontend.plan import (
    engine_stops,
    generation_hints,
    output_budget,
    route_request,
    sampling_params,
)
from agentserve.frontend.relay import Relay
from agentserve.frontend.retention import (
    RetentionInputs,
    RetentionPolicy,
    SharedPrefixTracker,
    child_release,
    decide_retention,
    parent_hold,
)
from agentserve.frontend.subagents import SubagentTree, TreeLink, explicit_link, is_claude_subagent
from agentserve.frontend.surfaces import (
    AnthropicSurface,
    Context,
    StreamWriter,
    Surface,
    last_resort_frames,
    stream_response_id,
)
from agentserve.frontend.truncate import truncate_oldest
from agentserve.frontend.turnstile import Turnstile
from agentserve.parsing.stream import ParserOptions
from agentserve.prompt.drift import DriftReport
from agentserve.prompt.hashing import block_hashes
from agentserve.prompt.pipeline import PromptPipeline, RenderedPrompt, is_agent_traffic, render_prompt
from agentserve.prompt.session import SOURCE as CONVERSATION_SOURCE
from agentserve.prompt.session import conversation_key, key_after
from agentserve.prompt.session_memory import SessionMemory
from agentserve.prompt.splice import Produced, splice, splice_any
from agentserve.prompt.template import PromptError
from agentserve.router.core import OverloadedError as RouterOverloadedError
from agentserve.router.dispatch import NoCapacityError, PrefillOutcome, WorkerLostError
from agentserve.router.placement import RouteRequest
from agentserve.state import open_store, state_url
from agentserve.state.shared import SharedState
from agentserve.telemetry import RequestTelemetry, Telemetry
from agentserve.telemetry.trace import PrefillTrace
from agentserve.worker.engine import GenerateRequest, Retention, SamplingParams
from agentserve.worker.engine import InvalidRequestError as EngineInvalidRequest

log = logging.getLogger("agentserve.frontend")

WORKER_LOST = "the worker serving this request failed; retry the request"
_MAX_RETENTION_UPDATES = 64  # subagent-tree retention updates in flight (hold / release)


@dataclass(slots=True)
class Prepared:
    """A request that passed every check and is ready to dispatch."""

    surface: Surface
    request: DecodedRequest
    scope: str  # the caller's memory scope (a digest of its API key, or "")
    request_id: str
    identity: AgentIdentity
    prompt: RenderedPrompt  # as sent: with the session's previous turn spliced back in (exact replay)
    canonical: str  # the prompt text as the template rendered it
    extends: Produced | None  # the session's remembered turn this prompt was spliced onto
    max_tokens: int
    discard_output: bool  # Anthropic max_tokens 0: prefill only (a cache pre-warm)
    drift: DriftReport | None
    trace: RequestTelemetry
    constraint: Constraint | None = None  # the grammar the engine enforces (None: unconstrained)
    # The subagent tree (docs/subagents.md): the conversation's key in the tree (the session id, or
    # its own conversation key for a Claude Code child that reuses its parent's session id), whether
    # that key is a conversation key (it moves once turn 1's reply anchors it), and its parent link.
    # Read by retention and placement only, never by anything that shapes the reply.
    tree_session: str | None = None
    tree_keyed_by_conversation: bool = False
    subagent: TreeLink | None = None
    shared_prefix_tokens: int = 0  # the deployment's (or a subagent type's) prefix, as retention saw it
    # What the turn's blocks are released under last (its own retention, or the tree's hold or
    # release after it): a speculative prefill releases them once more and must not demote them.
    retention: Retention | None = None

    @property
    def model(self) -> str:
        # The name the client asked for: the real APIs answer with the model the client named (or
        # its resolved snapshot); harnesses send their own names and some compare them.
        return self.request.options.model


# Stands in for the next message's content when predicting the next prompt (never sent).
_NEXT = "\u2063agentserve-next-turn\u2063"


def _truncates(request: DecodedRequest) -> bool:
    return isinstance(request, ResponsesRequest) and request.truncation == "auto"


def error_frames(api: ApiName, writer: StreamWriter, error: ApiError, request_id: str) -> bytes:
    """The stream's error event and terminal frame; if the encoder fails at that too, frames built
    without it (`last_resort_frames`): a stream always ends with its API's terminal event."""
    try:
        return writer.error(error)
    except Exception:
        log.exception("%s: the stream's error event failed", request_id)
        return last_resort_frames(api, error)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request past every check, its generation open (`Frontend.handle`)."""

    prepared: Prepared
    generation: Generation


@dataclass(frozen=True, slots=True)
class Refused:
    """A request answered with its API's error: an HTTP status, or where the API reports it in a
    stream (`frames`: the whole 200 event stream that carries it)."""

    error: ApiError
    frames: bytes | None = None


BodyReader = Callable[[], Awaitable[bytes]]


@dataclass(slots=True)
class _Progress:
    """How far a request got before it failed: what its rejection trace can say."""

    decoded: DecodedRequest | None = None
    trace: RequestTelemetry | None = None


class Frontend:
    def __init__(
        self,
        config: FrontendConfig,
        backend: Backend,
        pipeline: PromptPipeline,
        *,
        signer: Signer,
        telemetry: Telemetry | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.pipeline = pipeline
        self.keys = keys if keys is not None else ApiKeys.load(config.api_keys_file)
        self.betas = BetaLog()  # unfamiliar Anthropic beta flags, each logged once
        self.turnstile = Turnstile()  # shared by the three APIs: one preparation per loop iteration
        self._retention_policy = RetentionPolicy.from_settings(config.retention)
        self.tree = SubagentTree() if config.subagent_trees else None
        self._retention_updates: set[asyncio.Task[None]] = set()
        self._shared_prefix = SharedPrefixTracker(pipeline.block_size)
        self.models: list[ModelFacts] = served_models(config, pipeline.family)
        self._model_ids = frozenset(i for m in self.models for i in m.ids)
        self.telemetry = telemetry or Telemetry.from_config(config, served_models=self._model_ids)
        self.ctx = Context(
            signer=signer,
            memory=CallMemory(config.call_memory_turns),
            store=ResponseStore(config.response_store_size),
            dispatch=config.enable_streaming_tool_dispatch,
        )
        self.state = SharedState(
            open_store(state_url(config), config.state_entries, config.state_max_bytes),
            self.ctx.memory,
            self.ctx.store,
            response_ttl_s=config.response_ttl_s,
            turn_ttl_s=config.call_memory_ttl_s,
            registry=self.telemetry.metrics.registry,
        )
        # Per session: its served turns (exact replay), answers, last prompt + output (drift), idle clock.
        self.sessions = SessionMemory(pipeline.tokenizer.decode)
        # The family's end-of-turn tokens, sent with every request (resolved once, not per request).
        self.stops = engine_stops(pipeline.family.stop_tokens, pipeline.tokenizer.token_id)
        self.constrainer = Constrainer(
            pipeline.family,
            pipeline.tokenizer.to_json,
            self.stops.token_ids,
            enabled=config.constrained_decoding,
            cache_size=config.constraint_cache_size,
        )
        self.context_window = self.models[0].context_window
        self.max_output = self.models[0].max_output_tokens

    # -- the request path ---------------------------------------------------------------------------

    async def handle(
        self, surface: Surface, headers: Headers, body: BodyReader, request_id: str
    ) -> Admitted | Refused:
        """The whole path of a generation request, from the key check to the open generation; the
        route only turns the outcome into HTTP. Every failure is the API's own error, traced."""
        progress = _Progress()
        try:
            scope, decoded, identity = await self._decoded(
                surface, surface.decode, headers, body, progress, turnstile=True
            )
            trace = progress.trace = self.trace(request_id, surface.name, headers, decoded, identity)
            prepared = self.prepare(surface, decoded, identity, trace, scope=scope, request_id=request_id)
            return Admitted(prepared, await self.open(prepared))
        except ApiError as error:
            return self._refuse(surface, headers, request_id, progress, error)
        except Exception:
            log.exception("%s: %s request failed", request_id, surface.name)
            internal = InternalError(f"internal error (request {request_id})")
            return self._refuse(surface, headers, request_id, progress, internal)

    def _refuse(
        self, surface: Surface, headers: Headers, request_id: str, progress: _Progress, error: ApiError
    ) -> Refused:
        decoded = progress.decoded
        self.rejected(progress.trace or self.trace(request_id, surface.name, headers, decoded), error)
        if decoded is None or not surface.reports_in_stream(decoded, error):
            return Refused(error)
        writer = surface.writer(decoded, self.ctx, decoded.options.model)
        return Refused(error, error_frames(surface.name, writer, error, request_id))

    async def count_tokens(
        self, surface: AnthropicSurface, headers: Headers, body: BodyReader
    ) -> dict[str, Any]:
        """Anthropic `count_tokens`: the real request's decode, restore, context edits and render, so
        the count is exactly what /v1/messages would send (raises ApiError)."""
        _, decoded, _ = await self._decoded(surface, surface.decode_count_tokens, headers, body, _Progress())
        self.check_model(decoded.options.model)
        edited, rendered, _ = self.edit_history(decoded)  # as /v1/messages sends it
        tokens = len((rendered or self.render(edited)).token_ids)
        counted: dict[str, Any] = {"input_tokens": tokens}
        if isinstance(decoded, AnthropicRequest) and decoded.context_management is not None:
            original = tokens if edited is decoded else len(self.render(decoded).token_ids)
            counted["context_management"] = {"original_input_tokens": original}
        return counted

    async def _decoded(
        self,
        surface: Surface,
        decode: Callable[[Any, Context, str], DecodedRequest],
        headers: Headers,
        body: BodyReader,
        progress: _Progress,
        *,
        turnstile: bool = False,
    ) -> tuple[str, DecodedRequest, AgentIdentity]:
        """Key check, the API's headers, the body, decode, identity and the remembered turns put back:
        (the key's scope, the request, its identity)."""
        scope = self.keys.check(headers) or ""
        surface.note_headers(headers, self.betas)
        raw = await body()
        if turnstile:
            await self.turnstile.turn()  # one preparation per loop iteration (turnstile.py)
        parsed = parse_json(raw)
        await self.state.prefetch(surface.name, parsed, scope)
        decoded = progress.decoded = decode(parsed, self.ctx, scope)
        identity = self.identify(decoded, decoded.agent_identity(headers))
        decoded = progress.decoded = await self.restore(surface, parsed, decoded, identity, scope=scope)
        return scope, decoded, identity

    # -- before dispatch ---------------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        if not self.config.accept_any_model and name not in self._model_ids:
            raise ModelNotFoundError(name)

    def identify(self, request: DecodedRequest, identity: AgentIdentity) -> AgentIdentity:
        """The request's identity; without a session id from a header or the body (pi, OpenClaw), the
        conversation's own key (`prompt.session`) stands in for traces, drift, affinity and retention."""
        if identity.session_id is not None:
            return identity
        key = conversation_key(request.conversation, self.pipeline.strip)
        if key is None:
            return identity
        return replace(identity, session_id=key, source=CONVERSATION_SOURCE)

    async def restore(
        self, surface: Surface, body: object, request: DecodedRequest, identity: AgentIdentity, *, scope: str
    ) -> DecodedRequest:
        """The request with its remembered turns put back, looked up under the API key's scope and
        this conversation's identity (`call_scope`), never another conversation's."""
        memory_scope = call_scope(scope, identity.session_id)
        await self.state.prefetch_turns(surface.name, body, memory_scope)
        return surface.restore(request, self.ctx, memory_scope)

    def render(self, request: DecodedRequest, *, add_generation_prompt: bool = True) -> RenderedPrompt:
        """The prompt exactly as the real request renders it (count_tokens uses this too)."""
        if self.constrainer.drops_tools(request):
            # tool_choice none: the family's template renders no tool preamble for no tools.
            request = replace(request, conversation=replace(request.conversation, tools=()))
        options = request.options
        try:
            return render_prompt(
                request.conversation,
                self.pipeline,
                enable_thinking=options.reasoning.enabled,
                template_kwargs=options.template_kwargs or None,
                reasoning_effort=options.reasoning.level,
                add_generation_prompt=add_generation_prompt,
            )
        except PromptError as exc:
            raise InvalidRequestError(str(exc)) from None
        except RecursionError:
            raise InvalidRequestError("the request is nested too deeply to render") from None

    def edit_history(self, request: DecodedRequest) -> tuple[DecodedRequest, RenderedPrompt | None, bool]:
        """The request with the context edits it asks for (Anthropic `context_management`) applied
        to its history; the prompt of the result when measuring it rendered it already (no second
        render); whether any edit was applied (the prefix then changes on purpose)."""
        if not isinstance(request, AnthropicRequest) or request.context_management is None:
            return request, None, False
        base = request
        rendered: list[tuple[Conversation, RenderedPrompt]] = []  # what measuring rendered

        def count(conversation: Conversation) -> int:
            prompt = self.render(replace(base, conversation=conversation))
            rendered.append((conversation, prompt))
            return len(prompt.token_ids)

        conversation, applied = apply_edits(request.conversation, request.context_management, count)
        if applied:
            request = replace(request, conversation=conversation, applied_edits=applied)
        prompt = next((p for c, p in rendered if c is conversation), None)
        return request, prompt, bool(applied)

    def truncate(
        self, request: DecodedRequest, prompt: RenderedPrompt
    ) -> tuple[DecodedRequest, RenderedPrompt, bool]:
        """Responses `truncation: auto`: the oldest items dropped until the prompt fits the window
        (whole units: a call keeps its result); unchanged when nothing fits (the budget's 400)."""
        base = request

        def fits(conversation: Conversation) -> bool:
            rendered = self.render(replace(base, conversation=conversation))
            return len(rendered.token_ids) < self.context_window

        found = truncate_oldest(request.conversation, fits)
        if found is None:
            return request, prompt, False
        conversation, dropped = found
        log.info("truncation auto: dropped the %d oldest messages to fit the context window", dropped)
        request = replace(request, conversation=conversation)
        return request, self.render(request), True

    def trace(
        self,
        request_id: str,
        api: ApiName,
        headers: Mapping[str, str],
        request: DecodedRequest | None = None,
        identity: AgentIdentity | None = None,
    ) -> RequestTelemetry:
        """The request's trace record (and metrics), labelled with the model that serves it."""
        model = self.config.model
        if request is not None and request.options.model in self._model_ids:
            model = request.options.model
        return self.telemetry.request(
            request_id, api, model, identity=identity, x_request_id=headers.get("x-request-id")
        )

    def prepare(
        self,
        surface: Surface,
        request: DecodedRequest,
        identity: AgentIdentity,
        trace: RequestTelemetry,
        *,
        scope: str,
        request_id: str,
    ) -> Prepared:
        self.check_model(request.options.model)
        self.constrainer.check_logit_bias(request)
        if request.ignored:
            ignored = ", ".join(request.ignored[:20])
            log.debug("%s %s: accepted and ignored %s", request_id, surface.name, ignored)
        session = identity.session_id
        replaying = session if self.config.exact_replay else None
        if replaying is not None:
            restored = self.sessions.restore_answers(replaying, request.conversation)
            if restored is not request.conversation:
                request = replace(request, conversation=restored)
        request, prompt_of_edits, edited = self.edit_history(request)
        prompt = prompt_of_edits or self.render(request)
        if len(prompt.token_ids) >= self.context_window and _truncates(request):
            request, prompt, cut = self.truncate(request, prompt)
            edited = edited or cut
        canonical = prompt.text
        extends = None
        if replaying is not None and not edited:  # an edited history extends no earlier turn
            prompt, extends = splice_any(prompt, self.sessions.turns(replaying), self.pipeline)
        requested = request.options.max_tokens
        max_tokens = output_budget(
            None if requested == 0 else requested, len(prompt.token_ids), self.context_window, self.max_output
        )
        constraint = self.constrainer.constraint(
            request, starts_in_reasoning=prompt.starts_in_reasoning, max_tokens=max_tokens
        )
        drift = previous_prompt = None
        if session is not None and not edited:  # an applied edit changes the prefix on purpose: not drift
            drift = self.sessions.drift(session, prompt.token_ids)
            previous_prompt = self.sessions.prompt_tokens(session)
            if drift is not None and drift.drifted:
                # The text around the divergence goes to the log only (trace records hold no text).
                log.info("%s prefix drift in session %s: %s", request_id, session, drift.to_json())
        trace.rendered(
            block_hashes=prompt.block_hashes,
            block_size=self.pipeline.block_size,
            input_length=len(prompt.token_ids),
            stripped=prompt.stripped,
            drift=drift,
            previous_prompt_tokens=previous_prompt,
        )
        tree_session, by_conversation, link = self._place_in_tree(request, identity, prompt, trace, scope)
        return Prepared(
            surface=surface,
            request=request,
            scope=scope,
            request_id=request_id,
            identity=identity,
            prompt=prompt,
            canonical=canonical,
            extends=extends,
            max_tokens=1 if requested == 0 else max_tokens,
            discard_output=requested == 0,
            drift=drift,
            trace=trace,
            constraint=constraint,
            tree_session=tree_session,
            tree_keyed_by_conversation=by_conversation,
            subagent=link,
        )

    def _place_in_tree(
        self,
        request: DecodedRequest,
        identity: AgentIdentity,
        prompt: RenderedPrompt,
        trace: RequestTelemetry,
        scope: str,
    ) -> tuple[str | None, bool, TreeLink | None]:
        """(the conversation's key in the subagent tree, whether it is a conversation key, its parent
        link) — `frontend.subagents`; the identity the reply depends on is left as it is."""
        session = identity.session_id
        if self.tree is None or session is None:
            return session, False, None
        now = time.monotonic()
        conversation = request.conversation
        by_conversation = identity.source == CONVERSATION_SOURCE
        link = explicit_link(identity.parent_session_id, identity.parent_source, identity.subagent_kind)
        if link is not None and link.parent == session and identity.thread_id not in (None, session):
            # A Codex child keeps the root's `session-id` and names its own thread: that is its node.
            session = identity.thread_id
        if (
            link is None
            and identity.source == "header:x-claude-code-session-id"
            and is_claude_subagent(conversation.system)
        ):
            # An older Claude Code child keeps its parent's session id and says only this: it is its
            # own conversation under that session (one session id is not one linear conversation).
            key = conversation_key(conversation, self.pipeline.strip)
            if key is not None:
                session, by_conversation = key, True
                link = TreeLink(identity.session_id or key, "billing:cc_is_subagent")
        if link is None:
            link = self.tree.infer_parent(scope, conversation, now)
        elif self.tree.parent_of(session) is None:  # a child's first turn: it claims its spawn call
            self.tree.infer_parent(scope, conversation, now, parent=link.parent)
        if link is None:
            known = self.tree.parent_of(session)  # a later turn of a child linked on its first
            link = None if known is None else TreeLink(known, "tree")
        # An agent turn of the session ends its hold; Claude Code's tool-less title request, which
        # shares the session id, does not.
        if conversation.tools:
            self.tree.resumed(session)
        if link is None or link.parent == session:
            return session, by_conversation, None
        kind = prompt.block_hashes[0] if prompt.block_hashes else None
        self.tree.child_turn(session, link, kind, now)
        trace.linked(session, link.parent, link.source)
        self._rearm_hold(link.parent, now)
        return session, by_conversation, link

    def _rearm_hold(self, parent: str, now: float) -> None:
        """A child still runs while its parent's hold is about to run out: hold the parent again (its
        last prompt + output, as the drift detector remembers them)."""
        assert self.tree is not None
        policy = self._retention_policy
        shared = self.tree.hold_due(parent, now, policy.child_duration_s)
        context = None if shared is None else self.sessions.context(parent)
        if shared is None or context is None:
            return
        self._update_retention(list(context), parent, parent_hold(policy, len(context), shared))
        self.tree.held(parent, now + policy.session_duration_s, shared)

    async def open(self, p: Prepared) -> Generation:
        """Route and open the request on a worker. Raises ApiError (no capacity: overloaded)."""
        request = p.request
        prompt = p.prompt
        p.retention = self._retention(p)
        generate = GenerateRequest(
            request_id=p.request_id,
            prompt_token_ids=prompt.token_ids,
            sampling=sampling_params(request.options, p.max_tokens, self.stops),
            priority=request.nvext.agent_hints.priority or 0,
            hints=generation_hints(request.conversation),
            cache_salt=request.nvext.cache_salt,
            retention=p.retention,
            constraint=p.constraint,
        )
        route = route_request(request, prompt.block_hashes, len(prompt.token_ids), p.identity.session_id)
        if p.subagent is not None:  # placement keeps the parent's worker for it (router/placement.py)
            route = replace(route, parent_session_id=p.subagent.parent)
        try:
            stream = await self.backend.generate(generate, route)
        except (NoCapacityError, RouterOverloadedError) as exc:
            log.warning("%s: no capacity: %s", p.request_id, exc)
            raise OverloadedError("no worker can take the request now; retry shortly") from None
        except EngineInvalidRequest as exc:
            raise InvalidRequestError(str(exc)) from None
        decision = stream.decision
        p.trace.routed(decision.worker, decision.overlap_blocks, prompt_blocks=decision.prompt_blocks)
        tools = request.conversation.tools
        parser = self.pipeline.family.parser(
            ParserOptions(
                starts_in_reasoning=prompt.starts_in_reasoning,
                tools=tools,
                calls_by_shape=calls_askable(request.options, tools),
            )
        )
        return Generation(
            stream,
            parser,
            prompt_tokens=len(prompt.token_ids),
            starts_in_reasoning=prompt.starts_in_reasoning,
            stops=request.options.stop,
            discard_output=p.discard_output,
            keep_token_ids=p.identity.session_id is not None,
            logprobs=None
            if request.options.logprobs is None
            else AnswerLogprobs(self.constrainer.token_bytes),
        )

    def _retention(self, p: Prepared) -> Retention | None:
        if self._retention_policy.mode == "off":
            return None
        request, prompt = p.request, p.prompt
        shared = self._shared_prefix.observe(prompt.block_hashes, p.tree_session)
        idle = None if p.tree_session is None else self.sessions.arrived(p.tree_session, time.monotonic())
        p.shared_prefix_tokens = shared
        messages = request.conversation.messages
        inputs = RetentionInputs(
            prompt_tokens=len(prompt.token_ids),
            shared_prefix_tokens=shared,
            has_tools=bool(request.conversation.tools),
            after_tool_result=bool(messages) and messages[-1].role == "tool",
            hint_priority=request.nvext.agent_hints.priority,
            idle_s=idle,
            subagent=p.subagent is not None,
        )
        return decide_retention(self._retention_policy, inputs)

    # -- after the turn ----------------------------------------------------------------------------

    async def _after(
        self,
        p: Prepared,
        gen: Generation,
        events: list[OutputEvent],
        response_id: str,
        body: dict[str, object] | None = None,
    ) -> None:
        """Remember a completed turn: call memory / response store (written through to the shared
        store once, before the client sees the end), and the session's drift state."""
        finish = gen.finish
        if finish is None or finish.reason in ("abort", "error"):
            return
        calls = any(type(e) is ToolCallEnd for e in events)
        store = p.surface.name == "responses" and getattr(p.request, "store", False)
        turn = TurnAccumulator().feed_all(events) if calls or store else None
        session = p.identity.session_id
        conversation = p.request.conversation
        reply = turn
        first_turn = not any(m.role == "assistant" for m in conversation.messages)
        if session is not None and p.identity.source == CONVERSATION_SOURCE and first_turn:
            # Turn 1 has no reply to anchor its key yet: remember it under the key turn 2 will show.
            reply = reply or TurnAccumulator().feed_all(events)
            turn_one = session
            session = key_after(conversation, reply.message(), self.pipeline.strip)
            if session is not None and session != turn_one:
                # Traces and the retention tracker follow the conversation from turn 1 on (docs/prompt.md).
                p.trace.relabel(session)
                hashes = p.prompt.block_hashes
                self._rename(turn_one, session, hashes[0] if hashes else None)
        self._tree_turn_ended(p, gen, events, calls=calls, first_turn=first_turn, reply=reply)
        if session is not None:
            self._remember_session(p, gen, events, session, calls=calls, turn=reply)
        if p.request.nvext.agent_hints.speculative_prefill and not p.discard_output:
            self.speculate(p, gen, reply or TurnAccumulator().feed_all(events), session)
        if turn is not None:
            # The call memory's scope is the one the next request of this conversation will show.
            memory_scope = call_scope(p.scope, session)
            p.surface.remember(p.request, turn, response_id, self.ctx, p.scope, memory_scope=memory_scope)
            if store:
                await self._save_response(p, turn, response_id, body)
            elif calls:
                first = next(e for e in events if type(e) is ToolCallStart)
                message = self.ctx.memory.turn(first.id, memory_scope)
                if message is not None:
                    await self.state.save_turns(memory_scope, (message,))

    def _tree_turn_ended(
        self,
        p: Prepared,
        gen: Generation,
        events: list[OutputEvent],
        *,
        calls: bool,
        first_turn: bool,
        reply: TurnAccumulator | None,
    ) -> None:
        """The tree learns that a turn ended: a child that answered stops running; spawning calls are
        remembered for inference; a conversation-keyed node moves to the key its turn 2 will show."""
        tree, node = self.tree, p.tree_session
        if tree is None or node is None:
            return
        now = time.monotonic()
        if p.tree_keyed_by_conversation and first_turn:
            reply = reply or TurnAccumulator().feed_all(events)
            anchored = key_after(p.request.conversation, reply.message(), self.pipeline.strip)
            if anchored is not None and anchored != node:
                tree.rename(node, anchored)
                if p.subagent is not None:
                    p.trace.linked(anchored, p.subagent.parent, p.subagent.source)
                if p.identity.source != CONVERSATION_SOURCE:  # `_after` moved the others already
                    hashes = p.prompt.block_hashes
                    self._rename(node, anchored, hashes[0] if hashes else None)
                node = anchored
        tree.turn_ended(node, tool_calls=calls, now=now)
        policy, shared = self._retention_policy, p.shared_prefix_tokens
        context = [*p.prompt.token_ids, *gen.generated]
        spawned = 0
        if calls:
            names = {e.index: e.name for e in events if type(e) is ToolCallStart}
            made = [(names.get(e.index, ""), e.arguments) for e in events if type(e) is ToolCallEnd]
            spawned = tree.note_spawns(p.scope, node, made, now)
        control = p.request.nvext.session_control
        closing = control is not None and control.action == "close"  # Dynamo: done after this turn
        update = None
        if spawned:
            update = parent_hold(policy, len(context), shared)
            tree.held(node, now + policy.session_duration_s, shared)
        elif closing or (p.subagent is not None and not calls):
            # The child answered (its result goes to the parent) or the client closed the session:
            # its own KV is worth nothing now.
            update = child_release(policy, len(context), shared)
        if update is not None:
            self._update_retention(context, node, update)
            p.retention = update  # a speculative prefill after it releases the blocks alike

    def _update_retention(self, token_ids: list[int], session: str, retention: Retention | None) -> None:
        """Re-release a conversation's cached prompt and output under `retention`: a one-token request
        over blocks its turn just left in the cache (the last release decides a block's class; the
        engine adapters map `Retention` as for any request). Fire and forget, bounded; it never
        touches a reply. It runs at normal priority, so it lands before the burst of children a
        spawn brings (bench/subagents.py: behind them, the parent is evicted first)."""
        if retention is None or len(self._retention_updates) >= _MAX_RETENTION_UPDATES:
            return
        bs, seed = self.pipeline.block_size, self.pipeline.hash_seed
        route = RouteRequest(tuple(block_hashes(token_ids, bs, seed)), len(token_ids), session, osl=1)
        request = GenerateRequest(
            f"retain-{uuid.uuid4().hex}",
            token_ids,
            SamplingParams(max_tokens=1),
            retention=retention,
        )
        task = asyncio.get_running_loop().create_task(self._send_update(request, route))
        self._retention_updates.add(task)
        task.add_done_callback(self._retention_updates.discard)

    async def cancel_retention_updates(self) -> None:
        """Cancel the retention updates in flight (shutdown)."""
        tasks = list(self._retention_updates)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def retention_updates_done(self) -> None:
        """Wait for the retention updates in flight (tests; a clean shutdown)."""
        while self._retention_updates:
            await asyncio.gather(*self._retention_updates, return_exceptions=True)

    async def _send_update(self, request: GenerateRequest, route: RouteRequest) -> None:
        try:
            stream = await self.backend.generate(request, route)
            try:
                async for _ in stream:
                    pass
            finally:
                await stream.aclose()  # cancelled (shutdown): the engine request is aborted
        except Exception as exc:  # a retention update is a hint: losing one costs cache, nothing else
            log.info("retention update %s skipped: %s", request.request_id, exc)

    def speculate(
        self, p: Prepared, gen: Generation, reply: TurnAccumulator, session: str | None
    ) -> RenderedPrompt | None:
        """`nvext.agent_hints.speculative_prefill`: prefill the predicted next prompt — this prompt as
        sent, the output as generated, then what the template writes after the turn — on the worker
        the next turn will be routed to (same session), while the client runs its tools. Returns the
        prediction when a warm-up was started."""
        request = p.request
        answer = reply.message(self.ctx.signer)
        # After calls the next message is certainly their results: render them with a marker and
        # keep what precedes it (the results' header is predicted too).
        results = tuple(
            Message("tool", (ToolResult(c.id, (Text(_NEXT),), False, c.name),)) for c in answer.tool_calls
        )
        history = (*request.conversation.messages, answer, *results)
        try:
            rendered = self.render(
                replace(request, conversation=replace(request.conversation, messages=history)),
                add_generation_prompt=False,
            )
        except ApiError:
            return None
        cut = rendered.text.find(_NEXT)
        if cut >= 0:
            rendered = replace(rendered, text=rendered.text[:cut])
        # The next prompt starts with this one as sent and the output as generated (exact replay).
        spliced = splice(rendered, Produced.of(p.canonical, p.prompt, gen.generated), self.pipeline)
        ids = (
            spliced.token_ids if spliced is not None else tuple(self.pipeline.tokenizer.encode(rendered.text))
        )
        # The text was cut mid-prompt: its last token may merge with what follows in the real one.
        ids = ids[:-1] if cut >= 0 else ids
        hashes = tuple(block_hashes(ids, self.pipeline.block_size, self.pipeline.hash_seed))
        route = route_request(request, hashes, len(ids), session)
        if not self.backend.speculative_prefill(ids, route, p.retention):
            return None
        log.debug("%s: speculative prefill of %d tokens", p.request_id, len(ids))
        return replace(rendered, token_ids=ids, block_hashes=hashes)

    def _remember_session(
        self,
        p: Prepared,
        gen: Generation,
        events: list[OutputEvent],
        session: str,
        *,
        calls: bool,
        turn: TurnAccumulator | None,
    ) -> None:
        """The session's drift state and exact-replay turn (and, for an agent's answer, the answer)."""
        self.sessions.remember_context(session, p.prompt.token_ids, gen.generated)
        if self.config.exact_replay and not p.discard_output:
            produced = Produced.of(p.canonical, p.prompt, gen.generated)
            self.sessions.remember_turn(session, produced, p.extends)
            # An answer's reasoning matters to the next prompt only where templates keep it (agents).
            if not calls and is_agent_traffic(p.request.conversation):
                answer = (turn or TurnAccumulator().feed_all(events)).message()
                self.sessions.remember_answer(session, answer)

    def _rename(self, old: str, new: str, first_block: int | None) -> None:
        """A conversation's key moves (turn 1's reply anchors it): its memories and its entry in the
        shared-prefix tracker follow."""
        self.sessions.rename(old, new)
        self._shared_prefix.rename(old, new, first_block)

    async def _save_response(
        self, p: Prepared, turn: TurnAccumulator, response_id: str, body: dict[str, object] | None
    ) -> None:
        history = self.ctx.store.get(response_id, p.scope)
        if history is None:
            return
        if body is None:  # streamed: the object GET /v1/responses/{id} serves, as `create` returns it
            try:
                body = dict(p.surface.build(turn, p.request, self.ctx, p.model, None)[0])
            except ApiError:
                return
            body["id"] = response_id
        await self.state.save_response(
            p.scope, response_id, self.ctx.store.system(response_id, p.scope), history, dict(body)
        )

    def _finished(
        self, p: Prepared, gen: Generation, reason: FinishReason, events: list[OutputEvent]
    ) -> None:
        for m in getattr(gen.stream, "migrations", ()):
            self.state.metrics.migrations.inc()
            gap = m.gap_s
            log.info(
                "%s migrated from %s to %s after %d tokens",
                p.request_id,
                m.from_worker,
                m.to_worker,
                m.resumed_tokens,
            )
            p.trace.migrated(
                m.from_worker, m.to_worker, m.resumed_tokens, None if gap is None else gap * 1000
            )
        prefill = getattr(gen.stream, "prefill", None)
        if prefill is not None:
            p.trace.prefill_placed(prefill_trace(prefill))
        finish = gen.finish
        usage = finish.usage if finish is not None else Usage(gen.prompt_tokens, gen.output_tokens)
        if reason in ("stop", "length") and any(type(e) is ToolCallEnd for e in events):
            reason = "tool_calls"  # what the client was told: a call went out, it may be running it
        p.trace.finished(usage, reason)

    # -- the two ways out --------------------------------------------------------------------------

    async def stream(self, p: Prepared, gen: Generation, writer: StreamWriter, write: ChunkWriter) -> bytes:
        """Write one request's SSE frames through `write` (`relay.Relay`) and return the last
        chunk, which the caller sends with the end of the body."""
        reason: FinishReason = "abort"  # until the stream ends on its own (a disconnect leaves it)
        relay = Relay(gen, writer, p.trace, write)
        try:
            error: ApiError | None = None
            try:
                await relay.run()
                if gen.finish is not None:
                    reason = gen.finish.reason
            except WorkerLostError as exc:
                log.warning("%s: %s", p.request_id, exc)
                error = OverloadedError(WORKER_LOST)
            except Exception:
                log.exception("%s: the stream failed", p.request_id)
                error = InternalError(f"internal error (request {p.request_id})")
            if error is not None:
                reason = "error"
                relay.pending.append(error_frames(p.surface.name, writer, error, p.request_id))
            else:
                try:
                    await self._after(p, gen, relay.events, stream_response_id(writer) or p.request_id)
                except Exception:  # the client has its whole answer: remembering it is ours to fix
                    log.exception("%s: after the turn", p.request_id)
        finally:
            try:
                await gen.release()
                self._finished(p, gen, reason, relay.events)
            except Exception:  # bookkeeping must not cost the client its stream's end
                log.exception("%s: after the stream", p.request_id)
        return b"".join(relay.pending)

    async def complete(self, p: Prepared, gen: Generation) -> dict[str, object]:
        """The non-streaming body. Raises ApiError (the response gets the API's error status)."""
        events: list[OutputEvent] = []
        reason: FinishReason = "abort"
        trace = p.trace
        first = True
        batches = gen.batches()
        try:
            try:
                async for batch in batches:
                    if first:
                        first = False
                        trace.first_token()
                    trace.on_events(batch, output_tokens=gen.output_tokens)
                    events += batch
            except WorkerLostError as exc:
                log.warning("%s: %s", p.request_id, exc)
                reason = "error"
                raise OverloadedError(WORKER_LOST) from None
            finish = gen.finish
            reason = finish.reason if finish is not None else "abort"
            turn = TurnAccumulator().feed_all(events)
            body, response_id = p.surface.build(turn, p.request, self.ctx, p.model, gen.stop_sequence)
            await self._after(p, gen, events, response_id, body)
            return body
        finally:
            await batches.aclose()
            self._finished(p, gen, reason, events)

    def rejected(self, trace: RequestTelemetry, error: ApiError) -> None:
        """A request answered with an error status before (or instead of) streaming."""
        trace.rejected("client_error" if error.status < 500 else "server_error", error_code=error.code)


def prefill_trace(o: PrefillOutcome) -> PrefillTrace:
    """The trace's record of a prefill decision (seconds become milliseconds)."""
    plan = o.plan
    remote = plan.where == "remote"
    return PrefillTrace(
        where=plan.where,
        reason=plan.reason,
        outcome=o.outcome,
        uncached_tokens=plan.uncached_tokens,
        threshold=plan.threshold,
        local_ttft_ms=plan.local_ttft_s * 1000,
        local_stall_ms=plan.local_stall_s * 1000,
        prefill_worker=plan.prefill_worker,
        remote_ttft_ms=None if plan.remote_ttft_s is None else plan.remote_ttft_s * 1000,
        transfer_ms=plan.transfer_s * 1000 if remote else None,
        prefill_ms=None if o.prefill_s is None else o.prefill_s * 1000,
        received_tokens=o.received_tokens,
    )
