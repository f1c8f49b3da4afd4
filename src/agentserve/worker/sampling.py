"""The sim's sampling policy as a distribution: what its log-probabilities report and what
`logit_bias` changes (pure).

At each output position the sim's "model" puts logit `PREFERENCE` on the token its policy says next
(the script or echo; under a constraint, the grammar-steered token) and 0 on every other token of
the vocabulary. `logit_bias` is added to those logits, and the tokens a constraint's grammar masks
are out of the distribution. The sim samples greedily — the argmax, ties to the policy token, then
to the lowest id — so its output stays the policy's (reproducible for tests) unless a bias outweighs
the preference (OpenAI's +100 "exclusive selection", -100 "ban"). Its log-probabilities are the
log-softmax of those logits over the allowed tokens: the distribution it samples from, after masking
and bias (a token the grammar forces has log-probability 0.0). Temperature, top-p and top-k do not
change the sim's choice, so they are not applied to the reported distribution either.

Under a grammar the mask is computed only where it can matter: at every position when
log-probabilities are asked for (the reported distribution is the masked one), else only where a
bias could outrank the policy token (`_Rivals.certain`); a run of positions where none can is taken
as planned, checked by the grammar in one `try_consume_tokens` call.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentserve.worker.engine import TokenLogprob

PREFERENCE = 20.0  # the policy token's logit: p ≈ 1 − 4e-4 over a 151k vocabulary, without bias
_SET_BYTE = re.compile(rb"[^\x00]")  # a mask byte with an allowed token: skipped to at C speed


class Matcher(Protocol):
    """What sampling needs from a grammar matcher (llguidance's `LLMatcher`)."""

    def compute_bitmask(self) -> bytes: ...

    def try_consume_tokens(self, tokens: list[int]) -> int: ...

    def consume_token(self, token: int) -> bool: ...

    def is_stopped(self) -> bool: ...

    def is_accepting(self) -> bool: ...

    def deep_copy(self) -> Matcher: ...


@dataclass(frozen=True, slots=True)
class Allowed:
    """The tokens a step may choose: ids below `vocab`, and of those the bits set in `mask` (None:
    no grammar)."""

    vocab: int
    mask: bytes | None = None

    def __contains__(self, token: int) -> bool:
        if not 0 <= token < self.vocab:
            return False
        mask = self.mask
        return mask is None or (token >> 3 < len(mask) and (mask[token >> 3] >> (token & 7)) & 1 == 1)

    def count(self) -> int:
        if self.mask is None:
            return self.vocab
        bits = int.from_bytes(self.mask, "little") & ((1 << self.vocab) - 1)
        return bits.bit_count()

    def ascending(self) -> Iterator[int]:
        if self.mask is None:
            yield from range(self.vocab)
            return
        mask = self.mask
        for found in _SET_BYTE.finditer(mask):  # a narrow mask is mostly zero bytes
            byte_index = found.start()
            byte = mask[byte_index]
            for bit in range(8):
                token = byte_index * 8 + bit
                if (byte >> bit) & 1 and token < self.vocab:
                    yield token


@dataclass(frozen=True, slots=True)
class Choice:
    token: int
    entry: TokenLogprob | None  # None when no log-probabilities were asked for


def _rank(policy: int) -> Callable[[tuple[int, float]], tuple[float, bool, int]]:
    return lambda item: (-item[1], item[0] != policy, item[0])


def choose(policy: int, bias: Mapping[int, float], allowed: Allowed, top: int | None) -> Choice:
    """The sim's token at one position (see the module docstring) and, when `top` is not None, its
    log-probability with the `top` most likely alternatives."""
    logits = {t: b for t, b in bias.items() if t in allowed}
    if policy in allowed:
        logits[policy] = PREFERENCE + bias.get(policy, 0.0)
    count = allowed.count()
    free = count - len(logits)  # allowed tokens at logit 0
    rank = _rank(policy)
    ranked = sorted(logits.items(), key=rank)
    best: tuple[int, float] | None = ranked[0] if ranked else None
    if free and (best is None or best[1] <= 0.0):
        lowest = next((t for t in allowed.ascending() if t not in logits), None)
        if lowest is not None and (best is None or rank((lowest, 0.0)) < rank(best)):
            best = (lowest, 0.0)
    if best is None:  # nothing allowed (a stopped grammar): the policy's token, certain
        return Choice(policy, None if top is None else TokenLogprob(policy, 0.0))
    if top is None:
        return Choice(best[0], None)
    peak = max(best[1], 0.0 if free else best[1])
    total = sum(math.exp(v - peak) for v in logits.values()) + free * math.exp(-peak)
    log_z = peak + math.log(total)
    alternatives = _top(ranked, logits, allowed, policy, top) if top else []
    return Choice(
        best[0],
        TokenLogprob(best[0], best[1] - log_z, tuple((t, v - log_z) for t, v in alternatives)),
    )


def _top(
    ranked: Iterable[tuple[int, float]],
    special: Container[int],
    allowed: Allowed,
    policy: int,
    k: int,
) -> list[tuple[int, float]]:
    """The k most likely tokens, from `ranked` (the tokens with a logit of their own, most likely
    first) and the allowed tokens at logit 0 (lowest id first): lazily, so a long bias list costs
    only the k entries taken."""
    out: list[tuple[int, float]] = []
    items = iter(ranked)
    zeros: list[int] = []  # the ranked tokens at logit 0 (policy first, then by id: their rank order)
    below: tuple[int, float] | None = None
    for item in items:
        if item[1] > 0.0:
            out.append(item)
            if len(out) == k:
                return out
        elif item[1] == 0.0:
            zeros.append(item[0])
        else:
            below = item
            break
    unbiased = (t for t in allowed.ascending() if t not in special)
    for t in heapq.merge(zeros, unbiased, key=lambda t: (t != policy, t)):
        out.append((t, 0.0))
        if len(out) == k:
            return out
    if below is not None:
        out.append(below)
        out += itertools.islice(items, k - len(out))
    return out[:k]


class Unmasked:
    """`choose` without a grammar, the bias's share of the distribution computed once per request
    instead of at every position (a 300-token bias cost ~160 µs per token the other way)."""

    def __init__(self, bias: Mapping[int, float], vocab: int) -> None:
        self.vocab = vocab
        self.allowed = Allowed(vocab)
        self.bias = {t: b for t, b in bias.items() if 0 <= t < vocab}
        self.mass = sum(math.exp(b) for b in self.bias.values())  # biases ≤ 100: no overflow
        self.ranked = sorted(self.bias.items(), key=lambda kv: (-kv[1], kv[0]))

    def choose(self, policy: int, top: int | None) -> Choice:
        bias = self.bias
        if not 0 <= policy < self.vocab:
            return choose(policy, bias, self.allowed, top)
        own = PREFERENCE + bias.get(policy, 0.0)
        rank = _rank(policy)
        # The bias's ranking with the policy token moved to its place (its logit is its own).
        ranked = heapq.merge([(policy, own)], (kv for kv in self.ranked if kv[0] != policy), key=rank)
        head = list(itertools.islice(ranked, 1))
        best = head[0]
        free = self.vocab - len(bias) - (0 if policy in bias else 1)
        if free and best[1] <= 0.0:
            lowest = next(t for t in range(self.vocab) if t not in bias and t != policy)
            if rank((lowest, 0.0)) < rank(best):
                best = (lowest, 0.0)
        if top is None:
            return Choice(best[0], None)
        mass = self.mass - (math.exp(bias[policy]) if policy in bias else 0.0) + math.exp(own) + free
        log_z = math.log(mass)
        special = _With(bias, policy)
        alternatives = _top(itertools.chain(head, ranked), special, self.allowed, policy, top) if top else []
        return Choice(
            best[0], TokenLogprob(best[0], best[1] - log_z, tuple((t, v - log_z) for t, v in alternatives))
        )


@dataclass(frozen=True, slots=True)
class _With:
    """The tokens with a logit of their own: the biased ones and the policy's."""

    bias: Mapping[int, float]
    policy: int

    def __contains__(self, token: object) -> bool:
        return token == self.policy or token in self.bias


Resteer = Callable[[Matcher, Sequence[int], int], list[int]]


class _Rivals:
    """The two largest biases, to tell per position whether any other token could outrank the
    policy's (`certain`) without a mask."""

    def __init__(self, bias: Mapping[int, float]) -> None:
        top = heapq.nlargest(2, bias.items(), key=lambda kv: kv[1])
        self.first = top[0] if top else None
        self.second = top[1][1] if len(top) > 1 else None

    def certain(self, policy: int, bias: Mapping[int, float]) -> bool:
        """The policy token is the argmax wherever the grammar allows it: its logit is at least 0
        (every unbiased token's) and at least every other token's bias (ties go to the policy)."""
        own = PREFERENCE + bias.get(policy, 0.0)
        if own < 0.0:
            return False
        first = self.first
        rival = self.second if first is not None and first[0] == policy else (first[1] if first else None)
        return rival is None or own >= rival


# Tokens between re-steerings after a bias left the plan: each re-steering copies the matcher,
# whose state grows with the output (a bias that wins every position cost O(n²): 38 s for 48k
# tokens); between them the grammar's mask still keeps every token valid.
RESTEER_EVERY = 32


@dataclass(frozen=True, slots=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    complete: bool  # under a grammar: it accepted the output (always True without one)


def _ended(matcher: Matcher | None) -> bool:
    return matcher is None or matcher.is_stopped() or matcher.is_accepting()


def _left(
    todo: list[int], i: int, token: int, matcher: Matcher, resteer: Resteer, since: int, room: int
) -> tuple[list[int], bool]:
    """The plan after `token` replaced its position `i`, and whether it was re-steered: from a copy
    of `matcher` (the loop goes on consuming the new plan with it) at most every `RESTEER_EVERY`
    tokens (`since`); between, the mask keeps each next token valid, and a plan that ran out goes
    on as the bias pushed it."""
    if since >= RESTEER_EVERY:
        return [*todo[:i], token, *resteer(matcher.deep_copy(), todo[i + 1 :], room)], True
    if i + 1 >= len(todo):
        todo.append(token)
    return todo, False


def _plan_more(
    out: list[int],
    matcher: Matcher | None,
    resteer: Resteer | None,
    stale: bool,
    since: int,
    room: int,
) -> tuple[list[int], bool]:
    """Where a plan left by a bias (`stale`) ran out before the grammar ended: more of it, and
    whether it was re-steered. Within `RESTEER_EVERY` tokens of the last re-steering (`since`)
    the policy goes on as the bias pushed it; else the grammar's own way on from here."""
    if not stale or matcher is None or resteer is None or _ended(matcher):
        return [], False
    if out and since < RESTEER_EVERY:
        return [out[-1]], False
    return resteer(matcher.deep_copy(), [], room), True


def sample_plan(
    plan: Sequence[int],
    *,
    vocab: int,
    bias: Mapping[int, float],
    top: int | None,
    matcher: Matcher | None = None,
    resteer: Resteer | None = None,
    budget: int | None = None,
    plan_complete: bool = True,
) -> Sampled:
    """The sim's output for a planned output `plan` (the policy's tokens), position by position.

    Without a grammar a biased choice replaces the policy's token in place. Under one (`matcher` at
    the output's start) each position's distribution is masked by the grammar, and after a choice
    that left the plan the rest is steered again from there (`resteer(matcher, rest of the plan,
    tokens left)`, `budget` tokens in all), so every token still passes the grammar. Output that
    fills the budget is complete only where it ended there anyway: the grammar stopped, or it is
    the plan itself and the plan was complete (`plan_complete`)."""
    out: list[int] = []
    entries: list[TokenLogprob] | None = [] if top is not None else None
    todo = list(plan)
    limit = budget if budget is not None else len(todo)
    unmasked = Unmasked(bias, vocab) if matcher is None else None
    rivals = _Rivals(bias)
    i = 0
    resteered = -RESTEER_EVERY  # the output length at the last re-steering
    stale = False  # the plan was left since without re-steering: its rest may not fit
    while len(out) < limit:
        if i >= len(todo):
            more, fresh = _plan_more(out, matcher, resteer, stale, len(out) - resteered, limit - len(out))
            if not more:
                break
            if fresh:
                resteered, stale = len(out), False
            todo += more
            continue
        if unmasked is not None:
            choice = unmasked.choose(todo[i], top)
        else:
            assert matcher is not None
            if matcher.is_stopped():
                break
            if top is None:
                # The plan's positions where no bias can win are taken as planned, checked and
                # consumed in one call, no mask (module docstring); a refused one is masked below.
                end, j = min(len(todo), i + limit - len(out)), i
                while j < end and rivals.certain(todo[j], bias):
                    j += 1
                taken = matcher.try_consume_tokens(todo[i:j]) if j > i else 0
                if taken:
                    out += todo[i : i + taken]
                    i += taken
                    continue
            choice = choose(todo[i], bias, Allowed(vocab, bytes(matcher.compute_bitmask())), top)
        token = choice.token
        if matcher is not None and not matcher.consume_token(token):
            break
        out.append(token)
        if entries is not None and choice.entry is not None:
            entries.append(choice.entry)
        if token != todo[i] and matcher is not None and resteer is not None:
            todo, fresh = _left(todo, i, token, matcher, resteer, len(out) - resteered, limit - len(out))
            if fresh:
                resteered = len(out)
            stale = not fresh
        i += 1
    return Sampled(out, entries, _complete(matcher, out, limit, plan_complete and out == list(plan)))


def _complete(matcher: Matcher | None, out: list[int], limit: int, as_planned: bool) -> bool:
    """The output ended: no grammar, or it stopped, or it accepts before the budget, or where the
    budget cut it the plan itself ended there (`as_planned`: the complete plan, unchanged)."""
    if matcher is None or matcher.is_stopped():
        return True
    return matcher.is_accepting() and (len(out) < limit or as_planned)
