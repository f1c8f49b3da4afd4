"""The worker's HTTP edge: streaming generate, health, readiness, metrics, KV snapshot.

Routes:

- `POST /generate` — body and frames in `agentserve.worker.wire`; the response framing follows the
  `Accept` header. When the caller disconnects the engine request is aborted (unless
  `request_abort` is off, then it runs to completion unread).
- `POST /generate/mux` — many generate streams on one connection, a step's frames for all of them
  in one write (`agentserve.worker.mux`; the frontend's default transport).
- `GET /health` — the process is up (liveness). `GET /ready` — the model is loaded (503 before).
- `GET /metrics` — Prometheus text: running/waiting requests, KV usage, prefix hit rate, tokens/s.
- `POST /kv/pull` — `{"handle": …}`: a decode worker takes the KV a context-only request left held
  here (disaggregated prefill); `{"tokens": n}`, or 404 when nothing is held under that handle.
- `GET /kv/snapshot` — every stored block hash and the sequence number it reflects, for a KV event
  subscriber that saw a gap. `GET /load` — the engine's load as JSON. `GET /info` — model, engine,
  block size and the KV events endpoint.

Errors are JSON `{"error": {"type", "message"}}` with a 4xx/5xx status; no traceback leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, replace

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agentserve.asgi import error_response, json_exception_handlers, until_disconnect
from agentserve.drain import DrainState
from agentserve.eventloop import cancel_and_wait
from agentserve.worker.engine import (
    DuplicateRequestError,
    Engine,
    EngineError,
    EngineNotReadyError,
    InvalidRequestError,
    KvTransfer,
    StepStream,
)
from agentserve.worker.mux import PATH
from agentserve.worker.mux_service import MuxSession
from agentserve.worker.publisher import KvEventPublisher
from agentserve.worker.wire import (
    MEDIA_TYPES,
    Framing,
    WireError,
    decode_body,
    decode_request,
    encode_frame,
    error_frame,
    framing_for_accept,
    step_to_frame,
)

log = logging.getLogger("agentserve.worker")

MAX_BODY_BYTES = 64 * 1024 * 1024


async def _stream_steps(
    stream: StepStream, framing: Framing, request_id: str, *, abort: bool, receive: Receive, send: Send
) -> None:
    """Send one request's steps as frames. If the caller leaves, abort the engine request, or with
    `abort` off keep consuming it unsent until it finishes (one consumer per stream, always)."""
    finished = False
    gone = False

    async def watch() -> None:
        nonlocal gone
        await until_disconnect(receive)
        gone = True
        if abort and not finished:
            await stream.aclose()  # wakes the loop below with the end of the stream

    watcher = asyncio.ensure_future(watch())
    headers = [
        (b"content-type", MEDIA_TYPES[framing].encode()),
        (b"cache-control", b"no-store"),
        (b"x-request-id", request_id.encode()),
    ]
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for step in stream:
                if step.finish_reason is not None:
                    finished = True
                if gone:
                    continue
                body = encode_frame(framing, step_to_frame(step))
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except EngineError as exc:
            finished = True
            frame = encode_frame(framing, error_frame("engine_error", str(exc)))
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
        if not finished and abort:
            await stream.aclose()


class EngineCollector(Collector):
    """The worker's metrics, read from the engine's `load()` at scrape time."""

    def __init__(self, engine: Engine, model: str, publisher: KvEventPublisher | None, rate: Rate) -> None:
        self.engine = engine
        self.model = model
        self.publisher = publisher
        self.rate = rate

    def collect(self) -> Iterator[Metric]:
        load = self.engine.load()
        labels = ["model"]
        values = [self.model]
        p = "agentserve_worker_"

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(p + name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(p + name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("requests_running", "Requests in the running batch", load.running)
        yield gauge("requests_waiting", "Requests waiting for admission", load.waiting)
        yield gauge("kv_blocks_used", "KV blocks referenced by running requests", load.kv_blocks_used)
        yield gauge("kv_blocks_capacity", "KV blocks in the cache", load.kv_blocks_total)
        yield gauge("kv_blocks_cached", "Free KV blocks holding a reusable prefix", load.kv_blocks_cached)
        yield gauge(
            "kv_blocks_retained",
            "Free KV blocks kept above the default priority (sessions in a tool gap, the shared prefix)",
            load.kv_blocks_retained,
        )
        yield gauge(
            "kv_blocks_pinned",
            "Of the retained KV blocks, those kept without expiry (the shared system+tools prefix)",
            load.kv_blocks_pinned,
        )
        yield gauge("kv_host_blocks_used", "KV blocks in the host (CPU) tier", load.kv_host_blocks_used)
        yield gauge("kv_host_blocks_capacity", "KV blocks the host tier holds", load.kv_host_blocks_total)
        yield gauge("kv_usage_ratio", "Used KV blocks / total KV blocks", load.kv_usage)
        yield gauge("prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens", load.prefix_hit_rate)
        yield gauge(
            "generation_tokens_per_second", "Output tokens per second (last interval)", self.rate.value
        )
        yield counter("prompt_tokens", "Prompt tokens received", load.prompt_tokens)
        yield counter(
            "cached_prompt_tokens", "Prompt tokens served from the KV cache", load.cached_prompt_tokens
        )
        yield counter("generation_tokens", "Output tokens generated", load.generated_tokens)
        yield counter("requests_finished", "Requests that ran to completion", load.requests_finished)
        yield counter(
            "requests_aborted", "Requests aborted (caller gone or engine stop)", load.requests_aborted
        )
        yield counter("preemptions", "Requests preempted for KV space", load.preemptions)
        yield counter(
            "constrained_requests", "Requests with a constraint (tool_choice, strict, output schema)",
            load.constrained_requests,
        )  # fmt: skip
        if load.constraint_cpu_seconds is not None:
            yield counter(
                "constraint_cpu_seconds",
                "CPU seconds spent enforcing constraints: compiling grammars, steering under the mask "
                "(against process_cpu_seconds_total: the share of the worker's CPU they cost)",
                load.constraint_cpu_seconds,
            )
        if self.publisher is not None:
            yield counter("kv_events_published", "KV events published", self.publisher.events_published)


class Rate:
    """Output tokens per second over the last sampling interval."""

    def __init__(self) -> None:
        self.value = 0.0
        self._last: tuple[float, int] | None = None

    def sample(self, now: float, total: int) -> None:
        if self._last is not None and now > self._last[0]:
            self.value = (total - self._last[1]) / (now - self._last[0])
        self._last = (now, total)


def metrics_registry(
    engine: Engine, model: str, publisher: KvEventPublisher | None, rate: Rate
) -> CollectorRegistry:
    """What the worker's /metrics serves: the engine's metrics and the process's own
    (`process_cpu_seconds_total`: what the constraint CPU is a share of)."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    registry.register(EngineCollector(engine, model, publisher, rate))
    return registry


