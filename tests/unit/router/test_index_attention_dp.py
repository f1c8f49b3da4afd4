"""Attention data parallelism in the router: the index keys blocks by (worker, rank), placement picks
a rank, the decision and the dispatched request carry it (issue 15, item 3).

The end-to-end test runs in-process sim engines with ranks (`DpSimEngine`, the `--sim-dp-ranks`
engine) through the `agentserve up` path (`in_process` → `EngineRouter` → `Dispatcher`); the
network path (ZeroMQ topics per rank, `/kv/snapshot?dp_rank=`) is tested in
tests/integration/router/test_attention_dp_e2e.py.
"""

from __future__ import annotations

import asyncio

import pytest

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.core import RouterCore
from agentserve.router.index import split_target, target
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import in_process
from agentserve.router.sync import WorkerSync
from agentserve.router.wire import decode_decision, encode_decision
from agentserve.worker.engine import (
    AllCleared,
    BlockStored,
    GenerateRequest,
    InvalidRequestError,
    KvSnapshot,
    SamplingParams,
)
from agentserve.worker.engines.sim import SimConfig
from agentserve.worker.engines.sim_dp import DpSimEngine
from agentserve.worker.kvwire import KvWireError, rank_topic, split_by_rank, topic_rank
from agentserve.worker.wire import WireError, decode_request, encode_request

pytestmark = pytest.mark.anyio

BS = 4
PROMPT = list(range(1, 33))  # 8 blocks
HASHES = block_hashes(PROMPT, BS)


def core(**kw: object) -> RouterCore:
    return RouterCore(RouterConfig.model_validate({"block_size": BS, **kw}))


def route(prompt: list[int] = PROMPT, session: str | None = None) -> RouteRequest:
    return RouteRequest(block_hashes(prompt, BS), len(prompt), session)


def test_index_keys_are_worker_and_rank() -> None:
    assert target("http://w:8200", None) == "http://w:8200"
    assert split_target(target("http://w:8200", 3)) == ("http://w:8200", 3)
    assert split_target("pod-a") == ("pod-a", None)
    assert target("w", 0) != target("w", 1) != "w"


def test_blocks_of_one_rank_route_to_that_rank_only() -> None:
    c = core()
    for rank in (0, 1):
        c.add_worker("w", rank)
    c.add_worker("v")  # a worker without ranks beside it
    assert c.workers == ("w", "v") and c.targets("w") == (target("w", 0), target("w", 1))
    assert c.apply_events("w", [AllCleared(1, 1), BlockStored(2, tuple(HASHES), None, 32, dp_rank=1)], 1)
    d = c.decide(route())
    assert (d.worker, d.dp_rank, d.overlap_blocks) == ("w", 1, len(HASHES))
    assert c.index.held(target("w", 0)) == frozenset() and c.held_count("w") == len(HASHES)
    # Rank 0 of the same worker has none of it: a prompt it caches is priced as a miss there.
    assert d.costs[target("w", 0)] > d.costs[target("w", 1)]
    c.finish_ticket(d.ticket)
    # A worker without ranks gets no rank in its decision.
    other = c.decide(route(list(range(100, 140))), frozenset({"w"}))
    assert (other.worker, other.dp_rank) == ("v", None)


def test_saturation_counts_every_rank_of_a_worker_and_removal_purges_all() -> None:
    c = core(max_inflight_per_worker=2)
    c.add_worker("w", 0)
    c.add_worker("w", 1)
    c.apply_events("w", [AllCleared(1), BlockStored(2, tuple(HASHES), None, 32)], 0)
    first, second = c.decide(route(session="s")), c.decide(route(session="s"))
    assert first.dp_rank == second.dp_rank == 0  # the cached rank, and the session sticks to it
    assert c.placement.inflight("w") == 2 and c.saturated()
    c.finish_ticket(first.ticket)
    assert not c.saturated()
    c.remove_worker("w")
    assert c.workers == () and c.index.stats().entries == 0 and c.placement.inflight("w") == 0
    assert c.index.workers == ()


