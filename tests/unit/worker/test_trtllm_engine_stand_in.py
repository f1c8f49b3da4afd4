"""The TensorRT-LLM adapter's I/O paths against a stand-in `tensorrt_llm` module that has the documented
LLM API shapes (reference/deploy.md §1.2–1.9). The real engine runs in test_trtllm_gpu.py on a GPU."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "prompt"))
from prompt_cases import FAMILY_NAMES, cases

from agentserve.api.options import GenerationOptions
from agentserve.config import WorkerConfig
from agentserve.conversation import ToolCallEnd
from agentserve.families import get_family
from agentserve.frontend.plan import engine_stops, sampling_params
from agentserve.parsing.stream import ParserOptions
from agentserve.prompt.hashing import block_hashes
from agentserve.prompt.tokenizer import embedded_tokenizer
from agentserve.worker.engine import AllCleared, BlockStored, Engine, GenerateRequest, KvEvent, SamplingParams

pytestmark = pytest.mark.anyio

BS = 4


class Completion:
    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.token_ids_diff: list[int] = []
        self.logprobs: list[dict[int, FakeLogprob]] = []  # the whole output's (result.py `logprobs`)
        self.text_diff = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | None = None


@dataclass(slots=True)
class FakeLogprob:
    """executor/result.py `Logprob`: a dataclass (logprob, rank); `TokenLogprobs` is one
    `dict[token id, Logprob]` per output token, the sampled token among the entries."""

    logprob: float
    rank: int | None = None


def _text(ids: list[int]) -> str:
    return "".join(chr(t) for t in ids)


Decode = Callable[[list[int]], str]


class Result:
    """A streaming `GenerationResult` (executor/result.py): yields itself, updated in place, once per
    executor response. Facts modelled (docs/worker.md, "TensorRT-LLM facts"):
    - a request beyond `max_batch_size` waits in the executor's queue; cancelling it there removes
      it with no response at all (py_executor.py `_handle_canceled_requests` →
      `update_waiting_queue`), so its iteration never ends;
    - cancelling a running request yields one last response, `finish_reason == "cancelled"`;
    - a stop token ends the sequence with `finish_reason == "stop"`, and unless
      `include_stop_str_in_output` it is trimmed from `token_ids` (result.py `_handle_sequence`).
    """

    def __init__(self, llm: FakeLLM, prompt: list[int], params: Any, cached: int) -> None:
        self.llm = llm
        self.prompt = prompt
        self.kwargs = params.kwargs
        self.max_tokens = params.kwargs["max_tokens"]
        self.outputs = [Completion()]
        self.finished = False
        if llm.has_cached_tokens:
            self.cached_tokens = cached
        self.aborted_flag = False
        self.running = asyncio.Event()
        self.script = list(llm.script) if llm.script is not None else None

    def abort(self) -> None:
        self.aborted_flag = True

    def __aiter__(self) -> AsyncIterator[Result]:
        return self._run()

    def _next_token(self, produced: int) -> int:
        if self.script is not None:
            return self.script[produced]
        return 65 + produced % 26

    async def _run(self) -> AsyncIterator[Result]:
        c = self.outputs[0]
        stops = set(self.kwargs.get("stop_token_ids") or ())
        produced: list[int] = []
        while not self.running.is_set():
            await asyncio.sleep(0)
            if self.aborted_flag:  # dropped from the queue: no response, ever
                await asyncio.Event().wait()
        try:
            while not self.finished:
                await asyncio.sleep(0)
                if self.aborted_flag:
                    c.token_ids_diff, c.text_diff, c.finish_reason = [], "", "cancelled"
                else:
                    token = self._next_token(len(produced))
                    produced.append(token)
                    before = len(c.token_ids)
                    c.token_ids = list(produced)
                    if token in stops:
                        c.finish_reason, c.stop_reason = "stop", token
                        if not self.kwargs.get("include_stop_str_in_output"):
                            c.token_ids = c.token_ids[:-1]
                    elif len(produced) == self.max_tokens:
                        c.finish_reason = "length"
                    c.token_ids_diff = c.token_ids[before:]
                    decode = self.llm.decode
                    c.text_diff = decode(c.token_ids)[len(decode(c.token_ids[:before])) :]
                    if self.kwargs.get("logprobs"):  # the sampled token (rank 2) and a likelier one
                        c.logprobs = [
                            {t + 1: FakeLogprob(-0.5, 1), t: FakeLogprob(-1.25, 2)} for t in c.token_ids
                        ]
                self.finished = c.finish_reason is not None
                yield self
        finally:
            self.llm.finished(self)


class FakeIterationResult:
    """executor/result.py `IterationResult`: ONE object per LLM for stats (and one for KV events);
    once a poll times out it stays done until `mark_undone()`; `aqueue.get(timeout=0)` on an empty
    queue raises `asyncio.QueueEmpty`, which `__anext__` does not catch (it catches TimeoutError)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._done = False
        self.timeout: float | None = None

    def mark_undone(self) -> None:
        self._done = False

    def __aiter__(self) -> FakeIterationResult:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        await asyncio.sleep(0)
        if self.items:
            return self.items.pop(0)
        if self.timeout == 0:
            raise asyncio.QueueEmpty
        self._done = True
        raise StopAsyncIteration


