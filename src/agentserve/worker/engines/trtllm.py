"""The TensorRT-LLM engine: `tensorrt_llm.LLM` (PyTorch backend) behind the `Engine` protocol.

The only module that imports `tensorrt_llm`, and only when the engine starts (the import alone
takes seconds and needs CUDA). Everything that maps values lives in `trtllm_mapping` (pure,
unit-tested); this module does the I/O:

- `start()` builds `LLM(model, …, kv_cache_config=KvCacheConfig(enable_block_reuse=True,
  tokens_per_block=block_size, free_gpu_memory_fraction=…, event_buffer_max_size=…))` in a thread
  (loading takes minutes), merging the extra LLM-API options YAML.
- `generate()` calls `generate_async(prompt token ids, SamplingParams(max_tokens=…, …),
  streaming=True)` and streams `token_ids_diff`/`text_diff`; `cached_tokens` comes from the result.
  A missing `cached_tokens` (an older release) is a fatal error, never a silent 0.
- Closing a stream (or `abort()`) calls the result's `abort()`, then waits at most
  `ABORT_GRACE_S` for the final `cancelled` response: a request still in the executor's queue is
  dropped without one, so the stream ends as `abort` either way.
- Background tasks poll `get_kv_cache_events_async()` (translated, then published to
  subscribers) and `get_stats_async()` (KV usage and queue depth for `load()`), re-arming the
  shared `IterationResult` each time; a third probes the executor's health (`ready` turns false
  and `fatal_error` is set when it dies).

TensorRT-LLM's PyTorch LLM API has no per-request queue priority (FCFS only): `priority` is ignored.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentserve.config import WorkerConfig
from agentserve.conversation import Usage
from agentserve.eventloop import cancel_and_wait
from agentserve.worker.engine import (
    DuplicateRequestError,
    EngineError,
    EngineNotReadyError,
    GenerateRequest,
    InvalidRequestError,
    KvEvent,
    KvSnapshot,
    KvTransfer,
    Load,
    Step,
)
from agentserve.worker.engines.trtllm_disagg import context_only_params, generation_only_params, handle_of
from agentserve.worker.engines.trtllm_mapping import (
    MissingFieldError,
    RankedKvTranslator,
    attention_dp_ranks,
    cached_tokens_of,
    clamp_cached,
    embedding_bias,
    guided_decoding_kwargs,
    llm_kwargs,
    load_extra_options,
    load_from_stats,
    make_step,
    model_vocab_size,
    sampling_kwargs,
    scheduling_kwargs,
    step_logprobs,
)
from agentserve.worker.engines.trtllm_retention import build_retention_config
from agentserve.worker.events import EventHub

log = logging.getLogger("agentserve.worker.trtllm")

_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.1
# How long an aborted request may take to deliver its final `cancelled` response (a running one
# answers within an iteration; a queued one never does).
ABORT_GRACE_S = 2.0
# The stats poll's wait: iteration stats arrive one per iteration (tens of ms) while requests run.
_STATS_TIMEOUT_S = 0.05
# Consecutive requests failed by the executor (not by their input) after which the engine is dead.
FATAL_AFTER_FAILURES = 3


class _TrtStream:
    __slots__ = (
        "_cached",
        "_context_only",
        "_done",
        "_engine",
        "_expired",
        "_fallback",
        "_first",
        "_iter",
        "_logprobs",
        "_output_tokens",
        "_prompt_tokens",
        "_reader",
        "_received",
        "_timer",
        "aborted",
        "request_id",
        "result",
    )

    def __init__(
        self,
        engine: TrtLlmEngine,
        request_id: str,
        result: Any,
        prompt_tokens: int,
        logprobs: int | None = None,
        *,
        context_only: bool = False,
        received: int | None = None,
        fallback: Callable[[], Any] | None = None,
    ) -> None:
        self._engine = engine
        self._logprobs = logprobs  # alternatives per token asked for (None: no log-probabilities)
        # Disaggregated prefill: name the held KV on the last step (a prefill worker's request), or
        # say on the first step how many prompt tokens arrived (a decode worker's).
        self._context_only = context_only
        self._received = received
        # A generation-only request whose KV never arrives (the transfer failed or timed out) fails
        # before its first token: it is submitted again without the params and prefilled here.
        self._fallback = fallback
        self.request_id = request_id
        self.result = result
        self._iter = result.__aiter__()
        self._prompt_tokens = prompt_tokens
        self._output_tokens = 0
        self._cached = 0
        self._first = True
        self._done = False
        self.aborted = False
        self._expired = False  # the abort grace ran out with no final response
        self._reader: asyncio.Task[Any] | None = None  # the task waiting in __anext__, if one is
        self._timer: asyncio.TimerHandle | None = None

    def __aiter__(self) -> _TrtStream:
        return self

    async def __anext__(self) -> Step:
        if self._done:
            raise StopAsyncIteration
        if self._expired:
            return self._final_abort()
        # Read the next output directly (no task per step); `_expire` cancels this read if an aborted
        # request's final response does not come within the grace.
        task = self._reader = asyncio.current_task()
        try:
            out = await self._iter.__anext__()
        except asyncio.CancelledError:
            if self._expired and task is not None and task.uncancel() == 0:
                # Aborted, and no final response within the grace: TensorRT-LLM drops a cancelled
                # request that is still queued without one (PyExecutor._handle_canceled_requests).
                return self._final_abort()
            raise
        except StopAsyncIteration:
            if self.aborted:
                return self._final_abort()
            self._finish()
            raise
        except Exception as exc:  # the executor failed this request (or itself)
            if self._fallback is not None and self._first and not self.aborted:
                log.warning("request %s: the KV transfer failed (%s); prefilling here", self.request_id, exc)
                self.result, self._fallback = self._fallback(), None
                self._iter = self.result.__aiter__()
                self._received = 0
                return await self.__anext__()
            self._finish()
            self._engine._request_failed(exc)
            raise EngineError(f"TensorRT-LLM: {exc}") from exc
        finally:
            self._reader = None
        completion = out.outputs[0]
        try:
            if self._first:
                self._cached = cached_tokens_of(out)
        except MissingFieldError as exc:  # the wrong release: every request would misreport
            self._finish()
            self._engine._fail(str(exc))
            raise EngineError(str(exc)) from exc
        self._output_tokens = len(completion.token_ids)
        logprobs = None
        if self._logprobs is not None:
            try:
                logprobs = step_logprobs(
                    completion.token_ids, completion.token_ids_diff, completion.logprobs, self._logprobs
                )
            except MissingFieldError as exc:
                self._finish()
                raise EngineError(str(exc)) from exc
        step = make_step(
            completion.token_ids_diff,
            completion.text_diff,
            finished=bool(out.finished),
            raw_finish_reason=completion.finish_reason,
            cached_tokens=self._cached,
            prompt_tokens=self._prompt_tokens,
            output_tokens=self._output_tokens,
            first=self._first,
            aborted=self.aborted,
            logprobs=logprobs,
        )
        if self._first and self._received is not None:
            step = replace(step, received_tokens=self._received)
        if self._context_only and step.finish_reason is not None and not self.aborted:
            try:
                handle = handle_of(getattr(self.result, "disaggregated_params", None))
                step = replace(step, kv_transfer=KvTransfer(handle, self._prompt_tokens))
            except InvalidRequestError as exc:  # no KV to ship: the dispatcher prefills locally
                log.warning("context-only request %s: %s", self.request_id, exc)
        self._first = False
        self._engine._count_step(step, self._prompt_tokens)
        if step.finish_reason is not None:
            self._finish()
        return step

    def _final_abort(self) -> Step:
        self._finish()
        usage = Usage(
            self._prompt_tokens, self._output_tokens, clamp_cached(self._cached, self._prompt_tokens)
        )
        return Step([], "", 0 if self._first else None, "abort", usage)

    def abort(self) -> None:
        if self._done or self.aborted:
            return
        self.aborted = True
        self._engine._aborted += 1
        self.result.abort()
        # A running request answers with a final `cancelled` response; a queued one never does.
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._engine.abort_grace_s, self._expire)

    def _expire(self) -> None:
        self._expired = True
        if self._reader is not None:
            self._reader.cancel()

    def _finish(self) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._engine._requests.pop(self.request_id, None)

    async def aclose(self) -> None:
        if not self._done:
            self.abort()
            self._finish()


class TrtLlmEngine:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._kwargs = llm_kwargs(config, load_extra_options(config.extra_llm_api_options))
        self._llm: Any = None
        self._sampling_cls: Any = None
        self._retention_cls: Any = None  # KvCacheRetentionConfig, unless --kv-retention off
        self._scheduling_cls: Any = None  # SchedulingParams, with attention DP
        self._disagg_cls: Any = None  # DisaggregatedParams, on a prefill or decode worker
        self._guided_cls: Any = None  # GuidedDecodingParams
        self._tensor: Callable[[list[float]], Any] = _fp32_tensor  # logit_bias as `embedding_bias`
        self.vocab_size = _vocab_size(config.model_path)
        self._hub = EventHub()
        # Attention DP: one KV event stream and snapshot per rank, requests pinned to a rank.
        self.dp_ranks = attention_dp_ranks(self._kwargs)
        self._translator = RankedKvTranslator(config.block_size, config.hash_seed, self.dp_ranks)
        self._requests: dict[str, _TrtStream] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stats: dict[str, int] = {}
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._generated = 0
        self._finished = 0
        self._aborted = 0
        self._constrained = 0  # requests sent with GuidedDecodingParams
        self.abort_grace_s = ABORT_GRACE_S
        self.fatal_error: str | None = None  # the executor died: not ready, /health fails
        self._failures = 0

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def ready(self) -> bool:
        return self._llm is not None and self.fatal_error is None

    def _request_failed(self, exc: BaseException) -> None:
        """A request ended in an executor error. PyExecutor._handle_errors fails every active request
        with the same error when the executor itself fails; a few in a row with no success between
        mean the engine is dead (no per-request input error reaches this path: those raise from
        `generate_async`)."""
        self._failures += 1
        if self._failures >= FATAL_AFTER_FAILURES and self.fatal_error is None:
            self._fail(f"the executor failed {self._failures} requests in a row: {exc}")

    def _fail(self, reason: str) -> None:
        log.error("TensorRT-LLM engine is dead: %s", reason)
        self.fatal_error = reason

    def probe(self) -> bool:
        """The cheap periodic health probe: the executor has not shut down or died underneath us."""
        if self._llm is None or self.fatal_error is not None:
            return self.fatal_error is None
        executor = getattr(self._llm, "_executor", None)
        if executor is None:
            self._fail("the LLM has no executor")
        elif getattr(executor, "doing_shutdown", False):  # also set on a fatal executor error
            self._fail(
                f"the executor shut down: {getattr(executor, '_fatal_error', None) or 'no error given'}"
            )
        elif any(f.done() for f in getattr(executor, "mpi_futures", None) or ()):
            self._fail("an MPI worker process of the executor exited")
        return self.fatal_error is None

    async def start(self) -> None:
        if self._llm is not None:
            return
        kwargs = dict(self._kwargs)

        def build() -> tuple[Any, Any]:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.llmapi import KvCacheConfig, KvCacheRetentionConfig
            from tensorrt_llm.sampling_params import GuidedDecodingParams

            self._guided_cls = GuidedDecodingParams
            if self.config.kv_retention != "off":
                self._retention_cls = KvCacheRetentionConfig
            if self.dp_ranks > 1:
                from tensorrt_llm.scheduling_params import SchedulingParams

                self._scheduling_cls = SchedulingParams
            if isinstance(kwargs.get("cache_transceiver_config"), dict):  # a prefill or decode worker
                from tensorrt_llm.disaggregated_params import DisaggregatedParams
                from tensorrt_llm.llmapi.llm_args import CacheTransceiverConfig

                self._disagg_cls = DisaggregatedParams
                kwargs["cache_transceiver_config"] = CacheTransceiverConfig(
                    **kwargs["cache_transceiver_config"]
                )
            kwargs["kv_cache_config"] = KvCacheConfig(**kwargs["kv_cache_config"])
            model = kwargs.pop("model")
            return LLM(model, **kwargs), SamplingParams

        self._llm, self._sampling_cls = await asyncio.to_thread(build)
        self._hub.publish(self._translator.reset())
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._pump_events(), name="trtllm-kv-events"),
            loop.create_task(self._pump_stats(), name="trtllm-stats"),
            loop.create_task(self._watch(), name="trtllm-health"),
        ]

    async def stop(self) -> None:
        for stream in list(self._requests.values()):
            stream.abort()
        await cancel_and_wait(self._tasks)
        self._tasks = []
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
        self._hub.close()

    def generate(self, request: GenerateRequest) -> _TrtStream:
        if self._llm is None:
            raise EngineNotReadyError("TensorRT-LLM is not loaded")
        if self.fatal_error is not None:
            raise EngineNotReadyError(f"TensorRT-LLM failed: {self.fatal_error}")
        if request.request_id in self._requests:
            raise DuplicateRequestError(f"request {request.request_id!r} is still running")
        prompt = list(request.prompt_token_ids)
        if not prompt:
            raise InvalidRequestError("the prompt has no tokens")
        try:
            kwargs = sampling_kwargs(request.sampling)
            if request.sampling.logit_bias:  # the PyTorch sampler adds `embedding_bias` to the logits
                values = embedding_bias(request.sampling.logit_bias, self.vocab_size)
                kwargs["embedding_bias"] = self._tensor(values)
            if request.constraint is not None:  # refused (never dropped) when it cannot be enforced
                guide = guided_decoding_kwargs(
                    request.constraint,
                    request.sampling.stop_token_ids,
                    self._kwargs.get("guided_decoding_backend"),
                )
                kwargs["guided_decoding"] = self._guided_cls(**guide)
                self._constrained += 1
            params = self._sampling_cls(**kwargs)
            extra: dict[str, Any] = {}
            if request.cache_salt is not None:  # only when set: older releases lack the argument
                extra["cache_salt"] = request.cache_salt
            if request.retention is not None and self._retention_cls is not None:
                extra["kv_cache_retention_config"] = build_retention_config(
                    request.retention, self._retention_cls
                )
            pin = scheduling_kwargs(request.dp_rank, self.dp_ranks)
            if pin is not None:  # the router's rank, where this prompt's prefix is cached
                extra["scheduling_params"] = self._scheduling_cls(**pin)
            context_only, received = self._disaggregated(request, extra)
            result = self._llm.generate_async(
                prompt, sampling_params=params, streaming=not context_only, **extra
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(str(exc)) from exc
        except RuntimeError as exc:  # "LLM is shutting down", or the executor died
            self._fail(f"generate_async: {exc}")
            raise EngineNotReadyError(str(exc)) from exc
        fallback = None
        if "disaggregated_params" in extra and not context_only:
            local = {k: v for k, v in extra.items() if k != "disaggregated_params"}
            llm = self._llm

            def fallback() -> Any:
                return llm.generate_async(prompt, sampling_params=params, streaming=True, **local)

        stream = _TrtStream(
            self,
            request.request_id,
            result,
            len(prompt),
            request.sampling.logprobs,
            context_only=context_only,
            received=received,
            fallback=fallback,
        )
        self._requests[request.request_id] = stream
        self._prompt_tokens += len(prompt)
        return stream

    def _disaggregated(self, request: GenerateRequest, extra: dict[str, Any]) -> tuple[bool, int | None]:
        """Add `disaggregated_params` for a context-only or generation-only request (trtllm_disagg.py):
        (context only, prompt tokens whose KV arrives (0: prefilled here after all)). A worker without
        the cache transceiver (role both), or a handle that is not TensorRT-LLM's, serves the request
        aggregated: the dispatcher falls back as it does for a failed transfer."""
        transfer = request.kv_transfer
        if self._disagg_cls is None:
            return False, (0 if transfer is not None else None)
        if request.context_only:
            extra["disaggregated_params"] = self._disagg_cls(**context_only_params())
            return True, None
        if transfer is None:
            return False, None
        try:
            params = generation_only_params(transfer.handle)
        except InvalidRequestError as exc:
            log.warning("request %s: %s; prefilling it here", request.request_id, exc)
            return False, 0
        extra["disaggregated_params"] = self._disagg_cls(**params)
        return False, transfer.tokens

    def abort(self, request_id: str) -> bool:
        stream = self._requests.get(request_id)
        if stream is None:
            return False
        stream.abort()
        return True

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._hub.subscribe()

    def kv_snapshot(self, dp_rank: int | None = None) -> KvSnapshot:
        try:
            return self._translator.snapshot(dp_rank)
        except KeyError:
            raise InvalidRequestError(
                f"no KV snapshot for attention-DP rank {dp_rank} (this engine has {self.dp_ranks})"
            ) from None

    def load(self) -> Load:
        s = self._stats
        return Load(
            running=s.get("running", len(self._requests)),
            waiting=s.get("waiting", 0),
            kv_blocks_used=s.get("kv_blocks_used", 0),
            kv_blocks_total=s.get("kv_blocks_total", 0),
            prompt_tokens=self._prompt_tokens,
            cached_prompt_tokens=self._cached_tokens,
            generated_tokens=self._generated,
            requests_finished=self._finished,
            requests_aborted=self._aborted,
            constrained_requests=self._constrained,
        )

    def _count_step(self, step: Step, prompt_tokens: int) -> None:
        self._failures = 0
        self._generated += len(step.token_ids)
        if step.cached_tokens is not None:
            self._cached_tokens += step.cached_tokens
        if step.finish_reason is not None and step.finish_reason != "abort":
            self._finished += 1

    async def _pump_events(self) -> None:
        delay = _POLL_MIN_S
        while True:
            got = False
            try:
                async for raw in _poll(self._llm.get_kv_cache_events_async(timeout=0)):
                    got = True
                    self._hub.publish(self._translator.feed(raw))
            except Exception:
                log.exception("reading KV cache events failed")
            delay = _POLL_MIN_S if got else min(delay * 1.5, _POLL_MAX_S)
            await asyncio.sleep(delay)

    async def _pump_stats(self) -> None:
        delay = _POLL_MIN_S * 2
        while True:
            got = False
            try:
                async for raw in _poll(self._llm.get_stats_async(timeout=_STATS_TIMEOUT_S)):
                    got = True
                    self._stats.update(load_from_stats(raw))
            except Exception:
                log.exception("reading iteration stats failed")
            delay = _POLL_MIN_S * 2 if got else min(delay * 2, _POLL_MAX_S)
            await asyncio.sleep(delay)

    async def _watch(self) -> None:
        while self.probe():
            await asyncio.sleep(_POLL_MAX_S * 10)


async def _poll(source: Any) -> AsyncIterator[Any]:
    """What one poll of `get_kv_cache_events_async` / `get_stats_async` holds, quietly empty when
    there is nothing. Both hand out one shared `IterationResult` per LLM (executor.py): after a
    poll times out it stays `_done` until `mark_undone()`, which TensorRT-LLM itself calls only
    when a request is submitted, so without it the gauges freeze between requests. An empty queue
    with `timeout=0` raises `asyncio.QueueEmpty` (result.py `IterationResult.__anext__` catches
    only `TimeoutError`): that is the normal idle case, not an error."""
    mark_undone = getattr(source, "mark_undone", None)
    if mark_undone is not None:
        mark_undone()
    iterator = source.__aiter__()
    while True:
        try:
            item = await iterator.__anext__()
        except (StopAsyncIteration, asyncio.QueueEmpty):
            return
        yield item


def _fp32_tensor(values: list[float]) -> Any:
    import torch  # the GPU image's (TensorRT-LLM's dependency), needed only for a logit_bias

    return torch.tensor(values, dtype=torch.float32)


def _vocab_size(model_path: str | None) -> int | None:
    """The model's logits width (its `config.json`), which `embedding_bias` must match."""
    if model_path is None:
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return model_vocab_size(config) if isinstance(config, dict) else None
