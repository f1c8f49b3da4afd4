"""TensorRT-LLM attention DP in the adapter (issue 15, item 3), on recorded payloads of the shape
TensorRT-LLM's `KVCacheEventSerializer.to_json_str` produces (tensorrt_llm/_utils.py): every event
has `event_id`, `data`, `window_size`, and `attention_dp_rank` when attention DP is on; each rank
numbers its own events from its own `created` (id 0) — tests/unittest/llmapi/
test_llm_kv_cache_events.py `test_llm_api_attention_dp_kv_events` asserts both. Requests are pinned
with `SchedulingParams(attention_dp_rank=…, attention_dp_relax=False)`
(tensorrt_llm/scheduling_params.py), as Dynamo's TensorRT-LLM handler does. Sources: docs/worker.md.
"""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from test_trtllm_engine_stand_in import FakeLLM, stand_in  # noqa: F401  (the fixture)

from agentserve.config import WorkerConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    GenerateRequest,
    InvalidRequestError,
    KvEvent,
    SamplingParams,
)
from agentserve.worker.engines.trtllm_mapping import (
    RankedKvTranslator,
    attention_dp_ranks,
    scheduling_kwargs,
)

pytestmark = pytest.mark.anyio

BS = 4
A = list(range(1, 9))  # two blocks
B = list(range(50, 58))


def _block(engine_hash: int, tokens: list[int]) -> dict[str, Any]:
    return {
        "type": "stored_block",
        "block_hash": engine_hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
        "cache_level": 0,
        "priority": 35,
    }


def _event(event_id: int, rank: int | None, data: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"event_id": event_id, "data": data, "window_size": 128}
    if rank is not None:  # the serializer adds the key only when the event has a rank
        event["attention_dp_rank"] = rank
    return event


def _created(event_id: int, rank: int | None) -> dict[str, Any]:
    return _event(event_id, rank, {"type": "created", "num_blocks_per_cache_level": [1000, 0]})


