"""The per-request prefill decision (router/disagg) and its place in the router core."""

from __future__ import annotations

import pytest

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.core import RouterCore
from agentserve.router.disagg import (
    PrefillCandidate,
    decide_prefill,
    default_threshold,
    local_prefill,
    prefill_seconds,
)
from agentserve.router.placement import RouteRequest
from agentserve.worker.engine import BlockStored
from agentserve.worker.kvtransfer import TRANSFER_SETUP_S, kv_link, transfer_seconds
from agentserve.worker.profiles import load_profile, shipped_profiles
from agentserve.worker.timing import Interconnect, StepWork, TimingModel

# A linear model whose numbers are easy to follow: 1 ms per iteration, 10 µs per prefill token,
# 100 µs per decoding sequence, no attention terms.
LINEAR = TimingModel("linear", 1e-3, 1e-4, 0.0, 1e-5, 0.0, kv_bytes_per_token=1000)
LINK = Interconnect("test", 1e9, 0.0)  # 1 GB/s: 1 µs per token of 1000 bytes


def test_transfer_cost_is_setup_plus_bytes_over_the_link() -> None:
    assert transfer_seconds(0, 1000, LINK) == 0.0
    assert transfer_seconds(1000, 1000, LINK) == pytest.approx(TRANSFER_SETUP_S + 1e-3)
    assert transfer_seconds(1000, 1000, LINK, parallel=4) == pytest.approx(TRANSFER_SETUP_S + 0.25e-3)
    # NVLink within a node is an order faster than RDMA between nodes.
    nv, rdma = kv_link("nvlink"), kv_link("rdma")
    assert transfer_seconds(100_000, 98_304, nv) * 5 < transfer_seconds(100_000, 98_304, rdma)
    with pytest.raises(ValueError, match="unknown KV link"):
        kv_link("carrier-pigeon")


def test_local_prefill_stall_is_each_mixed_iteration_beyond_the_decode_one() -> None:
    # 3 chunks of 100 tokens beside 4 decoding streams: decode alone 1.4 ms, mixed 2.4 ms each.
    ttft, stall = local_prefill(LINEAR, 300, 0, decoding=4, context=10, chunk=100)
    assert ttft == pytest.approx(3 * 2.4e-3)
    assert stall == pytest.approx(3 * 1e-3)
    assert local_prefill(LINEAR, 300, 0, decoding=0, chunk=100)[1] == 0.0
    assert prefill_seconds(LINEAR, 300, chunk=100) == pytest.approx(3 * 2e-3)


def test_default_threshold_keeps_the_reference_iteration_within_the_budget() -> None:
    # decode alone: 1 ms + 64 × 0.1 ms = 7.4 ms; twice that allows (14.8 − 7.4) ms / 10 µs = 740 tokens.
    assert default_threshold(LINEAR) == 740
    assert default_threshold(LINEAR, budget=1.0) == 0
    assert default_threshold(LINEAR, budget=100.0, chunk=512) == 512
    for name in shipped_profiles():  # every shipped profile derives a threshold inside one chunk
        model = load_profile(name).timing
        n = default_threshold(model)
        assert 0 < n < 8192
        decodes = (8192,) * 64
        assert model.step_seconds(StepWork(((0, n),), decodes)) <= 2 * model.step_seconds(
            StepWork((), decodes)
        )
        assert model.step_seconds(StepWork(((0, n + 1),), decodes)) > 2 * model.step_seconds(
            StepWork((), decodes)
        )


def decide(uncached: int, candidates: list[PrefillCandidate], threshold: int = 500) -> object:
    return decide_prefill(
        LINEAR,
        LINK,
        prompt_tokens=10_000,
        decode_cached_tokens=10_000 - uncached,
        decoding=8,
        threshold=threshold,
        candidates=candidates,
    )


def test_below_the_threshold_the_decode_worker_prefills() -> None:
    plan = decide(400, [PrefillCandidate("p0", 0, 0)])
    assert plan.where == "local" and plan.reason == "below-threshold" and plan.prefill_worker is None  # type: ignore[attr-defined]
    assert plan.uncached_tokens == 400 and plan.local_stall_s > 0  # type: ignore[attr-defined]


def test_above_the_threshold_without_prefill_workers_stays_local() -> None:
    plan = decide(5000, [])
    assert plan.where == "local" and plan.reason == "no-prefill-worker"  # type: ignore[attr-defined]


def test_remote_picks_the_prefill_worker_with_the_earliest_kv() -> None:
    # p0 holds half the prompt but has a long backlog; p1 is idle and cold; p2 holds most, idle.
    plan = decide(
        5000,
        [
            PrefillCandidate("p0", 5000, 200_000),
            PrefillCandidate("p1", 0, 0),
            PrefillCandidate("p2", 8000, 0),
        ],
    )
    assert plan.where == "remote" and plan.prefill_worker == "p2"  # type: ignore[attr-defined]
    assert plan.transfer_tokens == 5000  # type: ignore[attr-defined]  # what the decode worker lacks
    expected = prefill_seconds(LINEAR, 2000, 8000) + transfer_seconds(5000, 1000, LINK)
    assert plan.remote_ttft_s == pytest.approx(expected)  # type: ignore[attr-defined]
    # Load counts: with p2 busy, the idle cold p1 wins over p2.
    plan = decide(5000, [PrefillCandidate("p1", 0, 0.0), PrefillCandidate("p2", 8000, 10.0)])
    assert plan.prefill_worker == "p1"  # type: ignore[attr-defined]