class FakeExecutor:
    def __init__(self) -> None:
        self.doing_shutdown = False
        self._fatal_error: Exception | None = None
        self.mpi_futures: list[asyncio.Future[None]] = []


class FakeLLM:
    instances: ClassVar[list[FakeLLM]] = []
    has_cached_tokens: ClassVar[bool] = True
    script: ClassVar[list[int] | None] = None
    decode: ClassVar[Decode] = staticmethod(_text)

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self.events = FakeIterationResult()
        self.events.items.append({"event_id": 0, "data": {"type": "created"}, "window_size": 64})
        self.stats = FakeIterationResult()
        self.seen: set[tuple[int, ...]] = set()
        self.results: list[Result] = []
        self.running: list[Result] = []
        self.queued: list[Result] = []
        self.shut = False
        self._executor = FakeExecutor()
        self.stats_served = 0
        self.salts: list[str | None] = []
        FakeLLM.instances.append(self)

    def generate_async(
        self, prompt: list[int], sampling_params: Any, streaming: bool, **extra: Any
    ) -> Result:
        assert streaming
        self.salts.append(extra.get("cache_salt"))
        self.extra = extra
        full = len(prompt) // BS
        key = tuple(prompt[: full * BS])
        cached = full * BS if key in self.seen else 0
        if key not in self.seen:
            self.seen.add(key)
            blocks = [
                {"block_hash": 10_000 + len(self.results) * 100 + i,
                 "tokens": [{"token_id": t, "token_extra_id": 0} for t in prompt[i * BS : (i + 1) * BS]],
                 "lora_id": None, "cache_level": 0, "priority": 35}
                for i in range(full)
            ]  # fmt: skip
            data = {"type": "stored", "parent_hash": None, "blocks": blocks}
            self.events.items.append({"event_id": len(self.results) + 1, "data": data, "window_size": 64})
        result = Result(self, prompt, sampling_params, cached)
        self.results.append(result)
        self.queued.append(result)
        self.stats.mark_undone()  # as GenerationExecutor.submit does
        self.events.mark_undone()
        self._schedule()
        return result

    def _schedule(self) -> None:
        while self.queued and len(self.running) < self.kwargs["max_batch_size"]:
            result = self.queued.pop(0)
            if result.aborted_flag:
                continue  # cancelled while queued: dropped without a response
            self.running.append(result)
            result.running.set()

    def finished(self, result: Result) -> None:
        if result in self.running:
            self.running.remove(result)
        self._schedule()

    def get_kv_cache_events_async(self, timeout: float) -> FakeIterationResult:
        self.events.timeout = timeout
        return self.events

    def get_stats_async(self, timeout: float) -> FakeIterationResult:
        self.stats.timeout = timeout
        self.stats_served += 1
        self.stats.items.append(
            {"numActiveRequests": len(self.running), "numQueuedRequests": len(self.queued),
             "kvCacheStats": {"maxNumBlocks": 500, "usedNumBlocks": 7 + self.stats_served}}
        )  # fmt: skip
        return self.stats

    def shutdown(self) -> None:
        self.shut = True


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FakeGuidedDecodingParams:
    """sampling_params.py: keyword-only, at most one guide set (`_validate`)."""

    def __init__(self, **kwargs: Any) -> None:
        assert set(kwargs) <= {"json", "regex", "grammar", "json_object", "structural_tag"}
        assert sum(bool(v) for v in kwargs.values()) <= 1
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
    sampling = types.ModuleType("tensorrt_llm.sampling_params")
    sampling.GuidedDecodingParams = FakeGuidedDecodingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm.sampling_params", sampling)
    FakeLLM.instances.clear()
    yield
    FakeLLM.has_cached_tokens, FakeLLM.script, FakeLLM.decode = True, None, staticmethod(_text)


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
    assert load.kv_blocks_total == 500 and load.kv_blocks_used > 7
    assert load.prompt_tokens == 2 * len(prompt) + 2 and load.cached_prompt_tokens == 3 * BS

    await engine.stop()
    assert llm.shut and not engine.ready
    await collector


