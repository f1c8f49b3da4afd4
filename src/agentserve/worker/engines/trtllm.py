"""The TensorRT-LLM engine: `tensorrt_llm.LLM` (PyTorch backend) behind the `Engine` protocol.

The only module that imports `tensorrt_llm`, and only when the engine starts (the import alone
takes seconds and needs CUDA). Everything that maps values lives in `trtllm_mapping` (pure,
unit-tested); this module does the I/O:

- `start()` builds `LLM(model, …, kv_cache_config=KvCacheConfig(enable_block_reuse=True,
  tokens_per_block=block_size, free_gpu_memory_fraction=…, event_buffer_max_size=…))` in a thread
  (loading takes minutes), merging the extra LLM-API options YAML.
- `generate()` calls `generate_async(prompt token ids, SamplingParams(max_tokens=…, …),
  streaming=True)` and streams `token_ids_diff`/`text_diff`; `cached_tokens` comes from the result.
- Closing a stream (or `abort()`) calls the result's `abort()`.
- Two background tasks poll `get_kv_cache_events_async()` (translated, then published to
  subscribers) and `get_stats_async()` (KV usage and queue depth for `load()`).

TensorRT-LLM's PyTorch LLM API has no per-request queue priority (FCFS only): `priority` is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from agentserve.config import WorkerConfig
from agentserve.worker.engine import (
    DuplicateRequestError,
    EngineError,
    EngineNotReadyError,
    GenerateRequest,
    InvalidRequestError,
    KvEvent,
    KvSnapshot,
    Load,
    Step,
)
from agentserve.worker.engines.trtllm_mapping import (
    KvEventTranslator,
    llm_kwargs,
    load_extra_options,
    load_from_stats,
    make_step,
    sampling_kwargs,
)
from agentserve.worker.engines.trtllm_retention import build_retention_config
from agentserve.worker.events import EventHub

log = logging.getLogger("agentserve.worker.trtllm")

_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.1


class _TrtStream:
    __slots__ = ("_done", "_engine", "_first", "_iter", "_prompt_tokens", "aborted", "request_id", "result")

    def __init__(self, engine: TrtLlmEngine, request_id: str, result: Any, prompt_tokens: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.result = result
        self._iter = result.__aiter__()
        self._prompt_tokens = prompt_tokens
        self._first = True
        self._done = False
        self.aborted = False

    def __aiter__(self) -> _TrtStream:
        return self

    async def __anext__(self) -> Step:
        if self._done:
            raise StopAsyncIteration
        try:
            out = await self._iter.__anext__()
        except StopAsyncIteration:
            self._finish()
            if self.aborted:
                return Step([], "", None, "abort", None)
            raise
        except Exception as exc:  # the executor failed this request
            self._finish()
            raise EngineError(f"TensorRT-LLM: {exc}") from exc
        completion = out.outputs[0]
        step = make_step(
            completion.token_ids_diff,
            completion.text_diff,
            finished=bool(out.finished),
            raw_finish_reason=completion.finish_reason,
            cached_tokens=getattr(out, "cached_tokens", 0),
            prompt_tokens=self._prompt_tokens,
            output_tokens=len(completion.token_ids),
            first=self._first,
            aborted=self.aborted,
        )
        self._first = False
        self._engine._count_step(step, self._prompt_tokens)
        if step.finish_reason is not None:
            self._finish()
        return step

    def abort(self) -> None:
        if not self._done and not self.aborted:
            self.aborted = True
            self._engine._aborted += 1
            self.result.abort()

    def _finish(self) -> None:
        self._done = True
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
        self._hub = EventHub()
        self._translator = KvEventTranslator(config.block_size, config.hash_seed)
        self._requests: dict[str, _TrtStream] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stats: dict[str, int] = {}
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._generated = 0
        self._finished = 0
        self._aborted = 0

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def ready(self) -> bool:
        return self._llm is not None

    async def start(self) -> None:
        if self._llm is not None:
            return
        kwargs = dict(self._kwargs)

        def build() -> tuple[Any, Any]:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.llmapi import KvCacheConfig, KvCacheRetentionConfig

            if self.config.kv_retention != "off":
                self._retention_cls = KvCacheRetentionConfig
            kwargs["kv_cache_config"] = KvCacheConfig(**kwargs["kv_cache_config"])
            model = kwargs.pop("model")
            return LLM(model, **kwargs), SamplingParams

        self._llm, self._sampling_cls = await asyncio.to_thread(build)
        self._hub.publish(self._translator.reset())
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._pump_events(), name="trtllm-kv-events"),
            loop.create_task(self._pump_stats(), name="trtllm-stats"),
        ]

    async def stop(self) -> None:
        for stream in list(self._requests.values()):
            stream.abort()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
        self._hub.close()

    def generate(self, request: GenerateRequest) -> _TrtStream:
        if self._llm is None:
            raise EngineNotReadyError("TensorRT-LLM is not loaded")
        if request.request_id in self._requests:
            raise DuplicateRequestError(f"request {request.request_id!r} is still running")
        prompt = list(request.prompt_token_ids)
        if not prompt:
            raise InvalidRequestError("the prompt has no tokens")
        try:
            params = self._sampling_cls(**sampling_kwargs(request.sampling))
            extra: dict[str, Any] = {}
            if request.retention is not None and self._retention_cls is not None:
                extra["kv_cache_retention_config"] = build_retention_config(
                    request.retention, self._retention_cls
                )
            result = self._llm.generate_async(prompt, sampling_params=params, streaming=True, **extra)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(str(exc)) from exc
        except RuntimeError as exc:  # "LLM is shutting down"
            raise EngineNotReadyError(str(exc)) from exc
        stream = _TrtStream(self, request.request_id, result, len(prompt))
        self._requests[request.request_id] = stream
        self._prompt_tokens += len(prompt)
        return stream

    def abort(self, request_id: str) -> bool:
        stream = self._requests.get(request_id)
        if stream is None:
            return False
        stream.abort()
        return True

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._hub.subscribe()

    def kv_snapshot(self) -> KvSnapshot:
        return self._translator.snapshot()

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
        )

    def _count_step(self, step: Step, prompt_tokens: int) -> None:
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
                async for raw in self._llm.get_kv_cache_events_async(timeout=0):
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
                async for raw in self._llm.get_stats_async(timeout=0.01):
                    got = True
                    self._stats.update(load_from_stats(raw))
            except Exception:
                log.exception("reading iteration stats failed")
            delay = _POLL_MIN_S * 2 if got else min(delay * 2, _POLL_MAX_S)
            await asyncio.sleep(delay)
