"""`Telemetry`: the one object the frontend holds — trace sink, metrics and the tool-event join.

Per request the frontend asks for a `RequestTelemetry` and feeds it as the request goes (it wraps a
`TraceBuilder`); at `finished` / `rejected` the record goes to the sink and the metrics exactly once.
Tool events arrive through `submit_tool_events` (the HTTP endpoint) or the ZeroMQ listener, are
validated, joined to the dispatching request, counted, and written to the same sink.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agentserve.api.identity import AgentIdentity
from agentserve.config import ApiName, FrontendConfig
from agentserve.conversation import FinishReason, OutputEvent, Usage
from agentserve.prompt.drift import DriftReport
from agentserve.prompt.strip import BILLING_RULE
from agentserve.telemetry.metrics import FrontendMetrics
from agentserve.telemetry.sink import NullSink, TraceSink, open_sink
from agentserve.telemetry.tool_events import (
    DispatchIndex,
    ToolEvent,
    ToolEventError,
    ToolEventRecord,
    decode_tool_events,
    decode_zmq_message,
)
from agentserve.telemetry.trace import DispatchedCall, PrefillTrace, RejectedStatus, TraceBuilder, TraceRecord

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from prometheus_client import CollectorRegistry

    from agentserve.telemetry.listener import ToolEventListener


class RequestTelemetry:
    """One request's telemetry. Same methods as `TraceBuilder`; the end goes to sink and metrics."""

    __slots__ = ("_done", "_hub", "builder")

    def __init__(self, hub: Telemetry, builder: TraceBuilder) -> None:
        self._hub = hub
        self.builder = builder
        self._done = False

    def rendered(
        self,
        *,
        block_hashes: Sequence[int],
        block_size: int,
        input_length: int,
        stripped: Mapping[str, int] | None = None,
        drift: DriftReport | None = None,
        previous_prompt_tokens: int | None = None,
        t: float | None = None,
    ) -> None:
        self.builder.rendered(
            block_hashes=block_hashes,
            block_size=block_size,
            input_length=input_length,
            stripped=stripped,
            drift=drift,
            previous_prompt_tokens=previous_prompt_tokens,
            t=t,
        )

    def routed(
        self, worker: str, overlap_blocks: int, *, prompt_blocks: int | None = None, t: float | None = None
    ) -> None:
        self.builder.routed(worker, overlap_blocks, prompt_blocks=prompt_blocks, t=t)

    def prefill_started(self, t: float | None = None) -> None:
        self.builder.prefill_started(t)

    def prefill_placed(self, prefill: PrefillTrace) -> None:
        self.builder.prefill_placed(prefill)

    def migrated(self, from_worker: str, to_worker: str, resumed_tokens: int, gap_ms: float | None) -> None:
        self.builder.migrated(from_worker, to_worker, resumed_tokens, gap_ms)

    def first_token(self, t: float | None = None) -> None:
        self.builder.first_token(t)

    def on_event(
        self, event: OutputEvent, t: float | None = None, *, output_tokens: int | None = None
    ) -> DispatchedCall | None:
        dispatched = self.builder.on_event(event, t, output_tokens=output_tokens)
        if dispatched is not None:
            self._hub.dispatches.add(dispatched)
        return dispatched

    def on_events(
        self, events: Sequence[OutputEvent], t: float | None = None, *, output_tokens: int | None = None
    ) -> None:
        """One engine step's events (see `TraceBuilder.on_events`)."""
        for dispatched in self.builder.on_events(events, t, output_tokens=output_tokens):
            self._hub.dispatches.add(dispatched)

    def relabel(self, session_id: str) -> None:
        self.builder.relabel(session_id)

    def linked(self, session_id: str, parent_session_id: str, source: str) -> None:
        self.builder.linked(session_id, parent_session_id, source)

    def finished(self, usage: Usage, reason: FinishReason, t: float | None = None) -> TraceRecord:
        return self._complete(self.builder.finished(usage, reason, t))

    def rejected(
        self, status: RejectedStatus, t: float | None = None, *, error_code: str | None = None
    ) -> TraceRecord:
        return self._complete(self.builder.rejected(status, t, error_code=error_code))

    @property
    def done(self) -> bool:
        return self._done

    def __enter__(self) -> RequestTelemetry:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        # A request path that raised (or forgot to finish) still leaves in-flight and a record.
        if not self._done:
            self.rejected("server_error", error_code=None if exc_type is None else "internal_error")

    def _complete(self, record: TraceRecord) -> TraceRecord:
        if not self._done:  # finished after rejected (or twice) must not count twice
            self._done = True
            self._hub.metrics.request_finished(record)
            self._hub.sink.emit(record)
        return record


