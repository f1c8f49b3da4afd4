"""Retention for subagent trees: a parent waiting on subagents is held above every session in a tool
gap, a child's blocks rank below it and drop to the lowest class once it answered, its type's shared
prefix is kept only while the tree runs — checked on the sim's real KV pool."""

from __future__ import annotations

import pytest

from agentserve.frontend.retention import (
    AGENT,
    RetentionInputs,
    RetentionPolicy,
    child_release,
    decide_retention,
    parent_hold,
)
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import Retention, TokenRangeRetention
from agentserve.worker.kvpool import KvPool, block_retentions

BLOCK = 32
FLAT = RetentionPolicy(tree_aware=False)  # today's retention: every agent session alike


def test_a_childs_turn_ranks_below_its_held_parent_while_the_tree_runs() -> None:
    r = decide_retention(AGENT, RetentionInputs(1000, 320, has_tools=True, subagent=True))
    assert r is not None
    assert r.ranges == (
        TokenRangeRetention(0, 320, AGENT.prefix_priority, AGENT.child_duration_s),
        TokenRangeRetention(320, None, AGENT.child_priority, AGENT.child_duration_s),
    )
    assert (r.decode_priority, r.decode_duration_s) == (AGENT.child_priority, AGENT.child_duration_s)
    assert AGENT.child_priority < AGENT.parent_priority <= AGENT.max_priority < AGENT.prefix_priority


def test_a_parent_is_held_above_the_session_class_and_an_answered_child_released() -> None:
    hold = parent_hold(AGENT, 1000, 320)
    assert hold is not None
    assert hold.ranges == (
        TokenRangeRetention(0, 320, AGENT.prefix_priority, None),
        TokenRangeRetention(320, None, AGENT.parent_priority, AGENT.session_duration_s),
    )
    assert hold.decode_priority == AGENT.parent_priority > AGENT.session_priority
    release = child_release(AGENT, 1000, 320)
    assert release is not None
    assert release.ranges == (
        TokenRangeRetention(0, 320, AGENT.prefix_priority, AGENT.child_duration_s),
        TokenRangeRetention(320, None, 0, None),
    )
    assert release.decode_priority == 0
    for off in (FLAT, RetentionPolicy(mode="off")):
        assert parent_hold(off, 1000, 320) is None and child_release(off, 1000, 320) is None
    # The parent's class never reaches the shared prefix's, whatever it is set to.
    capped = parent_hold(RetentionPolicy(parent_priority=99), 1000, 0)
    assert capped is not None and capped.decode_priority == AGENT.max_priority


def test_a_hint_cannot_lift_a_child_to_its_parents_class() -> None:
    r = decide_retention(AGENT, RetentionInputs(1000, 0, has_tools=True, hint_priority=100, subagent=True))
    assert r is not None and r.decode_priority == AGENT.parent_priority - 1
    low = decide_retention(AGENT, RetentionInputs(1000, 0, has_tools=True, hint_priority=-100, subagent=True))
    assert low is not None and low.decode_priority == 0


def test_without_tree_awareness_a_child_is_one_more_agent_session() -> None:
    inputs = RetentionInputs(1000, 320, has_tools=True, subagent=True)
    assert decide_retention(FLAT, inputs) == decide_retention(
        FLAT, RetentionInputs(1000, 320, has_tools=True)
    )
    assert decide_retention(RetentionPolicy(mode="off"), inputs) is None


@pytest.mark.parametrize("bad", [{"child_priority": 101}, {"parent_priority": -1}, {"child_duration_s": 0}])
def test_bad_tree_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(**bad)  # type: ignore[arg-type]


def _release(pool: KvPool, tokens: list[int], retention: Retention | None) -> list[int]:
    """A request over `tokens` (computing what is not cached), its blocks released under `retention`:
    a retention update is such a request over blocks that are all cached already."""
    hashes = block_hashes(tokens, BLOCK)
    hit = pool.match(hashes)
    assert pool.acquire(hashes[:hit])
    assert pool.allocate(len(hashes) - hit)
    pool.commit(hashes[hit:], hashes[hit - 1] if hit else None)
    pool.release(hashes, block_retentions(retention, len(hashes), BLOCK, len(tokens)))
    return hashes


def _turn(
    pool: KvPool, tokens: list[int], policy: RetentionPolicy, *, subagent: bool, shared: int = 0
) -> list[int]:
    inputs = RetentionInputs(len(tokens), shared, has_tools=True, after_tool_result=True, subagent=subagent)
    return _release(pool, tokens, decide_retention(policy, inputs))


@pytest.mark.parametrize(("policy", "parent_kept"), [(AGENT, True), (FLAT, False)])
def test_a_burst_of_children_does_not_evict_the_waiting_parent(
    policy: RetentionPolicy, parent_kept: bool
) -> None:
    """A 40-block pool; the parent's 16 blocks wait while four children of one type (8 shared blocks
    of system prompt and tools, 8 private each) run and answer one after the other, beside another
    session's 8 blocks in an ordinary tool gap. Tree-aware, the held parent outranks every child and
    the other session; flat, the parent is the oldest of one class and goes first."""
    pool = KvPool(40, BLOCK)
    parent_tokens = list(range(16 * BLOCK))
    parent = _turn(pool, parent_tokens, policy, subagent=False)
    _release(pool, parent_tokens, parent_hold(policy, len(parent_tokens), 0))  # its turn spawned
    _turn(pool, list(range(50_000, 50_000 + 8 * BLOCK)), policy, subagent=False)  # someone else's gap
    system = list(range(10_000, 10_000 + 8 * BLOCK))
    shared_hashes = block_hashes(system, BLOCK)
    for child in range(4):
        tokens = system + [20_000 + child * 1000 + i for i in range(8 * BLOCK)]
        shared = len(system) if child else 0
        _turn(pool, tokens, policy, subagent=True, shared=shared)
        _release(pool, tokens, child_release(policy, len(tokens), shared))  # it answered
        pool.now += 5.0
    assert (pool.match(parent) == len(parent)) is parent_kept
    assert pool.match(shared_hashes) == len(shared_hashes)  # the type's prefix: hot for the next sibling


def test_an_answered_childs_own_blocks_go_first_and_its_types_prefix_stays() -> None:
    pool = KvPool(64, BLOCK)
    tokens = list(range(8 * BLOCK))
    hashes = _turn(pool, tokens, AGENT, subagent=True, shared=4 * BLOCK)
    assert [pool.priority_of(h) for h in hashes] == [AGENT.prefix_priority] * 4 + [AGENT.child_priority] * 4
    _release(pool, tokens, child_release(AGENT, len(tokens), 4 * BLOCK))
    assert [pool.priority_of(h) for h in hashes] == [AGENT.prefix_priority] * 4 + [0] * 4
    pool.now += AGENT.child_duration_s + 1  # the tree went quiet: the type's prefix is default again
    assert [pool.priority_of(h) for h in hashes] == [35] * 4 + [0] * 4
