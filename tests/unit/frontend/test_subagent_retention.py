"""Retention for subagent trees: a child's blocks rank below the parent that waits on it, its type's
shared prefix is kept only while the tree runs — checked on the sim's real KV pool."""

from __future__ import annotations

import pytest

from agentserve.frontend.retention import AGENT, RetentionInputs, RetentionPolicy, decide_retention
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import TokenRangeRetention
from agentserve.worker.kvpool import KvPool, block_retentions

BLOCK = 32
FLAT = RetentionPolicy(tree_aware=False)  # today's retention: every agent session alike


def test_a_childs_turn_ranks_below_the_session_class_while_the_tree_runs() -> None:
    r = decide_retention(AGENT, RetentionInputs(1000, 320, has_tools=True, subagent=True))
    assert r is not None
    assert r.ranges == (
        TokenRangeRetention(0, 320, AGENT.prefix_priority, AGENT.child_duration_s),
        TokenRangeRetention(320, None, AGENT.child_priority, AGENT.child_duration_s),
    )
    assert (r.decode_priority, r.decode_duration_s) == (AGENT.child_priority, AGENT.child_duration_s)
    assert AGENT.child_priority < AGENT.session_priority


def test_a_hint_cannot_lift_a_child_to_its_parents_class() -> None:
    r = decide_retention(AGENT, RetentionInputs(1000, 0, has_tools=True, hint_priority=100, subagent=True))
    assert r is not None and r.decode_priority == AGENT.session_priority - 1
    low = decide_retention(AGENT, RetentionInputs(1000, 0, has_tools=True, hint_priority=-100, subagent=True))
    assert low is not None and low.decode_priority == 0


def test_without_tree_awareness_a_child_is_one_more_agent_session() -> None:
    inputs = RetentionInputs(1000, 320, has_tools=True, subagent=True)
    assert decide_retention(FLAT, inputs) == decide_retention(
        FLAT, RetentionInputs(1000, 320, has_tools=True)
    )
    assert decide_retention(RetentionPolicy(mode="off"), inputs) is None


@pytest.mark.parametrize("bad", [{"child_priority": 101}, {"child_duration_s": 0}])
def test_bad_child_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(**bad)  # type: ignore[arg-type]


def _run(
    pool: KvPool, tokens: list[int], policy: RetentionPolicy, *, subagent: bool, shared: int = 0
) -> list[int]:
    """One finished request on the pool: its blocks computed, then released under `policy`."""
    hashes = block_hashes(tokens, BLOCK)
    hit = pool.match(hashes)
    assert pool.acquire(hashes[:hit])
    assert pool.allocate(len(hashes) - hit)
    pool.commit(hashes[hit:], hashes[hit - 1] if hit else None)
    retention = decide_retention(
        policy,
        RetentionInputs(len(tokens), shared, has_tools=True, after_tool_result=True, subagent=subagent),
    )
    pool.release(hashes, block_retentions(retention, len(hashes), BLOCK, len(tokens)))
    return hashes


@pytest.mark.parametrize(("policy", "parent_kept"), [(AGENT, True), (FLAT, False)])
def test_a_burst_of_children_does_not_evict_the_waiting_parent(
    policy: RetentionPolicy, parent_kept: bool
) -> None:
    """A 40-block pool; the parent's 16 blocks wait in its tool gap while four children of one type
    (8 shared blocks of system prompt and tools, 8 private each) run one after the other. Tree-aware,
    the children evict each other's private blocks; flat, the parent is the oldest of one class."""
    pool = KvPool(40, BLOCK)
    parent = _run(pool, list(range(16 * BLOCK)), policy, subagent=False)
    system = list(range(10_000, 10_000 + 8 * BLOCK))
    shared_hashes = block_hashes(system, BLOCK)
    for child in range(4):
        own = [20_000 + child * 1000 + i for i in range(8 * BLOCK)]
        _run(pool, system + own, policy, subagent=True, shared=len(system) if child else 0)
        pool.now += 5.0
    assert (pool.match(parent) == len(parent)) is parent_kept
    assert pool.match(shared_hashes) == len(shared_hashes)  # the type's prefix: hot for the next sibling


def test_a_childs_blocks_fall_to_the_default_class_once_the_tree_has_gone_quiet() -> None:
    pool = KvPool(64, BLOCK)
    hashes = _run(pool, list(range(8 * BLOCK)), AGENT, subagent=True, shared=4 * BLOCK)
    assert {pool.priority_of(h) for h in hashes} == {AGENT.prefix_priority, AGENT.child_priority}
    pool.now += AGENT.child_duration_s + 1
    assert {pool.priority_of(h) for h in hashes} == {35}
