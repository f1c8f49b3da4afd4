"""Predict TTFT and ITL for a candidate worker count from the engine's timing model (pure).

The demand is what the fleet served over the last window (`Demand`): new requests per second, their
uncached prompt tokens (the prefix cache already took its share), output tokens and the context they
decode at. Spread over N workers, each worker sees λ/N requests per second. In the steady state of
continuous batching with chunked prefill:

- a decoding request stays for OSL iterations, so a worker decodes B = λ/N · OSL · t̄ sequences at
  once (Little's law, t̄ the mean iteration time);
- each request's uncached prompt takes k = ⌈U / chunk⌉ iterations that also prefill, so a fraction
  f = λ/N · k · t̄ of iterations are *mixed* (prefill + decode) and the rest decode only;
- t̄ = (1 − f) · t_decode(B) + f · t_mixed(B), solved by fixed-point iteration; f ≥ 1 means the worker
  cannot keep up (saturated: the prediction is infinite).

TTFT = half an iteration (arrival to the next iteration) + the request's own k mixed iterations +
the wait behind other prefills (M/D/1: ρ / (2(1 − ρ)) of a prefill, ρ = f). ITL is the tail agents feel:
the mixed iteration once more than `itl_quantile` of iterations are mixed, else the decode-only one
(a prefill chunk batched with decodes inflates their step 2–18× on an H200: docs/worker.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentserve.worker.timing import StepWork, TimingModel

FIXED_POINT_ROUNDS = 60


@dataclass(frozen=True, slots=True)
class Demand:
    """What the fleet is asked to do, independent of how many workers do it."""

    request_rate: float  # new requests (turns) per second
    uncached_tokens: float  # mean prompt tokens each request prefills (not served by the cache)
    cached_tokens: float  # mean prompt tokens each request found cached (where its prefill starts)
    output_tokens: float  # mean output tokens per request
    context_tokens: float  # mean context of a decoding sequence


@dataclass(frozen=True, slots=True)
class Prediction:
    workers: int
    ttft_s: float
    itl_s: float  # the tail iteration time a decoding stream sees (see the module docstring)
    mean_step_s: float
    decoding: float  # sequences decoding per worker
    mixed_share: float  # share of iterations that prefill (≥ 1: saturated)

    @property
    def saturated(self) -> bool:
        return math.isinf(self.ttft_s)


def predict(
    demand: Demand, workers: int, timing: TimingModel, *, chunk: int = 8192, itl_quantile: float = 0.1
) -> Prediction:
    """TTFT and ITL with `workers` workers under `demand` (module docstring)."""
    if workers < 1:
        raise ValueError("at least one worker")
    rate = demand.request_rate / workers
    uncached = max(demand.uncached_tokens, 1.0)
    k = math.ceil(uncached / chunk)
    ctx = int(demand.context_tokens)
    start = int(demand.cached_tokens)
    first_chunk = int(min(uncached, chunk))

    def steps(decoding: float) -> tuple[float, float]:
        b = max(round(decoding), 1)  # the stream whose ITL this is decodes too
        decode = StepWork(decode=(ctx,) * b)
        mixed = StepWork(prefill=((start, first_chunk),), decode=(ctx,) * b)
        return timing.step_seconds(decode), timing.step_seconds(mixed)

    t_decode, t_mixed = steps(0)
    mean = t_decode
    f = 0.0
    decoding = 0.0
    for _ in range(FIXED_POINT_ROUNDS):
        decoding = rate * demand.output_tokens * mean
        t_decode, t_mixed = steps(decoding)
        f = rate * k * mean
        if f >= 1.0:
            return Prediction(workers, math.inf, t_mixed, math.inf, decoding, f)
        new = (1 - f) * t_decode + f * t_mixed
        if abs(new - mean) <= 1e-9 + 1e-6 * mean:
            mean = new
            break
        mean = new
    f = rate * k * mean
    if f >= 1.0:
        return Prediction(workers, math.inf, t_mixed, math.inf, decoding, f)
    decode = (ctx,) * max(round(decoding), 1)
    own_prefill = _prefill_seconds(timing, (start, int(uncached)), chunk, decode)
    wait = f / (2 * (1 - f)) * own_prefill
    ttft = mean / 2 + own_prefill + wait
    itl = t_mixed if f > itl_quantile else t_decode
    return Prediction(workers, ttft, itl, mean, decoding, f)


def _prefill_seconds(
    timing: TimingModel, prompt: tuple[int, int], chunk: int, decode: tuple[int, ...]
) -> float:
    """A request's own prefill iterations ((cached start, uncached tokens), `chunk` at a time), each
    batched with the decoding sequences."""
    start, uncached = prompt
    total, done = 0.0, 0
    while done < uncached:
        n = min(chunk, uncached - done)
        total += timing.step_seconds(StepWork(prefill=((start + done, n),), decode=decode))
        done += n
    return total
