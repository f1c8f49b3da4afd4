"""The request path, from a decoded request to bytes on the wire (design.md, steps 2–7).

    decode (surface) → identity + agent hints → prompt pipeline (strip, render, tokens, hashes)
    → context-length check → Backend.generate (router + worker) → steps → family parser
    → OutputEvents → the API's encoder → SSE frames or one JSON body
    → after the turn: call memory / response store, the session's drift detector, metrics

`Frontend` holds what lives as long as the process: the prompt pipeline, the backend, the signer,
the call memory, the response store, the drift detector and the metrics. HTTP specifics stay in
`app.py` and `http.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from agentserve.api.catalog import ModelFacts
from agentserve.api.errors import (
    ApiError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
)
from agentserve.api.identity import AgentIdentity
from agentserve.api.memory import CallMemory
from agentserve.api.request import DecodedRequest
from agentserve.api.responses import ResponseStore
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator
from agentserve.config import FrontendConfig
from agentserve.conversation import Finish, OutputEvent, ToolCallEnd, Usage
from agentserve.frontend.backend import Backend
from agentserve.frontend.generate import Generation
from agentserve.frontend.metrics import FrontendMetrics
from agentserve.frontend.models import served_models
from agentserve.frontend.plan import generation_hints, output_budget, route_request, sampling_params
from agentserve.frontend.surfaces import SURFACES, Context, StreamWriter, Surface, stream_response_id
from agentserve.parsing.stream import ParserOptions
from agentserve.prompt.drift import DriftDetector, DriftReport
from agentserve.prompt.pipeline import PromptPipeline, RenderedPrompt, render_prompt
from agentserve.prompt.template import PromptError
from agentserve.router.core import OverloadedError as RouterOverloadedError
from agentserve.router.dispatch import NoCapacityError, WorkerLostError
from agentserve.worker.engine import GenerateRequest
from agentserve.worker.engine import InvalidRequestError as EngineInvalidRequest

log = logging.getLogger("agentserve.frontend")

WORKER_LOST = "the worker serving this request failed; retry the request"


@dataclass(slots=True)
class Prepared:
    """A request that passed every check and is ready to dispatch."""

    surface: Surface
    request: DecodedRequest
    scope: str  # the caller's memory scope (a digest of its API key, or "")
    request_id: str
    identity: AgentIdentity
    prompt: RenderedPrompt
    max_tokens: int
    discard_output: bool  # Anthropic max_tokens 0: prefill only (a cache pre-warm)
    drift: DriftReport | None
    started_at: float

    @property
    def model(self) -> str:
        # The name the client asked for: the real APIs answer with the model the client named (or
        # its resolved snapshot); harnesses send their own names and some compare them.
        return self.request.options.model


class Frontend:
    def __init__(
        self,
        config: FrontendConfig,
        backend: Backend,
        pipeline: PromptPipeline,
        *,
        signer: Signer,
        metrics: FrontendMetrics | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.pipeline = pipeline
        self.metrics = metrics or FrontendMetrics()
        self.ctx = Context(
            signer=signer,
            memory=CallMemory(config.call_memory_turns),
            store=ResponseStore(config.response_store_size),
            dispatch=config.enable_streaming_tool_dispatch,
        )
        self.drift = DriftDetector(pipeline.tokenizer.decode)
        self.models: list[ModelFacts] = served_models(config, pipeline.family)
        self.context_window = self.models[0].context_window
        self._model_ids = frozenset(i for m in self.models for i in m.ids)

    # -- before dispatch ---------------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        if not self.config.accept_any_model and name not in self._model_ids:
            raise ModelNotFoundError(name)

    def render(self, request: DecodedRequest) -> RenderedPrompt:
        """The prompt exactly as the real request renders it (count_tokens uses this too)."""
        options = request.options
        try:
            return render_prompt(
                request.conversation,
                self.pipeline,
                enable_thinking=options.reasoning.enabled,
                template_kwargs=options.template_kwargs or None,
            )
        except PromptError as exc:
            raise InvalidRequestError(str(exc)) from None
        except RecursionError:
            raise InvalidRequestError("the request is nested too deeply to render") from None

    def prepare(
        self,
        surface: Surface,
        request: DecodedRequest,
        headers: Mapping[str, str],
        *,
        scope: str,
        request_id: str,
        started_at: float,
    ) -> Prepared:
        self.check_model(request.options.model)
        identity = request.agent_identity(headers)
        if request.ignored:
            log.debug(
                "%s %s: accepted and ignored %s", request_id, surface.name, ", ".join(request.ignored[:20])
            )
        prompt = self.render(request)
        requested = request.options.max_tokens
        max_tokens = output_budget(
            None if requested == 0 else requested, len(prompt.token_ids), self.context_window
        )
        for rule, count in prompt.stripped.items():
            if count:
                self.metrics.stripped.labels(rule).inc(count)
        drift = None
        if identity.session_id is not None:
            drift = self.drift.check(identity.session_id, prompt.token_ids)
            if drift is not None and drift.drifted:
                self.metrics.drift.labels(surface.name).inc()
                log.info(
                    "%s prefix drift in session %s: %s",
                    request_id,
                    identity.session_id,
                    drift.to_json(),
                )
        return Prepared(
            surface=surface,
            request=request,
            scope=scope,
            request_id=request_id,
            identity=identity,
            prompt=prompt,
            max_tokens=1 if requested == 0 else max_tokens,
            discard_output=requested == 0,
            drift=drift,
            started_at=started_at,
        )

    async def open(self, p: Prepared) -> Generation:
        """Route and open the request on a worker. Raises ApiError (no capacity: overloaded)."""
        request = p.request
        prompt = p.prompt
        generate = GenerateRequest(
            request_id=p.request_id,
            prompt_token_ids=prompt.token_ids,
            sampling=sampling_params(request.options, p.max_tokens),
            priority=request.nvext.agent_hints.priority or 0,
            hints=generation_hints(request.conversation),
        )
        route = route_request(request, prompt.block_hashes, len(prompt.token_ids), p.identity.session_id)
        try:
            stream = await self.backend.generate(generate, route)
        except (NoCapacityError, RouterOverloadedError) as exc:
            log.warning("%s: no capacity: %s", p.request_id, exc)
            raise OverloadedError("no worker can take the request now; retry shortly") from None
        except EngineInvalidRequest as exc:
            raise InvalidRequestError(str(exc)) from None
        parser = self.pipeline.family.parser(
            ParserOptions(starts_in_reasoning=prompt.starts_in_reasoning, tools=request.conversation.tools)
        )
        return Generation(
            stream,
            parser,
            prompt_tokens=len(prompt.token_ids),
            starts_in_reasoning=prompt.starts_in_reasoning,
            stops=request.options.stop,
            discard_output=p.discard_output,
            keep_token_ids=p.identity.session_id is not None,
        )

    # -- after the turn ----------------------------------------------------------------------------

    def _after(self, p: Prepared, gen: Generation, events: list[OutputEvent], response_id: str | None) -> int:
        """Remember the turn (call memory / response store / drift); returns the calls dispatched."""
        calls = sum(1 for e in events if type(e) is ToolCallEnd)
        finish = gen.finish
        if finish is None or finish.reason in ("abort", "error"):
            return calls
        if p.identity.session_id is not None:
            self.drift.remember(p.identity.session_id, p.prompt.token_ids, gen.generated)
        store = p.surface.name == "responses" and getattr(p.request, "store", False)
        if (calls or store) and response_id is not None:
            turn = TurnAccumulator().feed_all(events)
            p.surface.remember(p.request, turn, response_id, self.ctx, p.scope)
        return calls

    def _record(
        self, p: Prepared, status: str, gen: Generation | None, ttft: float | None, calls: int
    ) -> None:
        usage = gen.finish.usage if gen is not None and gen.finish is not None else Usage()
        self.metrics.finished(
            p.surface.name,
            status,
            seconds=time.perf_counter() - p.started_at,
            ttft=ttft,
            input_tokens=usage.input_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            tool_calls=calls,
        )

    # -- the two ways out --------------------------------------------------------------------------

    async def stream(self, p: Prepared, gen: Generation, writer: StreamWriter) -> AsyncIterator[bytes]:
        """The SSE frames of one request, one chunk per engine step."""
        status = "abort"  # until the stream ends on its own (a disconnect leaves it at this)
        ttft: float | None = None
        events: list[OutputEvent] = []
        calls = 0
        feed = writer.feed
        batches = gen.batches()
        try:
            yield writer.opening()
            try:
                async for batch in batches:
                    if ttft is None:
                        ttft = time.perf_counter() - p.started_at
                        head = writer.started(Usage(gen.prompt_tokens, 0, gen.cached_tokens))
                    else:
                        head = b""
                    events += batch
                    if batch and type(batch[-1]) is Finish:
                        finish = batch[-1]
                        assert isinstance(finish, Finish)
                        body = [feed(e) for e in batch[:-1]]
                        body.append(writer.finish(finish, gen.stop_sequence))
                        status = finish.reason
                    else:
                        body = [feed(e) for e in batch]
                    yield head + b"".join(body)
            except WorkerLostError as exc:
                log.warning("%s: %s", p.request_id, exc)
                status = "error"
                yield writer.error(OverloadedError(WORKER_LOST))
            except Exception:
                log.exception("%s: the stream failed", p.request_id)
                status = "error"
                yield writer.error(InternalError(f"internal error (request {p.request_id})"))
            calls = self._after(p, gen, events, stream_response_id(writer) or p.request_id)
        finally:
            await batches.aclose()
            self._record(p, status, gen, ttft, calls)

    async def complete(self, p: Prepared, gen: Generation) -> dict[str, object]:
        """The non-streaming body. Raises ApiError (the response gets the API's error status)."""
        events: list[OutputEvent] = []
        ttft: float | None = None
        status = "abort"
        calls = 0
        batches = gen.batches()
        try:
            try:
                async for batch in batches:
                    if ttft is None:
                        ttft = time.perf_counter() - p.started_at
                    events += batch
            except WorkerLostError as exc:
                log.warning("%s: %s", p.request_id, exc)
                status = "error"
                raise OverloadedError(WORKER_LOST) from None
            turn = TurnAccumulator().feed_all(events)
            finish = gen.finish
            status = finish.reason if finish is not None else "abort"
            try:
                body, response_id = p.surface.build(turn, p.request, self.ctx, p.model, gen.stop_sequence)
            except ApiError:
                status = "error" if status not in ("abort", "error") else status
                raise
            calls = self._after(p, gen, events, response_id)
            return body
        finally:
            await batches.aclose()
            self._record(p, status, gen, ttft, calls)

    def record_rejected(self, api: str, status: str, started_at: float) -> None:
        """A request answered with an error before it was dispatched."""
        surface = SURFACES[api]  # type: ignore[index]
        self.metrics.finished(surface.name, status, seconds=time.perf_counter() - started_at)