def test_each_rank_stream_is_synced_on_its_own_numbers() -> None:
    c = core()
    syncs = {r: WorkerSync(c, "w", dp_rank=r) for r in (0, 1)}
    syncs[0].on_snapshot(KvSnapshot(5, BS, tuple(HASHES[:2]), dp_rank=0))
    syncs[1].on_snapshot(KvSnapshot(1, BS, (), dp_rank=1))
    # Rank 1 continues at 2 while rank 0 is at 6: no gap on either.
    syncs[1].on_message(2, [BlockStored(2, tuple(HASHES), None, 32, dp_rank=1)])
    syncs[0].on_message(6, [BlockStored(6, (HASHES[2],), HASHES[1], 4, dp_rank=0)])
    assert not syncs[0].wants_snapshot and not syncs[1].wants_snapshot
    assert c.index.held(target("w", 1)) == frozenset(HASHES)
    assert c.index.held(target("w", 0)) == frozenset(HASHES[:3])
    syncs[1].on_message(9, [BlockStored(9, (1,), None, 4, dp_rank=1)])  # rank 1 lost 3..8
    assert syncs[1].wants_snapshot and not syncs[0].wants_snapshot


def test_the_decision_and_the_generate_request_carry_the_rank_on_the_wire() -> None:
    c = core()
    c.add_worker("w", 3)
    decision = c.decide(route())
    back, url = decode_decision(encode_decision(decision, "http://w", "msgpack"), "msgpack")
    assert (back.worker, back.dp_rank, url) == ("w", 3, "http://w")
    plain = core()
    plain.add_worker("v")
    back, _ = decode_decision(encode_decision(plain.decide(route()), "http://v", "json"), "json")
    assert back.dp_rank is None
    request = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=1), dp_rank=2)
    assert decode_request(encode_request(request)).dp_rank == 2
    assert "dp_rank" not in encode_request(GenerateRequest("r", [1], SamplingParams(max_tokens=1)))
    for bad in (-1, "1", 1.0, True, 5000):
        with pytest.raises(WireError):
            decode_request({"token_ids": [1], "sampling": {"max_tokens": 1}, "dp_rank": bad})


def test_rank_topics_and_batches_split_by_rank() -> None:
    assert rank_topic(b"kv", None) == b"kv" and rank_topic(b"kv", 7) == b"kv/7"
    assert topic_rank(b"kv", b"kv") is None and topic_rank(b"kv/12", b"kv") == 12
    for bad in (b"kvx", b"kv/", b"kv/-1", b"kv/a", b"other"):
        with pytest.raises(KvWireError):
            topic_rank(bad, b"kv")
    mixed = [AllCleared(1, 0), AllCleared(1, 1), BlockStored(2, (5,), None, 4, dp_rank=1)]
    assert split_by_rank(mixed) == {0: [mixed[0]], 1: [mixed[1], mixed[2]]}
    assert split_by_rank([AllCleared(1)]) == {None: [AllCleared(1)]}


async def test_end_to_end_in_process_the_router_pins_the_rank_that_caches_the_prompt() -> None:
    config = SimConfig(num_blocks=64, block_size=BS, speedup=0)
    engine = DpSimEngine(2, config)
    await engine.start()
    backend = await in_process({"w": engine}, RouterConfig(block_size=BS))
    try:
        assert await backend.wait_ready(5)
        router = backend.router
        core_ = router.core  # type: ignore[attr-defined]
        assert core_.targets("w") == (target("w", 0), target("w", 1))
        # The prompt is cached on rank 1 only (a request pinned there directly).
        warm = engine.generate(GenerateRequest("warm", PROMPT, SamplingParams(max_tokens=1), dp_rank=1))
        assert [s async for s in warm][-1].finish_reason is not None
        for _ in range(200):
            if core_.index.held(target("w", 1)) >= frozenset(HASHES):
                break
            await asyncio.sleep(0.01)
        assert core_.index.held(target("w", 1)) >= frozenset(HASHES)
        assert not core_.index.held(target("w", 0)) & frozenset(HASHES)
        # Unpinned, the engine would balance this onto idle rank 0 and miss; routed, it is pinned.
        dispatcher = backend.dispatcher()
        stream = await dispatcher.generate(
            GenerateRequest("next", [*PROMPT, 99], SamplingParams(max_tokens=2)), route([*PROMPT, 99])
        )
        steps = [s async for s in stream]
        assert stream.decision.dp_rank == 1 and stream.decision.overlap_blocks == len(HASHES)
        assert steps[0].cached_tokens == len(PROMPT)
        assert engine.ranks[0].load().prompt_tokens == 0
        # A request for a rank the engine does not have is the caller's error.
        with pytest.raises(InvalidRequestError):
            engine.generate(GenerateRequest("bad", PROMPT, SamplingParams(max_tokens=1), dp_rank=2))
        with pytest.raises(InvalidRequestError):
            engine.kv_snapshot()  # a snapshot of an engine with ranks names its rank
    finally:
        await backend.aclose()
        await engine.stop()
