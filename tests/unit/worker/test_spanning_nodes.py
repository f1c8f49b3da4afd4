"""A replica tensor-parallel across nodes in the sim's timing: compute per GPU shrinks, the all-reduces
cross the inter-node link (docs/worker.md, Timing model)."""

from __future__ import annotations

import pytest

from agentserve.config import WorkerConfig
from agentserve.worker.main import sim_timing
from agentserve.worker.profiles import load_profile
from agentserve.worker.timing import INTERCONNECTS, StepWork, spanning_nodes

H200 = "h200-qwen3-30b-a3b-pytorch"
NDR = INTERCONNECTS["infiniband-ndr"]


def test_one_node_is_the_profile_itself() -> None:
    model = load_profile(H200).timing
    assert spanning_nodes(model, 1, NDR, layers=48, hidden=2048) is model


def test_two_nodes_halve_the_compute_and_add_the_link() -> None:
    model = load_profile(H200).timing
    two = spanning_nodes(model, 2, NDR, layers=48, hidden=2048, gpus_per_node=8)
    assert two.base_s == pytest.approx(model.base_s / 2)
    assert two.kv_read_per_token_s == pytest.approx(model.kv_read_per_token_s / 2)
    assert two.prefill_floor_s == model.prefill_floor_s  # launch bound: no faster on more GPUs
    # 96 all-reduces per iteration, each 2 ring steps across 2 nodes.
    assert two.cross_node_step_s == pytest.approx(96 * 2 * NDR.latency_s)
    # Per token: each GPU moves its 1/8 shard of the 2048-wide bf16 activation, 2(n−1)/n of it.
    assert two.cross_node_per_token_s == pytest.approx(96 * (2048 * 2 / 8) * 1.0 / NDR.bytes_per_s)
    decode = StepWork(decode=[8192] * 64)
    extra = two.cross_node_step_s + 64 * two.cross_node_per_token_s
    # The step is the compute, halved, plus the link (no MoE saturation in a decode-only batch of 64
    # changes that: every term of the compute scales by 1/2).
    assert two.step_seconds(decode) == pytest.approx(model.step_seconds(decode) / 2 + extra)


def test_a_faster_link_costs_less_and_more_nodes_cost_more_link() -> None:
    model = load_profile(H200).timing
    work = StepWork(prefill=[(0, 4096)], decode=[4096] * 32)
    ndr = spanning_nodes(model, 2, NDR, layers=48, hidden=2048)
    xdr = spanning_nodes(model, 2, INTERCONNECTS["infiniband-xdr"], layers=48, hidden=2048)
    assert xdr.step_seconds(work) < ndr.step_seconds(work)
    four = spanning_nodes(model, 4, NDR, layers=48, hidden=2048)
    assert four.cross_node_step_s > ndr.cross_node_step_s


def test_the_sim_worker_takes_nodes_and_link_from_its_config() -> None:
    config = WorkerConfig.model_validate(
        {"sim_profile": H200, "sim_nodes": 2, "sim_interconnect": "roce-400g"}
    )
    timing = sim_timing(config.sim_profile, config.sim_nodes, config.sim_interconnect)
    assert "×2 nodes (roce-400g)" in timing.name and timing.cross_node_step_s > 0
    assert sim_timing(H200).cross_node_step_s == 0
    with pytest.raises(ValueError):
        spanning_nodes(load_profile(H200).timing, 2, NDR, layers=0, hidden=0)
