"""The sim engine under a constraint: its planned output, steered by the grammar's mask.

The sim follows its script (or echo) while the grammar allows the next scripted token, and otherwise
takes an allowed token (`constraints.engine.steer`), so a script that breaks the request's
tool_choice, schema or budget still yields a valid answer. Done once per request when it is
submitted, with a seeded choice (the request's seed, else the prompt's length): the same request
gives the same tokens streamed or not. Unconstrained requests never reach this module.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from agentserve.constraints.engine import GrammarEngine, GrammarError, engine_for, steer
from agentserve.constraints.spec import Constraint
from agentserve.worker.engine import InvalidRequestError, SamplingParams
from agentserve.worker.tokenizer import Tokenizer, tokenizer_json

_ENGINES: weakref.WeakKeyDictionary[Tokenizer, GrammarEngine] = weakref.WeakKeyDictionary()


def grammar_engine(tokenizer: Tokenizer, cache_size: int | None = None) -> GrammarEngine:
    """The grammar engine for a worker tokenizer (its tokenizer.json serialised once); `cache_size`
    (the worker's `constraint_cache_size`) sizes its compile cache."""
    engine = _ENGINES.get(tokenizer)
    if engine is None:
        engine = engine_for(
            tokenizer_json(tokenizer), **({} if cache_size is None else {"cache_size": cache_size})
        )
        _ENGINES[tokenizer] = engine
    elif cache_size is not None:
        engine.cache_size = max(engine.cache_size, cache_size)
    return engine


@dataclass(frozen=True, slots=True)
class ConstrainedPlan:
    token_ids: list[int]
    complete: bool  # the grammar accepted the output (False: the token budget ran out first)


def constrained_plan(
    tokenizer: Tokenizer,
    constraint: Constraint,
    *,
    script: Sequence[int],
    sampling: SamplingParams,
    need: int,
    seed: int,
) -> ConstrainedPlan:
    """At most `need` output tokens that the grammar allows, following `script` where it can."""
    engine = grammar_engine(tokenizer)
    eos = tuple(sampling.stop_token_ids)
    try:
        matcher = engine.matcher(constraint.grammar, eos)
    except GrammarError as exc:
        raise InvalidRequestError(f"the request's constraint does not compile: {exc}") from None
    steered = steer(
        matcher,
        script,
        max_tokens=need,
        rng=random.Random(seed),
        preferred=engine.preferred(eos),
        closing=engine.closing(eos),
        prefixes=engine.prefixes,
        text_closers=engine.text_closers(constraint.grammar),
        stop_ids=eos if sampling.include_stop else (),
    )
    return ConstrainedPlan(steered.token_ids, steered.complete)
