"""The TensorRT-LLM adapter's I/O paths against a stand-in `tensorrt_llm` module that has the documented
LLM API shapes (reference/deploy.md §1.2–1.9). The real engine runs in test_trtllm_gpu.py on a GPU."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import pytest

from agentserve.config import WorkerConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import AllCleared, BlockStored, Engine, GenerateRequest, KvEvent, SamplingParams

pytestmark = pytest.mark.anyio

BS = 4


class Completion:
    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.token_ids_diff: list[int] = []
        self.text_diff = ""
        self.finish_reason: str | None = None


class Result:
    """A streaming `RequestOutput`: yields itself, updated in place, once per token."""

    def __init__(self, prompt: list[int], params: Any, cached: int) -> None:
        self.prompt = prompt
        self.max_tokens = params.kwargs["max_tokens"]
        self.outputs = [Completion()]
        self.finished = False
        self.cached_tokens = cached
        self.aborted_flag = False

    def abort(self) -> None:
        self.aborted_flag = True

    def __aiter__(self) -> AsyncIterator[Result]:
        return self._run()

    async def _run(self) -> AsyncIterator[Result]:
        c = self.outputs[0]
        while not self.finished:
            await asyncio.sleep(0)
            if self.aborted_flag:
                c.token_ids_diff, c.text_diff, c.finish_reason = [], "", "cancelled"
            else:
                token = 65 + len(c.token_ids) % 26
                c.token_ids.append(token)
                c.token_ids_diff, c.text_diff = [token], chr(token)
                if len(c.token_ids) == self.max_tokens:
                    c.finish_reason = "length"
            self.finished = c.finish_reason is not None
            yield self


class FakeLLM:
    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self.events: list[dict[str, Any]] = [{"event_id": 0, "data": {"type": "created"}, "window_size": 64}]
        self.seen: set[tuple[int, ...]] = set()
        self.results: list[Result] = []
        self.shut = False
        FakeLLM.instances.append(self)

    def generate_async(
        self, prompt: list[int], sampling_params: Any, streaming: bool, **extra: Any
    ) -> Result:
        assert streaming
        self.extra = extra
        full = len(prompt) // BS
        key = tuple(prompt[: full * BS])
        cached = full * BS if key in self.seen else 0
        if key not in self.seen:
            self.seen.add(key)
            blocks = [
                {"block_hash": 10_000 + len(self.events) * 100 + i,
                 "tokens": [{"token_id": t, "token_extra_id": 0} for t in prompt[i * BS : (i + 1) * BS]],
                 "lora_id": None, "cache_level": 0, "priority": 35}
                for i in range(full)
            ]  # fmt: skip
            data = {"type": "stored", "parent_hash": None, "blocks": blocks}
            self.events.append({"event_id": len(self.events), "data": data, "window_size": 64})
        result = Result(prompt, sampling_params, cached)
        self.results.append(result)
        return result

    def get_kv_cache_events_async(self, timeout: float) -> AsyncIterator[dict[str, Any]]:
        async def drain() -> AsyncIterator[dict[str, Any]]:
            while self.events:
                yield self.events.pop(0)

        return drain()

    def get_stats_async(self, timeout: float) -> AsyncIterator[dict[str, Any]]:
        async def one() -> AsyncIterator[dict[str, Any]]:
            yield {"numActiveRequests": 1, "numQueuedRequests": 0,
                   "kvCacheStats": {"maxNumBlocks": 500, "usedNumBlocks": 7}}  # fmt: skip

        return one()

    def shutdown(self) -> None:
        self.shut = True


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FakeKvCacheConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FakeKvCacheRetentionConfig:
    """The binding's positional signature (token ranges, decode priority, decode duration)."""

    class TokenRangeRetentionConfig:
        def __init__(
            self, token_start: int, token_end: int | None, priority: int, duration_ms: Any = None
        ) -> None:
            self.args = (token_start, token_end, priority, duration_ms)

    def __init__(
        self, ranges: list[Any], decode_retention_priority: int = 35, decode_duration_ms: Any = None
    ) -> None:
        self.ranges = [r.args for r in ranges]
        self.decode = (decode_retention_priority, decode_duration_ms)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    trt = types.ModuleType("tensorrt_llm")
    trt.LLM = FakeLLM  # type: ignore[attr-defined]
    trt.SamplingParams = FakeSamplingParams  # type: ignore[attr-defined]
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.KvCacheConfig = FakeKvCacheConfig  # type: ignore[attr-defined]
    llmapi.KvCacheRetentionConfig = FakeKvCacheRetentionConfig  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm", trt)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    FakeLLM.instances.clear()
    yield


