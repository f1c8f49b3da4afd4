from __future__ import annotations

from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import BlockRemoved, BlockStored
from agentserve.worker.kvpool import KvPool
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence, StepOutcome

BS = 4


def make(
    blocks: int = 64, batch: int = 8, tokens: int = 64, chunked: bool = True
) -> tuple[KvPool, Scheduler]:
    pool = KvPool(blocks, BS)
    return pool, Scheduler(pool, SchedulerConfig(batch, tokens, chunked))


def seq(rid: str, prompt: list[int], out: int = 3, priority: int = 0) -> SimSequence:
    output = [1000 + i for i in range(out)]
    return SimSequence(rid, list(prompt), len(prompt), output, "stop", priority)


def run(sched: Scheduler, limit: int = 1000) -> list[StepOutcome]:
    outcomes = []
    for _ in range(limit):
        if not sched.has_work:
            return outcomes
        outcomes.append(sched.step())
    raise AssertionError("scheduler did not drain")


def finished(outcomes: list[StepOutcome]) -> dict[str, str]:
    return {s.request_id: reason for o in outcomes for s, reason in o.finished}


PROMPT = list(range(10, 10 + 4 * BS + 2))  # 4 full blocks and 2 tokens


def test_same_prompt_twice_reuses_every_full_block() -> None:
    _pool, sched = make()
    a = seq("a", PROMPT)
    sched.add(a)
    run(sched)
    assert a.cached_tokens == 0
    b = seq("b", PROMPT)
    sched.add(b)
    outcomes = run(sched)
    assert b.cached_tokens == 4 * BS
    assert outcomes[0].work.prefill == [(4 * BS, 2)]  # only the uncached tail is computed
    assert finished(outcomes) == {"b": "stop"}


def test_a_prompt_that_differs_in_its_first_block_reuses_nothing() -> None:
    _, sched = make()
    sched.add(seq("a", PROMPT))
    run(sched)
    other = [PROMPT[0] + 1, *PROMPT[1:]]
    b = seq("b", other)
    sched.add(b)
    run(sched)
    assert b.cached_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    _, sched = make()
    prompt = list(range(2 * BS))
    sched.add(seq("a", prompt))
    run(sched)
    b = seq("b", prompt)
    sched.add(b)
    outcomes = run(sched)
    assert b.cached_tokens == 2 * BS - 1
    assert outcomes[0].work.prefill == [(2 * BS - 1, 1)]


def test_output_blocks_are_cached_so_the_next_turn_hits_prompt_and_output() -> None:
    _pool, sched = make()
    a = seq("a", PROMPT, out=2 * BS)
    sched.add(a)
    run(sched)
    turn2 = [*a.tokens, 7, 7, 7, 7, 7]
    b = seq("b", turn2)
    sched.add(b)
    run(sched)
    computed_before = len(a.tokens) - 1  # the last sampled token was never fed back: no KV
    assert b.cached_tokens == computed_before // BS * BS
    assert b.cached_tokens > len(PROMPT)


def test_stored_events_chain_and_cover_every_full_block() -> None:
    _pool, sched = make()
    a = seq("a", PROMPT, out=BS + 1)
    sched.add(a)
    outcomes = run(sched)
    stored = [e for o in outcomes for e in o.events if isinstance(e, BlockStored)]
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes == block_hashes(a.tokens, BS)[: len(hashes)]
    for e in stored:
        i = hashes.index(e.block_hashes[0])
        assert e.parent_hash == (hashes[i - 1] if i else None)
        assert e.num_tokens == BS * len(e.block_hashes)
    seqs = [e.seq for o in outcomes for e in o.events]
    assert seqs == list(range(1, len(seqs) + 1))


def test_chunked_prefill_respects_the_token_budget_and_batch_size() -> None:
    _, sched = make(batch=2, tokens=8)
    for i in range(3):
        sched.add(seq(f"r{i}", [i * 100 + t for t in range(20)]))
    first = sched.step()
    assert sum(n for _, n in first.work.prefill) + len(first.work.decode) <= 8
    assert len(sched.running) == 1  # r0 took the whole budget
    outcomes = [first, *run(sched)]
    for o in outcomes:
        assert sum(n for _, n in o.work.prefill) + len(o.work.decode) <= 8
        assert len(o.work.prefill) + len(o.work.decode) <= 2
    assert finished(outcomes) == {"r0": "stop", "r1": "stop", "r2": "stop"}


