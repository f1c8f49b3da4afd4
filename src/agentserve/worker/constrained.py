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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from llguidance import LLMatcher

from agentserve.constraints.engine import GrammarEngine, GrammarError, engine_for
from agentserve.constraints.spec import Constraint
from agentserve.worker.engine import InvalidRequestError, SamplingParams
from agentserve.worker.sampling import Matcher, Sampled, sample_plan
from agentserve.worker.tokenizer import Tokenizer, token_pieces, tokenizer_json

PIECE_WINDOW = 32  # token_pieces' look-ahead (as the sim's own plans)

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
    pieces: list[str]  # each token's streamed text (`token_pieces`), joining to the decoded output
    complete: bool  # the output ended, and the grammar accepts it (False: the token budget cut it)


PLAN_CACHE = 256  # steered plans remembered: the same script under the same grammar and seed
_plans: OrderedDict[tuple[object, ...], ConstrainedPlan] = OrderedDict()


def constrained_plan(
    tokenizer: Tokenizer,
    constraint: Constraint,
    *,
    script: Sequence[int],
    pieces: Sequence[str],
    sampling: SamplingParams,
    need: int,
    seed: int,
) -> ConstrainedPlan:
    """At most `need` output tokens that the grammar allows, following `script` (whose streamed
    pieces are `pieces`) where it can. Memoized, as the sim memoizes its unconstrained plans: a
    scripted output is the same for every request, and steering is a pure function of the script,
    the grammar, the seed and the stop tokens."""
    eos = tuple(sampling.stop_token_ids)
    # Most plans never draw from the seeded generator (the script, forced tokens and preferred
    # closers decide): those are remembered without the seed and shared by every request.
    unseeded = (constraint.grammar, tuple(script), need, eos, sampling.include_stop, id(tokenizer))
    seeded = (*unseeded, seed)
    for key in (unseeded, seeded):
        hit = _plans.get(key)
        if hit is not None:
            _plans.move_to_end(key)
            return hit
    engine = grammar_engine(tokenizer)
    try:
        matcher = engine.matcher(constraint.grammar, eos)
    except GrammarError as exc:
        raise InvalidRequestError(f"the request's constraint does not compile: {exc}") from None
    steered = engine.steer(
        matcher,
        constraint.grammar,
        script,
        eos=eos,
        max_tokens=need,
        rng=seed,
        stop_ids=eos if sampling.include_stop else (),
        at_start=True,
    )
    ids = steered.token_ids
    plan = ConstrainedPlan(ids, _pieces(tokenizer, ids, steered.copied, pieces), steered.complete)
    _plans[seeded if steered.random_choices else unseeded] = plan
    if len(_plans) > PLAN_CACHE:
        _plans.popitem(last=False)
    return plan


def constrained_sample(
    tokenizer: Tokenizer,
    constraint: Constraint,
    plan: Sequence[int],
    *,
    sampling: SamplingParams,
    need: int,
    seed: int,
    plan_complete: bool = True,
) -> Sampled:
    """The steered `plan` sampled under the grammar's mask with the request's logit_bias and, when
    asked, its log-probabilities (`worker/sampling.py`); where a bias leaves the plan, the rest is
    steered again from the chosen token (same seed), so the output still passes the grammar."""
    eos = tuple(sampling.stop_token_ids)
    engine = grammar_engine(tokenizer)
    try:
        matcher = engine.matcher(constraint.grammar, eos)
    except GrammarError as exc:
        raise InvalidRequestError(f"the request's constraint does not compile: {exc}") from None
    rng = random.Random(seed)

    def resteer(state: Matcher, rest: Sequence[int], room: int) -> list[int]:
        return engine.steer(
            cast(LLMatcher, state),  # sample_plan hands back copies of `matcher`
            constraint.grammar,
            rest,
            eos=eos,
            max_tokens=room,
            rng=rng,
            stop_ids=eos if sampling.include_stop else (),
        ).token_ids

    return sample_plan(
        plan,
        vocab=engine.tokenizer(eos).vocab_size,
        bias=dict(sampling.logit_bias),
        top=sampling.logprobs,
        matcher=matcher,
        resteer=resteer,
        budget=need,
        plan_complete=plan_complete,
    )