async def test_adapter_streams_reports_cache_hits_aborts_and_translates_events(stand_in: None) -> None:
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    engine = TrtLlmEngine(WorkerConfig(engine="trtllm", model_path="/m", block_size=BS, max_batch_size=8))
    assert isinstance(engine, Engine) and not engine.ready
    events: list[KvEvent] = []
    sub = engine.kv_events()

    async def collect() -> None:
        async for batch in sub:
            events.extend(batch)

    collector = asyncio.create_task(collect())
    await engine.start()
    llm = FakeLLM.instances[0]
    assert llm.model == "/m" and engine.ready
    kv = llm.kwargs["kv_cache_config"]
    assert isinstance(kv, FakeKvCacheConfig)
    assert kv.kwargs["enable_block_reuse"] and kv.kwargs["tokens_per_block"] == BS
    assert kv.kwargs["event_buffer_max_size"] > 0 and llm.kwargs["max_batch_size"] == 8

    prompt = list(range(1, 3 * BS + 2))
    steps = [s async for s in engine.generate(GenerateRequest("a", prompt, SamplingParams(max_tokens=5)))]
    assert "".join(s.text for s in steps) == "ABCDE"
    assert steps[0].cached_tokens == 0 and steps[-1].finish_reason == "length"
    assert llm.results[0].max_tokens == 5
    again = [s async for s in engine.generate(GenerateRequest("b", prompt, SamplingParams(max_tokens=2)))]
    assert again[0].cached_tokens == 3 * BS
    assert again[-1].usage is not None and again[-1].usage.cached_tokens == 3 * BS

    stream = engine.generate(GenerateRequest("c", [9, 9], SamplingParams(max_tokens=1000)))
    await stream.__anext__()
    await stream.aclose()
    assert llm.results[2].aborted_flag and engine.load().requests_aborted == 1
    assert not engine.abort("c")

    for _ in range(200):
        if any(isinstance(e, BlockStored) for e in events) and engine.load().kv_blocks_total:
            break
        await asyncio.sleep(0.01)
    assert isinstance(events[0], AllCleared)
    stored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == block_hashes(prompt, BS)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    load = engine.load()
    assert (load.kv_blocks_used, load.kv_blocks_total, load.running) == (7, 500, 1)
    assert load.prompt_tokens == 2 * len(prompt) + 2 and load.cached_prompt_tokens == 3 * BS

    await engine.stop()
    assert llm.shut and not engine.ready
    await collector


async def test_adapter_passes_retention_per_request_and_the_host_pool(stand_in: None) -> None:
    from datetime import timedelta

    from agentserve.worker.engine import Retention, TokenRangeRetention
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    config = WorkerConfig(engine="trtllm", model_path="/m", block_size=BS, host_cache_size=1 << 30)
    engine = TrtLlmEngine(config)
    await engine.start()
    llm = FakeLLM.instances[0]
    assert llm.kwargs["kv_cache_config"].kwargs["host_cache_size"] == 1 << 30
    retention = Retention(
        (TokenRangeRetention(0, 8, 90, None), TokenRangeRetention(8, None, 80, 1.5)), 80, 1.5
    )
    req = GenerateRequest("r", list(range(1, 20)), SamplingParams(max_tokens=1), retention=retention)
    [s async for s in engine.generate(req)]
    got = llm.extra["kv_cache_retention_config"]
    assert got.ranges == [(0, 8, 90, None), (8, None, 80, timedelta(milliseconds=1500))]
    assert got.decode == (80, timedelta(milliseconds=1500))
    [s async for s in engine.generate(GenerateRequest("p", [1, 2], SamplingParams(max_tokens=1)))]
    assert "kv_cache_retention_config" not in llm.extra
    await engine.stop()

    off = TrtLlmEngine(WorkerConfig(engine="trtllm", model_path="/m", block_size=BS, kv_retention="off"))
    await off.start()
    [
        s
        async for s in off.generate(
            GenerateRequest("q", list(range(1, 20)), SamplingParams(max_tokens=1), retention=retention)
        )
    ]
    assert "kv_cache_retention_config" not in FakeLLM.instances[1].extra
    await off.stop()