def test_a_prefill_pool_backlogged_beyond_the_local_cost_means_local_prefill() -> None:
    local = decide(5000, [PrefillCandidate("p0", 0, 0.0)])
    assert local.where == "remote"  # type: ignore[attr-defined]
    # Local cost: own TTFT + 8 decoding streams × the stall; a backlog past it keeps the prompt local.
    cost = local.local_ttft_s + 8 * local.local_stall_s  # type: ignore[attr-defined]
    plan = decide(5000, [PrefillCandidate("p0", 0, cost)])
    assert plan.where == "local" and plan.reason == "prefill-busy"  # type: ignore[attr-defined]
    assert plan.prefill_worker == "p0" and plan.remote_ttft_s > cost  # type: ignore[attr-defined]


# -- in the router core -------------------------------------------------------------------------------

BS = 4


def core(**config: object) -> RouterCore:
    c = RouterCore(RouterConfig(block_size=BS, prefill_threshold_tokens=40, **config))  # type: ignore[arg-type]
    c.add_worker("d0", role="decode")
    c.add_worker("d1", role="decode")
    c.add_worker("p0", role="prefill")
    return c


def route(tokens: int, session: str | None = None) -> RouteRequest:
    ids = list(range(tokens))
    return RouteRequest(block_hashes(ids, BS), tokens, session_id=session, osl=4)


def test_prefill_workers_never_decode() -> None:
    c = core()
    workers = {c.decide(route(8)).worker for _ in range(20)}
    assert workers == {"d0", "d1"}


def test_cold_prompt_goes_remote_cached_prompt_stays_local_and_both_are_counted() -> None:
    c = core()
    cold = c.decide(route(400))
    assert cold.prefill is not None and cold.prefill.where == "remote" and cold.prefill.prefill_worker == "p0"
    assert cold.prefill.ticket is not None and c.placement.inflight("p0") == 1
    assert c.backlog("p0") > 0  # its predicted prefill counts against the next decision there
    c.finish_ticket(cold.prefill.ticket)
    assert c.placement.inflight("p0") == 0 and c.backlog("p0") == 0
    # The decode worker now holds the prompt (the transferred blocks were announced by its events).
    hashes = tuple(block_hashes(list(range(400)), BS))
    c.apply_events(cold.worker, [BlockStored(1, hashes, None, 400)])
    warm = c.decide(route(420))  # 20 new tokens on a 400-token cached prefix
    assert warm.worker == cold.worker
    assert warm.prefill is not None and warm.prefill.where == "local" and warm.prefill.uncached_tokens == 20
    assert c.prefill_decisions == {"local": 1, "remote": 1}


def test_without_prefill_workers_no_plan_and_an_excluded_prefill_worker_is_skipped() -> None:
    c = RouterCore(RouterConfig(block_size=BS, prefill_threshold_tokens=40))
    c.add_worker("w0")
    assert c.decide(route(400)).prefill is None
    c2 = core()
    plan = c2.decide(route(400), exclude=frozenset({"p0"})).prefill
    assert plan is not None and plan.reason == "no-prefill-worker"


def test_threshold_defaults_to_the_profile_derivation() -> None:
    c = RouterCore(RouterConfig(profile="h200-qwen3-30b-a3b-pytorch"))
    assert c.prefill_threshold == default_threshold(load_profile("h200-qwen3-30b-a3b-pytorch").timing)
    with pytest.raises(ValueError, match="role"):
        c.add_worker("x", role="sideways")  # type: ignore[arg-type]


def test_the_threshold_policy_goes_remote_whatever_the_backlog() -> None:
    plan = decide_prefill(
        LINEAR,
        LINK,
        prompt_tokens=10_000,
        decode_cached_tokens=5000,
        decoding=8,
        threshold=0,
        candidates=[PrefillCandidate("p0", 0, 1e6)],
        compare_costs=False,
    )
    assert plan.where == "remote" and plan.remote_ttft_s > 1e6
    c = core(prefill_policy="threshold")
    assert c.decide(route(400)).prefill.where == "remote"  # type: ignore[union-attr]


def test_the_prefill_pool_is_static_and_apart_from_the_decode_workers() -> None:
    url = "http://10.0.0.5:8200"
    with pytest.raises(ValueError, match="not both"):
        RouterConfig(workers=[url], prefill_workers=[url])
    with pytest.raises(ValueError, match="discovery: static"):
        RouterConfig(prefill_workers=[url], discovery="kubernetes", worker_service="w")