async def _started(**settings: Any) -> tuple[Any, FakeLLM]:
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    engine = TrtLlmEngine(
        WorkerConfig(**{"engine": "trtllm", "model_path": "/m", "block_size": BS, **settings})
    )
    await engine.start()
    return engine, FakeLLM.instances[-1]


async def test_cancelling_a_queued_request_never_waits_for_a_response(stand_in: None) -> None:
    """max_batch_size 1: the second request waits in the executor's queue. Cancelled there, TensorRT-LLM
    sends nothing; its stream must still end (as an abort) within the grace, whether the consumer was
    already waiting for its next step or comes to read it later."""
    engine, llm = await _started(max_batch_size=1)
    engine.abort_grace_s = 0.05
    running = engine.generate(GenerateRequest("run", [1, 2, 3], SamplingParams(max_tokens=1000)))
    first = await running.__anext__()
    assert first.text == "A"

    waiting = engine.generate(GenerateRequest("wait", [4, 5, 6], SamplingParams(max_tokens=5)))
    pending = asyncio.ensure_future(waiting.__anext__())
    await asyncio.sleep(0.01)
    assert not pending.done()  # queued: no output yet
    assert engine.abort("wait")
    step = await asyncio.wait_for(pending, 1.0)
    assert step.finish_reason == "abort" and step.usage is not None and step.usage.output_tokens == 0
    assert llm.results[1].outputs[0].finish_reason is None  # TensorRT-LLM really sent nothing
    with pytest.raises(StopAsyncIteration):
        await waiting.__anext__()
    assert not engine.abort("wait")

    late = engine.generate(GenerateRequest("late", [7, 8], SamplingParams(max_tokens=5)))
    assert engine.abort("late")  # aborted before anyone reads it
    assert (await asyncio.wait_for(late.__anext__(), 1.0)).finish_reason == "abort"

    # A running request does get its final `cancelled` response (with what it generated so far).
    assert engine.abort("run")
    rest = [s async for s in running]
    assert rest[-1].finish_reason == "abort" and rest[-1].usage is not None
    assert llm.results[0].outputs[0].finish_reason == "cancelled"
    assert engine.load().requests_aborted == 3
    await engine.stop()