def create_app(
    engine: Engine,
    *,
    model: str = "agentserve-sim",
    engine_name: str = "sim",
    publisher: KvEventPublisher | None = None,
    request_abort: bool = True,
    rate_interval_s: float = 1.0,
    drain: DrainState | None = None,
    facts: Mapping[str, object] | None = None,
) -> ASGIApp:
    """The worker app; its lifespan starts the engine (in the background: /health answers while a
    real model loads) and the KV event publisher, and stops both. `facts` (scheduler limits, the
    sim's clock) go out on /info for clients that measure the engine (`agentserve profile`)."""
    rate = Rate()
    registry = metrics_registry(engine, model, publisher, rate)
    start_error: list[str] = []
    load_seconds: list[float] = []  # how long the engine took to start (model load), once started

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        if publisher is not None:
            # Subscribe before starting so the engine's first event (`cleared`) goes out too.
            tasks.append(asyncio.create_task(publisher.run(engine.kv_events()), name="kv-publisher"))

        async def start() -> None:
            began = time.monotonic()
            try:
                await engine.start()
                load_seconds.append(time.monotonic() - began)
            except Exception as exc:
                start_error.append(f"{type(exc).__name__}: {exc}")
                log.exception("engine failed to start")

        async def sample() -> None:
            while True:
                rate.sample(time.monotonic(), engine.load().generated_tokens)
                await asyncio.sleep(rate_interval_s)

        tasks.append(asyncio.create_task(start(), name="engine-start"))
        tasks.append(asyncio.create_task(sample(), name="rate-sampler"))
        try:
            yield
        finally:
            await engine.stop()
            await cancel_and_wait(tasks)
            if publisher is not None:
                publisher.close()

    async def generate(scope: Scope, receive: Receive, send: Send) -> None:
        """POST /generate, as raw ASGI: the hot path skips the framework's per-message wrappers."""
        response = await _generate(scope, receive, send)
        if response is not None:
            await response(scope, receive, send)

    async def _generate(scope: Scope, receive: Receive, send: Send) -> Response | None:
        if drain is not None and drain.draining:  # before any work: the router retries elsewhere
            return error_response(503, "not_ready", "the worker is draining (shutting down)")
        if not engine.ready:
            return error_response(503, "not_ready", start_error[0] if start_error else "the model is loading")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return error_response(413, "too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                return error_response(413, "too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
            if not message.get("more_body", False):
                break
        try:
            data = decode_body(headers.get("content-type"), bytes(body))
        except WireError as exc:
            return error_response(400, "invalid_request", str(exc))
        opened = open_stream(data)
        if len(opened) == 3:
            return error_response(*opened)
        stream, request_id = opened
        framing = framing_for_accept(headers.get("accept"))
        await _stream_steps(stream, framing, request_id, abort=request_abort, receive=receive, send=send)
        return None

    def open_stream(data: object) -> tuple[StepStream, str] | tuple[int, str, str]:
        """A decoded /generate body's engine stream and request id, or (status, kind, message)."""
        if drain is not None and drain.draining:
            return 503, "not_ready", "the worker is draining (shutting down)"
        if not engine.ready:
            return 503, "not_ready", start_error[0] if start_error else "the model is loading"
        try:
            req = decode_request(data)
        except WireError as exc:
            return 400, "invalid_request", str(exc)
        if not req.request_id:
            req = replace(req, request_id=uuid.uuid4().hex)
        try:
            return engine.generate(req), req.request_id
        except InvalidRequestError as exc:
            return 400, "invalid_request", str(exc)
        except DuplicateRequestError as exc:
            return 409, "duplicate_request", str(exc)
        except EngineNotReadyError as exc:
            return 503, "not_ready", str(exc)
        except EngineError as exc:
            return 500, "engine_error", str(exc)

    def open_mux(data: object) -> StepStream | tuple[int, str, str]:
        opened = open_stream(data)
        return opened if len(opened) == 3 else opened[0]

    async def generate_mux(scope: Scope, receive: Receive, send: Send) -> None:
        """POST /generate/mux: many streams on this connection (agentserve.worker.mux)."""
        if drain is not None and drain.draining:
            await error_response(503, "not_ready", "the worker is draining (shutting down)")(
                scope, receive, send
            )
            return
        await MuxSession(open_mux, send, abort=request_abort, drain=drain).run(receive)

    async def health(request: Request) -> Response:
        # An engine that knows it is dead (the TensorRT-LLM executor failed) fails liveness, so the
        # kubelet restarts the pod instead of leaving it out of rotation for ever.
        fatal = getattr(engine, "fatal_error", None)
        if fatal:
            return error_response(503, "engine_failed", str(fatal))
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if drain is not None and drain.draining:
            return error_response(503, "draining", "the worker is shutting down")
        if engine.ready:
            return JSONResponse({"status": "ready"})
        fatal = getattr(engine, "fatal_error", None)
        if fatal:
            return error_response(503, "engine_failed", str(fatal))
        if start_error:
            return error_response(503, "engine_failed", start_error[0])
        return error_response(503, "not_ready", "the model is loading")

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def kv_snapshot(request: Request) -> Response:
        raw_rank = request.query_params.get("dp_rank")
        try:
            if raw_rank is None:
                snap = engine.kv_snapshot()
            elif not raw_rank.isdigit() or len(raw_rank) > 6:
                return error_response(400, "invalid_request", "dp_rank must be a non-negative integer")
            else:
                snap = engine.kv_snapshot(int(raw_rank))
        except InvalidRequestError as exc:  # a rank this engine does not have, or none given
            return error_response(400, "invalid_request", str(exc))
        body: dict[str, object] = {
            "seq": snap.seq,
            "block_size": snap.block_size,
            "block_hashes": list(snap.block_hashes),
            "host_block_hashes": list(snap.host_block_hashes),
        }
        if snap.dp_rank is not None:
            body["dp_rank"] = snap.dp_rank
        return JSONResponse(body)

    async def load(request: Request) -> Response:
        return JSONResponse(asdict(engine.load()))

    async def kv_pull(request: Request) -> Response:
        pull = getattr(engine, "kv_pull", None)
        if pull is None:
            return error_response(404, "not_found", f"the {engine_name} engine holds no KV for pulls")
        try:
            data = json.loads(await request.body())
        except ValueError:
            return error_response(400, "invalid_request", "the body must be JSON")
        handle = data.get("handle") if isinstance(data, dict) else None
        if not isinstance(handle, str) or not handle or len(handle) > 512:
            return error_response(400, "invalid_request", "handle must be a non-empty string")
        tokens = await pull(KvTransfer(handle, 0))
        if tokens is None:
            return error_response(404, "not_found", f"no KV is held under {handle!r}")
        return JSONResponse({"tokens": tokens})

    async def info(request: Request) -> Response:
        return JSONResponse(
            {
                "model": model,
                "engine": engine_name,
                "block_size": engine.block_size,
                "kv_events_endpoint": publisher.endpoint if publisher is not None else None,
                "kv_events_topic": publisher.topic.decode() if publisher is not None else None,
                # Attention-DP ranks, each with its own KV event stream (topic `<topic>/<rank>`).
                "dp_ranks": getattr(engine, "dp_ranks", 1),
                "load_seconds": load_seconds[0] if load_seconds else None,
                **(facts or {}),
            }
        )

    async def generate_other(request: Request) -> Response:
        return error_response(405, "method_not_allowed", "use POST")

    app = Starlette(
        routes=[
            Route("/generate", generate_other, methods=["GET", "PUT", "DELETE", "PATCH"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/kv/snapshot", kv_snapshot, methods=["GET"]),
            Route("/kv/pull", kv_pull, methods=["POST"]),
            Route("/load", load, methods=["GET"]),
            Route("/info", info, methods=["GET"]),
        ],
        exception_handlers=json_exception_handlers(log),
        lifespan=lifespan,
    )

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            try:
                await generate_mux(scope, receive, send)
            except Exception:
                log.exception("generate/mux failed")
        elif scope["type"] == "http" and scope["path"] == "/generate" and scope["method"] == "POST":
            try:
                await generate(scope, receive, send)
            except Exception:  # never a traceback to the caller; a 500 if nothing was sent yet
                log.exception("generate failed")
                with contextlib.suppress(Exception):
                    await error_response(500, "internal_error", "internal error")(scope, receive, send)
        else:
            await app(scope, receive, send)

    return asgi
