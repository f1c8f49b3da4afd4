"""Where a request's prompt is prefilled: on its decode worker, or on a prefill worker whose KV is
then shipped to the decode worker (disaggregated prefill, decided per request). Pure.

Agent traffic is mostly prefix hits needing a few hundred new tokens (shipping their KV would only
add a hop), with a minority of cold 50–150K-token prefills that, batched with decoding streams,
stall every one of them for seconds. The router already knows how many prompt tokens each worker
has cached, so the rule is the one TensorRT-LLM's conditional disaggregation
(`max_local_prefill_length`) and Dynamo's `isl_bounding` policy use:

    remote  iff  a prefill worker is up  and  tokens uncached on the chosen decode worker > threshold
                 and  the remote path costs less than the local one

The costs are seconds of delay the choice causes. Local: the request's own time to first token plus,
for each stream decoding on that worker, the stall its prefill chunks add to their iterations.
Remote: the request's time to first token there: the prefill worker's backlog, its prefill of what
it lacks, the KV transfer (the decode batch is not slowed). The comparison keeps cold prompts off a
busy decode worker while the prefill pool keeps up, and falls back to local prefill when the pool's
backlog would cost more than the stall (its capacity is not the only prefill capacity there is).

The default threshold comes from the timing model: the largest chunk the decode worker can prefill
while one of its iterations takes at most `ITL_BUDGET` × a decode-only iteration of a reference batch
(`REFERENCE_DECODES` streams at `REFERENCE_CONTEXT` tokens). Past it, local prefill stretches every
decoding stream's inter-token latency beyond the budget, while remote prefill + transfer delays only
the request itself (the transfer runs beside the decode worker's iterations).

Each decision carries its predicted costs, for the trace: the local path's time to first token and
the stall it adds to each decoding stream there, and the remote path's time to first token (the
prefill worker's queued work, its prefill of what it lacks, the KV transfer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentserve.worker.kvtransfer import transfer_seconds
from agentserve.worker.timing import Interconnect, StepWork, TimingModel

ITL_BUDGET = 2.0  # a local prefill chunk may make a decode iteration at most this much longer
REFERENCE_DECODES = 64  # decoding streams on the decode worker the default threshold protects
REFERENCE_CONTEXT = 8192  # their context length
DEFAULT_CHUNK = 8192  # tokens prefilled per iteration (the scheduler's max_num_tokens)

Where = Literal["local", "remote"]


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """The prefill decision of one request and what it predicted (the trace records it)."""

    where: Where
    reason: str  # below-threshold | no-prefill-worker | prefill-busy | remote
    uncached_tokens: int  # prompt tokens the decode worker lacks
    threshold: int
    local_ttft_s: float  # predicted: prefill on the decode worker, mixed with its decoding streams
    local_stall_s: float  # predicted: extra time each decoding stream there waits meanwhile
    prefill_worker: str | None = None
    remote_ttft_s: float | None = None  # predicted: queue + prefill there + KV transfer
    transfer_tokens: int = 0  # tokens whose KV is shipped (those the decode worker lacks)
    transfer_s: float = 0.0
    ticket: int | None = None  # the prefill worker's load ticket (finished when its prefill ends)


@dataclass(frozen=True, slots=True)
class PrefillCandidate:
    """A prefill worker as the router sees it: its cached prefix of this prompt and its backlog."""

    worker: str
    cached_tokens: int
    queued_s: float = 0.0  # predicted prefill time of the requests routed there and not finished


def prefill_seconds(model: TimingModel, tokens: int, start: int = 0, chunk: int = DEFAULT_CHUNK) -> float:
    """Time to prefill `tokens` new tokens after `start` cached ones, alone, in `chunk`-token iterations."""
    t, pos, left = 0.0, start, tokens
    while left > 0:
        n = min(chunk, left)
        t += model.step_seconds(StepWork(((pos, n),)))
        pos, left = pos + n, left - n
    return t


def local_prefill(
    model: TimingModel,
    tokens: int,
    start: int,
    decoding: int,
    *,
    context: int = REFERENCE_CONTEXT,
    chunk: int = DEFAULT_CHUNK,
) -> tuple[float, float]:
    """(time to prefill `tokens` after `start` on a worker decoding `decoding` streams of `context`
    tokens, extra seconds each of those streams waits meanwhile): chunk by chunk, a mixed
    iteration against the decode-only one it displaces."""
    decodes = (context,) * decoding
    alone = model.step_seconds(StepWork((), decodes)) if decoding else 0.0
    ttft = stall = 0.0
    pos, left = start, tokens
    while left > 0:
        n = min(chunk, left)
        mixed = model.step_seconds(StepWork(((pos, n),), decodes))
        ttft += mixed
        stall += mixed - alone
        pos, left = pos + n, left - n
    return ttft, stall if decoding else 0.0


def default_threshold(
    model: TimingModel,
    *,
    decoding: int = REFERENCE_DECODES,
    context: int = REFERENCE_CONTEXT,
    chunk: int = DEFAULT_CHUNK,
    budget: float = ITL_BUDGET,
) -> int:
    """The largest prefill chunk (≤ `chunk`) a worker decoding `decoding` streams of `context`
    tokens can take while its iteration stays within `budget` × the decode-only one."""
    decodes = (context,) * decoding
    limit = budget * model.step_seconds(StepWork((), decodes))
    if model.step_seconds(StepWork(((0, chunk),), decodes)) <= limit:
        return chunk
    lo, hi = 0, chunk  # step time is non-decreasing in the chunk: bisect the last n within the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if model.step_seconds(StepWork(((0, mid),), decodes)) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def decide_prefill(
    model: TimingModel,
    link: Interconnect,
    *,
    prompt_tokens: int,
    decode_cached_tokens: int,
    decoding: int,
    threshold: int,
    candidates: tuple[PrefillCandidate, ...] | list[PrefillCandidate] = (),
    chunk: int = DEFAULT_CHUNK,
    context: int = REFERENCE_CONTEXT,
    compare_costs: bool = True,
) -> PrefillPlan:
    """Prefill locally or on the candidate predicted to deliver the KV first.

    `decode_cached_tokens`: the prompt's prefix cached on the chosen decode worker; `decoding`: the
    requests running there (their context is taken as `context`; at least one is assumed). A
    candidate's predicted time is its backlog, its prefill of what it lacks, and the transfer of
    what the decode worker lacks. A plan that stays local because the best candidate costs more
    keeps the candidate's prediction; `compare_costs` False goes remote on the threshold alone
    (TensorRT-LLM's `max_local_prefill_length`).
    """
    cached = max(0, min(decode_cached_tokens, prompt_tokens))
    uncached = prompt_tokens - cached
    # At least one stream: a decode worker idle now takes streams while a long prefill would run.
    streams = max(decoding, 1)
    local_ttft, local_stall = local_prefill(model, uncached, cached, streams, context=context, chunk=chunk)
    plan = PrefillPlan("local", "below-threshold", uncached, threshold, local_ttft, local_stall)
    if uncached <= threshold:
        return plan
    if not candidates:
        return PrefillPlan("local", "no-prefill-worker", uncached, threshold, local_ttft, local_stall)
    transfer_s = transfer_seconds(uncached, model.kv_bytes_per_token, link)
    best: tuple[float, PrefillCandidate] | None = None
    for c in candidates:
        have = max(0, min(c.cached_tokens, prompt_tokens - 1))  # at least one token computes logits
        ttft = c.queued_s + prefill_seconds(model, prompt_tokens - have, have, chunk) + transfer_s
        if best is None or ttft < best[0]:
            best = (ttft, c)
    assert best is not None
    busy = compare_costs and best[0] >= local_ttft + streams * local_stall
    return PrefillPlan(
        "local" if busy else "remote",
        "prefill-busy" if busy else "remote",
        uncached,
        threshold,
        local_ttft,
        local_stall,
        prefill_worker=best[1].worker,
        remote_ttft_s=best[0],
        transfer_tokens=uncached,
        transfer_s=transfer_s,
    )
