"""The sim's sampling policy as a distribution (worker/sampling.py): log-probabilities are the
log-softmax of the policy's logits after bias and the grammar's mask, and the choice is its argmax."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llguidance import LLMatcher

from agentserve.constraints.engine import engine_for
from agentserve.constraints.spec import Constraint
from agentserve.worker.constrained import constrained_plan, constrained_sample
from agentserve.worker.engine import SamplingParams
from agentserve.worker.sampling import (
    PREFERENCE,
    RESTEER_EVERY,
    Allowed,
    Matcher,
    Unmasked,
    choose,
    sample_plan,
)
from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER, HFTokenizer

TOKENIZER = HFTokenizer.from_file(EMBEDDED_TOKENIZER)
ENGINE = engine_for(TOKENIZER.to_json())


def reference(policy: int, bias: dict[int, float], allowed: list[int]) -> dict[int, float]:
    """The distribution spelled out token by token (what `choose` computes in closed form)."""
    logits = {t: (PREFERENCE if t == policy else 0.0) + bias.get(t, 0.0) for t in allowed}
    log_z = math.log(sum(math.exp(v) for v in logits.values()))
    return {t: v - log_z for t, v in logits.items()}


FREE_TEXT = "start: /(.|\\n)*/\n"


def test_free_text_cut_by_the_budget_is_incomplete_though_the_grammar_accepts_it() -> None:
    """A grammar that accepts any text accepts wherever the budget cuts it: only a plan that ended
    there by itself is complete."""
    constraint = Constraint(FREE_TEXT)
    script = TOKENIZER.encode(" ".join(["word"] * 40))
    pieces = [TOKENIZER.decode([t]) for t in script]
    for logprobs in (None, 2):
        sampling = SamplingParams(max_tokens=10, logprobs=logprobs)
        plan = constrained_plan(
            TOKENIZER, constraint, script=script, pieces=pieces, sampling=sampling, need=10, seed=1
        )
        assert len(plan.token_ids) == 10 and not plan.complete
        sampled = constrained_sample(
            TOKENIZER,
            constraint,
            plan.token_ids,
            sampling=sampling,
            need=10,
            seed=1,
            plan_complete=plan.complete,
        )
        assert sampled.token_ids == plan.token_ids and not sampled.complete
    roomy = SamplingParams(max_tokens=100)
    whole = constrained_plan(
        TOKENIZER, constraint, script=script, pieces=pieces, sampling=roomy, need=100, seed=1
    )
    assert whole.token_ids == script and whole.complete
    exact = constrained_plan(
        TOKENIZER, constraint, script=script, pieces=pieces, sampling=roomy, need=len(script), seed=1
    )
    assert exact.token_ids == script and exact.complete  # the script ends at the budget: as unconstrained


@given(
    policy=st.integers(0, 49),
    bias=st.dictionaries(st.integers(0, 59), st.floats(-100, 100), max_size=6),
    mask_bits=st.integers(1, (1 << 50) - 1),
    top=st.integers(0, 8),
)
def test_choose_is_the_argmax_of_the_masked_biased_softmax(
    policy: int, bias: dict[int, float], mask_bits: int, top: int
) -> None:
    mask = mask_bits.to_bytes(7, "little")  # 56 bits over a vocabulary of 50: the padding never counts
    allowed = Allowed(50, mask)
    ids = [t for t in range(50) if (mask_bits >> t) & 1]
    dist = reference(policy, bias, ids)
    choice = choose(policy, bias, allowed, top)
    assert choice.entry is not None
    logits = {t: (PREFERENCE if t == policy else 0.0) + bias.get(t, 0.0) for t in ids}
    winners = sorted(t for t in ids if logits[t] == max(logits.values()))  # exact: the argmax
    assert choice.token == (policy if policy in winners else winners[0])  # ties: policy, then lowest id
    assert math.isclose(choice.entry.logprob, dist[choice.token], abs_tol=1e-9)
    ranked = sorted(dist.values(), reverse=True)[: min(top, len(ids))]
    assert [lp for _, lp in choice.entry.top] == pytest.approx(ranked, abs=1e-9)
    assert all(math.isclose(lp, dist[t], abs_tol=1e-9) for t, lp in choice.entry.top)
    assert choose(policy, bias, allowed, None) == type(choice)(choice.token, None)


def test_without_bias_the_plan_stays_and_its_probability_is_the_preference() -> None:
    sampled = sample_plan([5, 7, 9], vocab=1000, bias={}, top=1)
    assert sampled.token_ids == [5, 7, 9] and sampled.logprobs is not None
    expected = PREFERENCE - math.log(math.exp(PREFERENCE) + 999)
    assert [e.logprob for e in sampled.logprobs] == pytest.approx([expected] * 3)
    assert [e.top[0][0] for e in sampled.logprobs] == [5, 7, 9]
    assert sample_plan([5], vocab=1000, bias={}, top=None).logprobs is None


def test_a_bias_bans_or_forces_a_token_in_place() -> None:
    banned = sample_plan([5, 7, 5], vocab=1000, bias={5: -100.0}, top=0)
    assert banned.token_ids == [0, 7, 0]  # the policy token banned: the most likely left, lowest id
    forced = sample_plan([5, 7, 5], vocab=1000, bias={3: 100.0}, top=0)
    assert forced.token_ids == [3, 3, 3] and forced.logprobs is not None
    assert forced.logprobs[0].logprob == pytest.approx(0.0, abs=1e-9)


GRAMMAR = 'start: "{" "\\"a\\"" ":" ("1" | "2" | "3") "}"\n'


def test_under_a_grammar_forced_tokens_are_certain_and_a_bias_keeps_the_output_valid() -> None:
    constraint = Constraint(GRAMMAR)
    script = TOKENIZER.encode('{"a":2}')
    sampling = SamplingParams(max_tokens=20, logprobs=3)
    sampled = constrained_sample(TOKENIZER, constraint, script, sampling=sampling, need=20, seed=1)
    assert TOKENIZER.decode(sampled.token_ids) == '{"a":2}' and sampled.complete
    assert sampled.logprobs is not None
    tops = [len(e.top) for e in sampled.logprobs]
    free = [e for e in sampled.logprobs if len(e.top) == 3]
    # Every position but the digit has one allowed token (logprob 0); the digit has three choices.
    assert len(free) == 1 and tops.count(1) == len(tops) - 1
    assert all(e.logprob == 0.0 for e in sampled.logprobs if len(e.top) == 1)
    two = TOKENIZER.encode("2")[0]
    # The digit's distribution spans what the grammar allows there (`1`, `2`, `3` and tokens that
    # also close the object), counted on an independent matcher.
    at = tops.index(3)
    replay = ENGINE.matcher(GRAMMAR)
    assert replay.consume_tokens(sampled.token_ids[:at])
    allowed = int.from_bytes(replay.compute_bitmask(), "little").bit_count()
    assert allowed >= 3 and free[0].token_id == two
    assert free[0].logprob == pytest.approx(-math.log(1 + (allowed - 1) * math.exp(-PREFERENCE)), rel=1e-9)
    assert [TOKENIZER.decode([t]) for t, _ in free[0].top[1:]] == ["1", "3"]  # the next most likely, by id
    biased = SamplingParams(max_tokens=20, logprobs=0, logit_bias=((two, -100.0),))
    again = constrained_sample(TOKENIZER, constraint, script, sampling=biased, need=20, seed=1)
    text = TOKENIZER.decode(again.token_ids)
    assert again.complete and json.loads(text)["a"] in (1, 3)
    check = ENGINE.matcher(GRAMMAR)
    assert check.try_consume_tokens(again.token_ids) == len(again.token_ids)


@given(
    policy=st.integers(-2, 60),
    bias=st.dictionaries(st.integers(0, 70), st.one_of(st.just(0.0), st.floats(-100, 100)), max_size=12),
    top=st.one_of(st.none(), st.integers(0, 10)),
)
def test_the_per_request_fast_path_is_choose(policy: int, bias: dict[int, float], top: int | None) -> None:
    fast = Unmasked(bias, 60).choose(policy, top)
    slow = choose(policy, bias, Allowed(60), top)
    assert fast.token == slow.token
    if slow.entry is None:
        assert fast.entry is None
        return
    assert fast.entry is not None
    assert fast.entry.logprob == pytest.approx(slow.entry.logprob, abs=1e-9)
    assert [t for t, _ in fast.entry.top] == [t for t, _ in slow.entry.top]
    assert [lp for _, lp in fast.entry.top] == pytest.approx([lp for _, lp in slow.entry.top], abs=1e-9)


class Counting:
    """An llguidance matcher that counts its vocabulary masks; `alone` False: it never takes planned
    tokens without a mask, so `sample_plan` masks at every position (the reference for its fast
    path)."""

    def __init__(self, inner: LLMatcher, alone: bool) -> None:
        self.inner, self.alone, self.masks = inner, alone, 0

    def compute_bitmask(self) -> bytes:
        self.masks += 1
        return self.inner.compute_bitmask()

    def try_consume_tokens(self, tokens: list[int]) -> int:
        return self.inner.try_consume_tokens(tokens) if self.alone else 0

    def consume_token(self, token: int) -> bool:
        return self.inner.consume_token(token)

    def is_stopped(self) -> bool:
        return self.inner.is_stopped()

    def is_accepting(self) -> bool:
        return self.inner.is_accepting()

    def deep_copy(self) -> LLMatcher:
        return self.inner.deep_copy()


def sampled_under_grammar(bias: dict[int, float], alone: bool) -> tuple[list[int], int]:
    matcher = Counting(ENGINE.matcher(GRAMMAR), alone)

    def resteer(state: Matcher, rest: Sequence[int], room: int) -> list[int]:
        steered = ENGINE.steer(
            cast(LLMatcher, state), GRAMMAR, rest, eos=(), max_tokens=room, rng=random.Random(1)
        )
        return steered.token_ids

    plan = TOKENIZER.encode('{"a":2}')
    vocab = ENGINE.tokenizer().vocab_size
    out = sample_plan(plan, vocab=vocab, bias=bias, top=None, matcher=matcher, resteer=resteer, budget=20)
    assert out.complete
    return out.token_ids, matcher.masks


DIGITS = [TOKENIZER.encode(d)[0] for d in "0123"]
OTHERS = [TOKENIZER.encode(t)[0] for t in ('{"', "}", '":', "a", "x")]


@given(bias=st.dictionaries(st.sampled_from(DIGITS + OTHERS), st.floats(-100, 100), max_size=4))
def test_without_logprobs_a_mask_is_computed_only_where_a_bias_can_win(bias: dict[int, float]) -> None:
    fast, masks = sampled_under_grammar(bias, alone=True)
    reference, every = sampled_under_grammar(bias, alone=False)
    assert fast == reference  # the same choice at every position as with a mask at each
    assert every >= len(reference) and masks <= every
    check = ENGINE.matcher(GRAMMAR)
    assert check.try_consume_tokens(fast) == len(fast)
    if all(PREFERENCE + bias.get(t, 0.0) >= max([0.0, *bias.values()]) for t in TOKENIZER.encode('{"a":2}')):
        assert masks == 0  # no bias outranks the plan anywhere: no mask at all


def test_a_winning_bias_is_masked_and_leaves_the_plan_validly() -> None:
    three = TOKENIZER.encode("3")[0]
    fast, masks = sampled_under_grammar({three: 100.0}, alone=True)
    assert TOKENIZER.decode(fast) == '{"a":3}' and masks >= 1
    assert sampled_under_grammar({}, alone=True)[1] == 0


def test_a_bias_that_wins_every_position_re_steers_the_plan_only_now_and_then() -> None:
    """Each re-steering copies the matcher, whose state grows with the output: one per token made a
    long biased answer quadratic. The output still passes the grammar at every token."""
    grammar = 'start: TEXT "." \nTEXT: /[a-z ]+/\n'
    favoured = TOKENIZER.encode("x")[0]
    plan = TOKENIZER.encode(" ".join(["word"] * 120) + ".")
    calls: list[int] = []

    def resteer(state: Matcher, rest: Sequence[int], room: int) -> list[int]:
        calls.append(room)
        steered = ENGINE.steer(
            cast(LLMatcher, state), grammar, rest, eos=(), max_tokens=room, rng=random.Random(1)
        )
        return steered.token_ids

    budget = 200
    out = sample_plan(
        plan, vocab=ENGINE.tokenizer().vocab_size, bias={favoured: 100.0}, top=None,
        matcher=ENGINE.matcher(grammar), resteer=resteer, budget=budget,
    )  # fmt: skip
    assert out.token_ids.count(favoured) > len(out.token_ids) // 2  # the bias won (nearly) everywhere
    assert 0 < len(calls) <= budget // RESTEER_EVERY + 2
    check = ENGINE.matcher(grammar)
    assert check.try_consume_tokens(out.token_ids) == len(out.token_ids)