def vocab_size(tokenizer: Tokenizer) -> int:
    """Token ids the worker's tokenizer knows (what an unconstrained distribution spans)."""
    return grammar_engine(tokenizer).tokenizer().vocab_size


def _pieces(
    tokenizer: Tokenizer,
    ids: list[int],
    copied: Sequence[tuple[int, int, int]],
    pieces: Sequence[str],
    fast: bool = True,
) -> list[str]:
    """The streamed pieces of `ids`: the script's own (`pieces`) for each run copied from the script
    (`copied`: output position, script position, length), fresh ones for the tokens between, kept
    only where they join to the decoded output (else all cut afresh). Cutting pieces costs ~2.5 µs
    a token, more than steering it: only the grammar's tokens are cut anew, and those first as each
    token's own text (`_alone`, cached: `"`, `}`, `<tool_call>`), the cut only where one does not
    decode alone or the result does not join to the output. A copied run's pieces join in the
    script's context, so only the seams are checked (`_seams_join`: decoding a whole output cost
    as much as validating it); where one does not join, the whole output is checked."""
    out: list[str] = []
    seams: list[tuple[int, int]] = []  # output spans whose pieces were not copied whole in context
    k = 0

    def cut(segment: list[int]) -> list[str]:
        alone = _alone(tokenizer, segment) if fast else None
        return alone if alone is not None else token_pieces(tokenizer, segment, PIECE_WINDOW)

    for at, start, length in copied:
        if start + length > len(pieces):
            break  # the script's pieces stop short (never, as the sim cuts them): cut the rest
        if at > k:
            out += cut(ids[k:at])
        if at > k or start > 0:
            seams.append((k, at))  # the fresh tokens before the run (or where it joins the last)
        out += pieces[start : start + length]
        k = at + length
        if start + length < len(pieces):
            seams.append((k, k))  # the script goes on past the run: its last piece may differ
    if k < len(ids):
        out += cut(ids[k:])
        seams.append((k, len(ids)))
    if fast and _seams_join(tokenizer, ids, out, seams):
        return out
    text = tokenizer.decode(ids)
    joined = "".join(out)
    if text == joined:
        return out
    if fast:  # a token's text depends on its neighbours here: cut them
        return _pieces(tokenizer, ids, copied, pieces, fast=False)
    if out and text.startswith(joined):  # the script held text for tokens past the cut
        out[-1] += text[len(joined) :]
        return out
    return token_pieces(tokenizer, ids, PIECE_WINDOW)


def _seams_join(
    tokenizer: Tokenizer, ids: list[int], out: Sequence[str], seams: Sequence[tuple[int, int]]
) -> bool:
    """Whether the pieces join to the decoded tokens around each seam (`PIECE_WINDOW` tokens either
    side, the locality `token_pieces` assumes); False also where a window cannot tell (it starts
    inside a character), and the caller checks the whole output."""
    windows: list[list[int]] = []
    for lo, hi in seams:
        lo, hi = max(0, lo - PIECE_WINDOW), min(len(ids), hi + PIECE_WINDOW)
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    return all(tokenizer.decode(ids[lo:hi]) == "".join(out[lo:hi]) for lo, hi in windows)


_ALONE: weakref.WeakKeyDictionary[Tokenizer, dict[int, str | None]] = weakref.WeakKeyDictionary()
_ALONE_SIZE = 1 << 16


def _alone(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str] | None:
    """Each token's text decoded alone, or None where one has none of its own (a part of a UTF-8
    character, nothing). Whether they join in context is `_pieces`' check."""
    known = _ALONE.get(tokenizer)
    if known is None:
        known = _ALONE[tokenizer] = {}
    out: list[str] = []
    for token in ids:
        if token in known:
            piece = known[token]
        else:
            text = tokenizer.decode([token])
            piece = text if text and "\ufffd" not in text else None
            if len(known) < _ALONE_SIZE:
                known[token] = piece
        if piece is None:
            return None
        out.append(piece)
    return out
