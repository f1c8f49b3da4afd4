from __future__ import annotations

from agentserve.profiler.plan import FULL, QUICK, UNIQUE_TOKENS, WorkerFacts, fit_to, prefill_steps
from agentserve.worker.timing import StepWork


def facts(**kw: object) -> WorkerFacts:
    base: dict[str, object] = {
        "block_size": 32,
        "kv_tokens": 1 << 20,
        "max_num_tokens": 8192,
        "max_batch_size": 256,
    }
    return WorkerFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_a_prompt_is_prefilled_in_chunks_of_one_iteration() -> None:
    assert prefill_steps(0, 20_000, 8192) == (
        StepWork(prefill=((0, 8192),)),
        StepWork(prefill=((8192, 8192),)),
        StepWork(prefill=((16384, 3616),)),
    )
    assert prefill_steps(32_000, 32_512, 8192) == (StepWork(prefill=((32_000, 512),)),)


def test_a_big_worker_gets_the_whole_plan() -> None:
    assert fit_to(FULL, facts()) == FULL


def test_the_plan_shrinks_to_what_the_worker_holds() -> None:
    small = fit_to(FULL, facts(kv_tokens=40_000, max_batch_size=64, max_num_tokens=4096))
    room = int(40_000 * 0.8)
    assert small.prompt_lengths and max(small.prompt_lengths) <= room
    assert all(s + n <= room for s, n in small.cached)
    assert all(b <= 64 and c + b * (UNIQUE_TOKENS + FULL.decode_tokens) <= room for b, c in small.decode)
    assert all(p + b <= 4096 for p, _, b, _ in small.mixed)
    assert small.size < FULL.size


def test_without_chunked_prefill_prompts_stay_within_one_iteration() -> None:
    plan = fit_to(QUICK, facts(chunked_prefill=False))
    assert max(plan.prompt_lengths) <= 8192
    assert fit_to(FULL, facts(), max_context=2048).prompt_lengths == (256, 1024, 2048)
