"""The router's index knows which blocks a worker holds on host, and the cost model prices them
between a GPU hit and a miss."""

from __future__ import annotations

import random

from agentserve.config import RouterConfig
from agentserve.router.core import RouterCore
from agentserve.router.index import KvIndex
from agentserve.router.placement import Placement, RouteRequest
from agentserve.worker.engine import BlockRemoved, BlockStored, KvSnapshot


def test_host_blocks_are_held_and_counted_until_they_move_back_or_go() -> None:
    index = KvIndex()
    index.stored("w", [1, 2, 3])
    index.stored("w", [2, 3], on_host=True)  # spilled: still held
    overlaps = index.overlaps([1, 2, 3, 4])
    assert overlaps == {"w": 3}
    assert index.host_overlaps([1, 2, 3, 4], overlaps) == {"w": 2}
    index.stored("w", [2])  # back on GPU
    assert index.host_overlaps([1, 2, 3], index.overlaps([1, 2, 3])) == {"w": 1}
    index.removed("w", [3])
    assert index.host_overlaps([1, 2, 3], index.overlaps([1, 2, 3])) == {}
    index.resync("w", [1], 9, host_hashes=[2])
    assert index.overlaps([1, 2]) == {"w": 2}
    assert index.host_overlaps([1, 2], {"w": 2}) == {"w": 1}


def test_router_events_and_resync_carry_the_tier() -> None:
    router = RouterCore(RouterConfig(block_size=4))
    router.add_worker("a")
    assert router.apply_events("a", [BlockStored(1, (1, 2), None, 8), BlockStored(2, (1, 2), None, 8, "cpu")])
    assert router.index.host_overlaps([1, 2], {"a": 2}) == {"a": 2}
    assert router.apply_events("a", [BlockRemoved(3, (2,), "cpu")])
    assert router.index.overlaps([1, 2]) == {"a": 1}
    router.resync("a", KvSnapshot(7, 4, (1,), (2,)))
    assert router.index.host_overlaps([1, 2], {"a": 2}) == {"a": 1}


def test_a_host_hit_costs_between_a_gpu_hit_and_a_miss() -> None:
    config = RouterConfig(block_size=4, load_weight=0.0)
    placement = Placement(config, rng=random.Random(0), clock=lambda: 0.0)
    request = RouteRequest([1, 2, 3, 4], 16)
    decision = placement.choose(
        request, ["gpu", "host", "miss"], {"gpu": 4, "host": 4}, host_overlaps={"host": 4}
    )
    assert decision.worker == "gpu"
    costs = decision.costs
    assert costs["gpu"] < costs["host"] < costs["miss"]
    assert costs["host"] == config.host_hit_weight * 4