class Telemetry:
    def __init__(
        self,
        *,
        metrics: FrontendMetrics,
        sink: TraceSink | None = None,
        dispatches: DispatchIndex | None = None,
        replay_hashes: bool = True,
        tool_events_endpoint: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self._endpoint = tool_events_endpoint
        self.sink: TraceSink = sink if sink is not None else NullSink()
        self.dispatches = dispatches if dispatches is not None else DispatchIndex()
        self._replay_hashes = replay_hashes
        self._clock = clock
        self._wall_clock = wall_clock
        self._listener: ToolEventListener | None = None
        self.metrics.watch_sink(self.sink.stats)

    @classmethod
    def from_config(
        cls,
        config: FrontendConfig,
        *,
        served_models: Iterable[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> Telemetry:
        """Sink and metrics as configured. `served_models`: names (aliases) clients may send, each its
        own label value; `config.model` is always one. Call `start()` to bind the tool-event socket."""
        rules = [spec.partition("=")[0].strip() for spec in config.strip_pattern]
        if config.strip_anthropic_preamble:
            rules.append(BILLING_RULE)
        metrics = FrontendMetrics([config.model, *served_models], strip_rules=rules, registry=registry)
        sink = open_sink(
            config.trace_sink,
            rotate_bytes=config.trace_rotate_bytes,
            keep=config.trace_keep_files,
            compress=config.trace_gzip,
            queue_size=config.trace_queue_size,
        )
        return cls(
            metrics=metrics,
            sink=sink,
            replay_hashes=config.trace_replay_hashes,
            tool_events_endpoint=config.tool_events_zmq,
        )

    def start(self, endpoint: str | None = None) -> str | None:
        """Bind the ZeroMQ PULL socket for tool events (`endpoint`, else the configured one).
        Returns the bound endpoint, or None when none is configured."""
        endpoint = endpoint or self._endpoint
        if endpoint is None or self._listener is not None:
            return None if self._listener is None else self._listener.endpoint
        from agentserve.telemetry.listener import ToolEventListener  # pyzmq only when used

        listener = ToolEventListener(endpoint, self.submit_zmq_message)
        bound = listener.start()
        self._listener = listener
        return bound

    def close(self) -> None:
        """Stop the listener, then drain the sink (call at shutdown)."""
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        self.sink.close()

    # ------------------------------------------------------------------ requests

    def request(
        self,
        request_id: str,
        api: ApiName,
        model: str,
        *,
        identity: AgentIdentity | None = None,
        x_request_id: str | None = None,
        t: float | None = None,
    ) -> RequestTelemetry:
        """A request arrived: counted in flight until its `finished` or `rejected`."""
        builder = TraceBuilder(
            request_id,
            api,
            model,
            identity=identity,
            x_request_id=x_request_id,
            replay_hashes=self._replay_hashes,
            clock=self._clock,
            wall_clock=self._wall_clock,
        )
        builder.started(t)
        self.metrics.request_started(api, model)
        return RequestTelemetry(self, builder)

    # ------------------------------------------------------------------ tool events

    def submit_tool_events(self, body: bytes | str) -> list[ToolEventRecord]:
        """`POST /v1/agent/tool_events`: validate, join, record. Raises `ToolEventError` (answer 400
        with `error.openai_body()`); nothing of a rejected body is recorded."""
        try:
            events = decode_tool_events(body, received_unix_ms=self._wall_clock() * 1000.0)
        except ToolEventError:
            self.metrics.tool_event_rejected("http")
            raise
        return self._record(events)

    def submit_zmq_message(self, frames: list[bytes]) -> list[ToolEventRecord]:
        """One ZeroMQ message (the listener's handler). Invalid messages are counted, not raised:
        there is nobody to answer."""
        try:
            events = decode_zmq_message(frames, received_unix_ms=self._wall_clock() * 1000.0)
        except ToolEventError:
            self.metrics.tool_event_rejected("zmq")
            return []
        return self._record(events)

    def _record(self, events: list[ToolEvent]) -> list[ToolEventRecord]:
        records = self.dispatches.join_all(events)
        for record in records:
            self.metrics.tool_event(record)
            self.sink.emit(record)
        return records