async def test_gauges_move_while_idle_and_an_empty_poll_is_quiet(
    stand_in: None, caplog: pytest.LogCaptureFixture
) -> None:
    """After the last request, stats keep flowing (the shared IterationResult is re-armed with
    `mark_undone()`), and the KV-event poll's `QueueEmpty` (timeout=0, idle) logs nothing."""
    engine, llm = await _started(max_batch_size=4)
    [s async for s in engine.generate(GenerateRequest("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=2)))]
    await asyncio.sleep(0.3)
    before = (llm.stats_served, engine.load().kv_blocks_used)
    await asyncio.sleep(0.5)
    after = (llm.stats_served, engine.load().kv_blocks_used)
    assert after[0] > before[0] and after[1] > before[1], (before, after)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
    await engine.stop()


async def test_a_result_without_cached_tokens_fails_loudly(stand_in: None) -> None:
    """A release whose results lack `cached_tokens` must not report zero cache hits forever."""
    from agentserve.worker.engine import EngineError, EngineNotReadyError

    FakeLLM.has_cached_tokens = False
    engine, _ = await _started(max_batch_size=4)
    stream = engine.generate(GenerateRequest("a", [1, 2, 3], SamplingParams(max_tokens=3)))
    with pytest.raises(EngineError, match="cached_tokens"):
        await stream.__anext__()
    assert not engine.ready and "cached_tokens" in (engine.fatal_error or "")
    with pytest.raises(EngineNotReadyError):
        engine.generate(GenerateRequest("b", [1, 2, 3], SamplingParams(max_tokens=3)))
    await engine.stop()


async def test_a_dead_executor_makes_the_engine_not_ready(stand_in: None) -> None:
    engine, llm = await _started(max_batch_size=4)
    assert engine.probe() and engine.ready
    llm._executor.doing_shutdown = True  # what the executor sets on a fatal error
    llm._executor._fatal_error = RuntimeError("CUDA error: an illegal memory access")
    assert not engine.probe() and not engine.ready
    assert "illegal memory access" in (engine.fatal_error or "")
    await engine.stop()


async def test_a_dead_mpi_worker_makes_the_engine_not_ready(stand_in: None) -> None:
    engine, llm = await _started(max_batch_size=4)
    dead: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    dead.set_result(None)
    llm._executor.mpi_futures = [dead]
    assert not engine.probe() and not engine.ready
    await engine.stop()


async def test_context_length_include_stop_and_cache_salt_reach_tensorrt_llm(stand_in: None) -> None:
    engine, llm = await _started(max_batch_size=4, max_seq_len=4096)
    assert llm.kwargs["max_seq_len"] == 4096
    salted = GenerateRequest("s", [1, 2], SamplingParams(max_tokens=1), cache_salt="tenant-a")
    [s async for s in engine.generate(salted)]
    assert llm.salts == ["tenant-a"]
    params = SamplingParams(max_tokens=3, stop_token_ids=(67,), include_stop=True)
    steps = [s async for s in engine.generate(GenerateRequest("a", [1, 2], params))]
    assert "".join(s.text for s in steps) == "ABC" and steps[-1].finish_reason == "stop"
    params = SamplingParams(max_tokens=3, stop_token_ids=(67,))
    steps = [s async for s in engine.generate(GenerateRequest("b", [1, 2], params))]
    assert "".join(s.text for s in steps) == "AB" and steps[-1].finish_reason == "stop"
    await engine.stop()


# --------------------------------------------------------------------------------------------------
# Family conformance: a tool-call turn ends at the family's call terminator. The stand-in emits the
# family's canonical call turn and then runs on (an invented tool result, a second call), as a model
# whose tokenizer EOS is not the call terminator does. With the stop tokens the frontend sends
# (`plan.engine_stops` of `Family.stop_tokens`), the stream must end exactly at the terminator, kept
# in the text, and parse to the one call. The same law on the sim, end to end through the SDKs:
# tests/integration/frontend/test_families.py.

RUN_ON = "The tool returned 18C. HALLUCINATED."


@pytest.mark.parametrize("name", FAMILY_NAMES)
async def test_a_call_turn_ends_at_the_family_terminator(stand_in: None, name: str) -> None:
    family = get_family(name)
    call = {c.name: c for c in cases(name)}["call"]
    tokenizer = embedded_tokenizer()
    assert any(call.raw.endswith(t) for t in family.stop_tokens), f"{name}: terminator not a stop token"
    FakeLLM.script = tokenizer.encode(call.raw + RUN_ON + call.raw)
    FakeLLM.decode = staticmethod(tokenizer.decode)
    engine, llm = await _started(max_batch_size=4)
    stops = engine_stops(family.stop_tokens, tokenizer.token_id)
    params = sampling_params(GenerationOptions(model="m"), 4096, stops)
    steps = [s async for s in engine.generate(GenerateRequest("t", [1, 2, 3], params))]
    text = "".join(s.text for s in steps)
    assert text == call.raw, name
    assert steps[-1].finish_reason == "stop"
    assert llm.results[0].kwargs["include_stop_str_in_output"] is True
    parser = family.parser(ParserOptions(starts_in_reasoning=family.starts_in_reasoning))
    events = parser.feed(text) + parser.close()
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(ends) == 1, (name, events)
    assert json.loads(ends[0].arguments) == json.loads(call.calls[0].arguments)
    await engine.stop()


async def test_adapter_passes_retention_per_request_and_the_host_pool(stand_in: None) -> None:
    from datetime import timedelta

    from agentserve.worker.engine import Retention, TokenRangeRetention
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    config = WorkerConfig(engine="trtllm", model_path="/m", block_size=BS, host_cache_size=1 << 30)
    engine = TrtLlmEngine(config)
    await engine.start()
    llm = FakeLLM.instances[-1]
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
    assert "kv_cache_retention_config" not in FakeLLM.instances[-1].extra
    await off.stop()


# --------------------------------------------------------------------------------------------------
# Constrained decoding: the constraint reaches TensorRT-LLM as per-request GuidedDecodingParams.


async def test_a_constraint_becomes_guided_decoding_params(stand_in: None) -> None:
    from agentserve.constraints.spec import Constraint
    from agentserve.worker.engine import InvalidRequestError

    engine, llm = await _started(max_batch_size=4)
    assert llm.kwargs["guided_decoding_backend"] == "llguidance"  # the worker's default
    constraint = Constraint('start: "ok"\n')
    params = SamplingParams(max_tokens=3, stop_token_ids=(67,), include_stop=True)
    [s async for s in engine.generate(GenerateRequest("g", [1, 2], params, constraint=constraint))]
    guide = llm.results[-1].kwargs["guided_decoding"].kwargs
    assert guide == {"grammar": 'start: agentserve_output (<[67]>)?\nagentserve_output: "ok"\n'}
    [s async for s in engine.generate(GenerateRequest("u", [1, 2], params))]
    assert "guided_decoding" not in llm.results[-1].kwargs  # unconstrained: nothing added
    await engine.stop()
    # No backend: the constrained request is refused, never served unconstrained.
    engine, llm = await _started(max_batch_size=4, guided_decoding_backend=None)
    assert "guided_decoding_backend" not in llm.kwargs
    with pytest.raises(InvalidRequestError, match="no guided_decoding_backend"):
        engine.generate(GenerateRequest("n", [1, 2], params, constraint=constraint))
    await engine.stop()


async def test_logprobs_and_logit_bias_reach_tensorrt_llm(stand_in: None, tmp_path: Path) -> None:
    from agentserve.worker.engine import InvalidRequestError, TokenLogprob

    engine, llm = await _started(max_batch_size=4)
    params = SamplingParams(max_tokens=3, logprobs=1)
    steps = [s async for s in engine.generate(GenerateRequest("l", [1, 2], params))]
    assert llm.results[-1].kwargs["logprobs"] == 1
    got = [e for s in steps for e in s.logprobs or ()]
    ids = [t for s in steps for t in s.token_ids]
    assert got == [TokenLogprob(t, -1.25, ((t + 1, -0.5),)) for t in ids]  # alternatives by rank
    zero = [
        s
        async for s in engine.generate(GenerateRequest("z", [1, 2], SamplingParams(max_tokens=2, logprobs=0)))
    ]
    assert llm.results[-1].kwargs["logprobs"] == 1  # TensorRT-LLM reads 0 as none
    assert all(e.top == () for s in zero for e in s.logprobs or ())
    [s async for s in engine.generate(GenerateRequest("n", [1, 2], SamplingParams(max_tokens=2)))]
    assert "logprobs" not in llm.results[-1].kwargs
    bias = SamplingParams(max_tokens=2, logit_bias=((3, -100.0),))
    with pytest.raises(InvalidRequestError, match="vocabulary size is unknown"):  # /m has no config.json
        engine.generate(GenerateRequest("b", [1, 2], bias))
    await engine.stop()
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 6}}))
    engine, llm = await _started(max_batch_size=4, model_path=str(tmp_path))
    engine._tensor = list  # the FP32 tensor, as a list (no torch here)
    [s async for s in engine.generate(GenerateRequest("b", [1, 2], bias))]
    assert llm.results[-1].kwargs["embedding_bias"] == [0.0, 0.0, 0.0, -100.0, 0.0, 0.0]
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        engine.generate(GenerateRequest("c", [1, 2], SamplingParams(max_tokens=2, logit_bias=((6, 1.0),))))
    await engine.stop()