def test_without_chunked_prefill_a_prompt_waits_for_a_full_budget() -> None:
    _, sched = make(tokens=20, chunked=False)
    sched.add(seq("a", list(range(12)), out=5))
    sched.add(seq("b", list(range(100, 112))))
    o = sched.step()
    assert o.work.prefill == [(0, 12)]  # b does not fit beside a in 20 tokens
    o = sched.step()
    assert o.work.decode == [12] and o.work.prefill == [(0, 12)]


def test_abort_frees_blocks_running_or_waiting() -> None:
    pool, sched = make(batch=1)
    sched.add(seq("a", PROMPT, out=50))
    sched.add(seq("b", list(range(500, 520))))
    sched.step()
    assert pool.used > 0 and sched.num_waiting == 1
    assert sched.abort("a") is not None
    assert sched.abort("b") is not None
    assert sched.abort("b") is None
    assert pool.used == 0 and not sched.has_work
    assert pool.cached_free == 4  # a's full prompt blocks stay reusable
    assert sched.aborted_count == 2


def test_eviction_under_pressure_removes_old_free_blocks() -> None:
    pool, sched = make(blocks=8)
    old = [list(range(i * 100, i * 100 + 2 * BS)) for i in range(3)]
    for i, p in enumerate(old):
        sched.add(seq(f"old{i}", p, out=1))
        run(sched)
    assert pool.cached_free == 6
    sched.add(seq("big", list(range(5000, 5000 + 6 * BS)), out=1))
    outcomes = run(sched)
    removed = [h for o in outcomes for e in o.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert len(removed) >= 4
    # Oldest first, and within a prompt its tail before its head.
    first = block_hashes(old[0], BS)
    assert removed[:2] == [first[1], first[0]]
    assert pool.match(block_hashes(old[0], BS)) == 0


def test_preemption_when_decode_runs_out_of_blocks_then_recompute_with_hits() -> None:
    pool, sched = make(blocks=6, batch=4)
    a = seq("a", list(range(2 * BS)), out=2 * BS, priority=1)
    b = seq("b", list(range(100, 100 + 2 * BS)), out=2 * BS)
    sched.add(a)
    sched.add(b)
    outcomes = run(sched)
    assert any(o.preempted for o in outcomes)
    assert all(victim is b for o in outcomes for victim in o.preempted)  # lower priority goes
    assert finished(outcomes) == {"a": "stop", "b": "stop"}
    assert b.emitted == 2 * BS and b.cached_tokens == 0  # reported once, at first admission
    assert sched.preemptions >= 1
    assert pool.used == 0


def test_a_sequence_that_outgrows_the_whole_cache_finishes_with_length() -> None:
    pool, sched = make(blocks=2)
    a = seq("a", list(range(BS)), out=10 * BS)
    sched.add(a)
    assert finished(run(sched)) == {"a": "length"}
    assert pool.used == 0


def test_priority_orders_admission() -> None:
    _, sched = make(batch=1)
    sched.add(seq("low", list(range(8)), out=1))
    sched.add(seq("high", list(range(100, 108)), out=1, priority=5))
    first = sched.step()
    assert [s.request_id for s in first.started] == ["high"]


def test_empty_output_finishes_after_prefill() -> None:
    _, sched = make()
    s = seq("a", PROMPT, out=0)
    sched.add(s)
    outcomes = run(sched)
    assert finished(outcomes) == {"a": "stop"}
    assert s.emitted == 0


def test_without_prefix_caching_nothing_is_reused_or_announced() -> None:
    pool = KvPool(64, BS)
    sched = Scheduler(pool, SchedulerConfig(8, 64, prefix_caching=False))
    sched.add(seq("a", PROMPT, out=2 * BS))
    outcomes = run(sched)
    b = seq("b", PROMPT)
    sched.add(b)
    outcomes += run(sched)
    assert b.cached_tokens == 0
    assert [e for o in outcomes for e in o.events] == []
    assert pool.used == 0 and pool.cached_free == 0