def _stored(event_id: int, rank: int | None, tokens: list[int], base: int) -> dict[str, Any]:
    blocks = [_block(base + i, tokens[i * BS : (i + 1) * BS]) for i in range(len(tokens) // BS)]
    return _event(event_id, rank, {"type": "stored", "parent_hash": None, "blocks": blocks})


def _removed(event_id: int, rank: int | None, engine_hashes: list[int]) -> dict[str, Any]:
    return _event(event_id, rank, {"type": "removed", "block_hashes": engine_hashes})


# Two ranks, interleaved as the gathered events of one poll arrive; the engine hashes of the two
# ranks may even coincide (each rank's KV cache manager names its own blocks).
RECORDED = [
    _created(0, 0),
    _created(0, 1),
    _stored(1, 0, A, 7000),
    _stored(1, 1, B, 7000),
    _stored(2, 1, A, 9000),
    _removed(3, 1, [7000, 7001]),
]


def test_attention_dp_size_is_the_tensor_parallel_size_when_enabled() -> None:
    assert attention_dp_ranks({"enable_attention_dp": True, "tensor_parallel_size": 4}) == 4
    assert attention_dp_ranks({"enable_attention_dp": False, "tensor_parallel_size": 4}) == 1
    assert attention_dp_ranks({"tensor_parallel_size": 8}) == 1


def test_each_rank_is_its_own_stream_numbered_and_snapshotted_apart() -> None:
    tr = RankedKvTranslator(BS, ranks=2)
    events: list[KvEvent] = tr.reset()
    for raw in RECORDED:
        events += tr.feed(raw)
    by_rank: dict[int | None, list[KvEvent]] = {0: [], 1: []}
    for e in events:
        by_rank[e.dp_rank].append(e)
    for rank, stream in by_rank.items():  # each rank numbered 1, 2, … on its own, starting cleared
        assert [e.seq for e in stream] == list(range(1, len(stream) + 1)), rank
        assert isinstance(stream[0], AllCleared)
    stored1 = [h for e in by_rank[1] if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored1 == block_hashes(B, BS) + block_hashes(A, BS)
    removed1 = [h for e in by_rank[1] if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed1 == block_hashes(B, BS)  # engine hashes 7000/7001 of rank 1 are B, not rank 0's A
    assert set(tr.snapshot(0).block_hashes) == set(block_hashes(A, BS)) and tr.snapshot(0).dp_rank == 0
    assert set(tr.snapshot(1).block_hashes) == set(block_hashes(A, BS)) and tr.snapshot(1).dp_rank == 1
    assert tr.snapshot(1).seq == by_rank[1][-1].seq
    assert tr.engine_gaps == 0  # per-rank event ids: no false gaps across ranks


def test_a_gap_in_one_rank_resyncs_that_rank_only() -> None:
    tr = RankedKvTranslator(BS, ranks=2)
    tr.reset()
    for raw in RECORDED[:4]:
        tr.feed(raw)
    out = tr.feed(_stored(5, 1, A, 9100))  # rank 1 lost ids 2..4 (its buffer overflowed)
    assert isinstance(out[0], AllCleared) and out[0].dp_rank == 1
    assert all(e.dp_rank == 1 for e in out) and tr.engine_gaps == 1
    assert set(tr.snapshot(0).block_hashes) == set(block_hashes(A, BS))  # rank 0 untouched
    assert set(tr.snapshot(1).block_hashes) == set(block_hashes(A, BS))  # rebuilt from the event


def test_rank_fields_missing_or_unknown() -> None:
    tr = RankedKvTranslator(BS, ranks=2)
    tr.reset()
    out = tr.feed(_stored(1, None, A, 1))  # no key: rank 0, as Dynamo's publisher reads it
    assert out and all(e.dp_rank == 0 for e in out)
    with pytest.raises(ValueError, match="rank 5"):
        tr.feed(_stored(1, 5, A, 1))
    single = RankedKvTranslator(BS)
    assert [e.dp_rank for e in single.reset()] == [None]
    assert single.feed(_stored(1, None, A, 1))[0].dp_rank is None
    assert single.snapshot().dp_rank is None


def test_pinning_only_with_ranks_and_never_relaxed() -> None:
    assert scheduling_kwargs(1, 2) == {"attention_dp_rank": 1, "attention_dp_relax": False}
    assert scheduling_kwargs(None, 2) is None and scheduling_kwargs(0, 1) is None
    with pytest.raises(ValueError):
        scheduling_kwargs(2, 2)


class FakeSchedulingParams:
    """tensorrt_llm/scheduling_params.py: a kw-only dataclass (attention_dp_rank, attention_dp_relax)."""

    def __init__(self, *, attention_dp_rank: int | None = None, attention_dp_relax: bool = True) -> None:
        self.attention_dp_rank = attention_dp_rank
        self.attention_dp_relax = attention_dp_relax


class DpLLM(FakeLLM):
    """The stand-in LLM with attention DP: each rank's events carry `attention_dp_rank`, each
    rank starts with its own `created` (id 0); a pinned request's blocks land on its rank."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.events.items = [_created(0, r) for r in range(kwargs["tensor_parallel_size"])]
        self.next_id = dict.fromkeys(range(kwargs["tensor_parallel_size"]), 1)

    def generate_async(self, prompt: list[int], sampling_params: Any, streaming: bool, **extra: Any) -> Any:
        pin = extra.get("scheduling_params")
        rank = pin.attention_dp_rank if pin is not None else 0
        before = len(self.events.items)
        result = super().generate_async(prompt, sampling_params, streaming, **extra)
        if len(self.events.items) > before:  # the base class queued a rank-less stored event
            raw = self.events.items.pop()
            raw["event_id"], raw["attention_dp_rank"] = self.next_id[rank], rank
            raw["window_size"] = 128  # the window of the `created` events above
            self.next_id[rank] += 1
            self.events.items.append(raw)
        return result


async def test_the_engine_pins_requests_and_publishes_per_rank(
    stand_in: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    module = types.ModuleType("tensorrt_llm.scheduling_params")
    module.SchedulingParams = FakeSchedulingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm.scheduling_params", module)
    monkeypatch.setattr(sys.modules["tensorrt_llm"], "LLM", DpLLM)
    options = tmp_path / "llm.yaml"
    options.write_text("enable_attention_dp: true\n")
    config = WorkerConfig(
        engine="trtllm",
        model_path="/m",
        block_size=BS,
        tensor_parallel_size=2,
        extra_llm_api_options=str(options),
    )
    engine = TrtLlmEngine(config)
    assert engine.dp_ranks == 2
    events: list[KvEvent] = []
    sub = engine.kv_events()

    async def collect() -> None:
        async for batch in sub:
            events.extend(batch)

    collector = asyncio.create_task(collect())
    await engine.start()
    llm = FakeLLM.instances[-1]
    prompt = [*A, 3]
    steps = [
        s
        async for s in engine.generate(GenerateRequest("p", prompt, SamplingParams(max_tokens=2), dp_rank=1))
    ]
    assert steps[-1].finish_reason == "length"
    pin = llm.extra["scheduling_params"]
    assert (pin.attention_dp_rank, pin.attention_dp_relax) == (1, False)
    [s async for s in engine.generate(GenerateRequest("q", B, SamplingParams(max_tokens=1)))]
    assert "scheduling_params" not in llm.extra  # unpinned: TensorRT-LLM balances
    with pytest.raises(InvalidRequestError):
        engine.generate(GenerateRequest("x", A, SamplingParams(max_tokens=1), dp_rank=2))
    for _ in range(200):
        if sum(isinstance(e, BlockStored) for e in events) >= 2:
            break
        await asyncio.sleep(0.01)
    on1 = {h for e in events if isinstance(e, BlockStored) and e.dp_rank == 1 for h in e.block_hashes}
    assert on1 == set(block_hashes(A, BS))
    assert set(engine.kv_snapshot(1).block_hashes) == set(block_hashes(A, BS))
    assert set(engine.kv_snapshot(0).block_hashes) == set(block_hashes(B, BS))
    with pytest.raises(InvalidRequestError):
        engine.kv_snapshot()  # an engine with ranks has no snapshot without one
    await engine.stop()
    await collector
