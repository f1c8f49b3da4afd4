"""The `Engine` protocol: what a worker needs from an inference engine, and the values it speaks.

An engine turns prompt token ids into a stream of `Step`s (new token ids and their text), aborts
requests nobody waits for, reports which of its KV blocks hold which prefix (`KvEvent`s, in
sequence-number order, with a snapshot to resync from) and how loaded it is (`Load`). The worker
never parses reasoning or tools: text goes out exactly as the model produced it.

Block hashes in KV events are `agentserve.prompt.hashing.block_hashes` values (chained XXH3-64 over
full blocks), the same numbers the frontend and router compute from a prompt.

Values here are frozen dataclasses with slots: steps are created per token on the hot path (`Step`
takes `agentserve.hotpath.fast_init`'s constructor: its rarely used fields cost little per token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeAlias, runtime_checkable

from agentserve.constraints.spec import Constraint
from agentserve.conversation import FinishReason, Usage
from agentserve.hotpath import fast_init
from agentserve.sampling import SAMPLERS, Samplers

# --------------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True, slots=True)
class SamplingParams(Samplers):
    """Decoding settings: the samplers (`agentserve.sampling`) and what the frontend adds.
    `max_tokens` is always explicit (TensorRT-LLM's own default is 32)."""

    max_tokens: int = 1024
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    # TensorRT-LLM's `include_stop_str_in_output` (default False: a matched stop token/string is cut
    # from the output). The frontend sets it for the family's end-of-turn tokens so the parser and the
    # drift detector see the model's raw output, terminator included.
    include_stop: bool = False
    ignore_eos: bool = False  # keep generating until max_tokens (benchmarks)
    # Log-probabilities: None asks for none; k ≥ 0 asks for each output token's own and the k most
    # likely alternatives (OpenAI `top_logprobs`, at most 20; TensorRT-LLM's `logprobs`).
    logprobs: int | None = None
    # (token id, bias) pairs added to the logits before sampling (OpenAI `logit_bias`: -100..100).
    logit_bias: tuple[tuple[int, float], ...] = ()


# Every field of an engine request's settings (the wire refuses others).
SAMPLING_FIELDS: frozenset[str] = frozenset(f.name for f in fields(SamplingParams))


def samplers_and_stops(params: SamplingParams) -> dict[str, Any]:
    """The samplers `params` sets and its stop strings and token ids (as lists), by their field
    names: what the worker wire and TensorRT-LLM's SamplingParams both take under those names."""
    out: dict[str, Any] = {}
    for name, _ in SAMPLERS:
        value = getattr(params, name)
        if value is not None:
            out[name] = value
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    return out


@dataclass(frozen=True, slots=True)
class Hints:
    """What the frontend knows about the conversation; real engines ignore it.

    The simulated engine's output policies read it (which turn this is, what the last messages
    said); without hints they fall back to reading the decoded prompt.
    """

    turn: int | None = None  # 1-based: this is the N-th model response of the conversation
    last_user_message: str | None = None
    last_message: str | None = None  # text of the last message of any role (e.g. a tool result)
    # A migrated request (router.dispatch): the prompt ends with this many tokens the model already
    # generated on a worker that died. A real model simply continues; the sim skips that much of
    # its scripted output, so a migrated stream says exactly what an uninterrupted one would.
    resumed_tokens: int = 0


MEDIUM_GPU = "gpu"
MEDIUM_CPU = "cpu"

# Retention priorities use TensorRT-LLM's scale (KvCacheRetentionConfig): 0 (evict first) .. 100
# (evict last); blocks nobody asked to keep have the default priority 35.
RETENTION_PRIORITY_MIN = 0
RETENTION_PRIORITY_DEFAULT = 35
RETENTION_PRIORITY_MAX = 100


@dataclass(frozen=True, slots=True)
class TokenRangeRetention:
    """Keep the KV blocks of prompt tokens [start, end) at `priority` for `duration_s` seconds
    after the request finishes (None: until evicted by a higher priority); `end` None = to the
    end of the prompt. Past the duration the blocks fall back to the default priority."""

    start: int
    end: int | None
    priority: int
    duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a request's KV blocks should outlive it, decided by the frontend's retention
    policy (`agentserve.prompt`/frontend side) and mapped by each engine onto its own cache
    (the sim's priority classes; TensorRT-LLM's `KvCacheRetentionConfig`)."""

    ranges: tuple[TokenRangeRetention, ...] = ()
    decode_priority: int | None = None  # blocks holding generated tokens
    decode_duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """A prompt's KV held by a prefill worker for a decode worker to pull (disaggregated prefill).

    A context-only request's last step carries it (`handle`, `tokens`); the dispatcher adds where
    to pull from (`source`: the prefill worker's address) and the predicted transfer time, and sends
    it with the generation request to the decode worker. TensorRT-LLM's equivalent is the context
    response's `DisaggregatedParams` (ctx_request_id, opaque_state).
    """

    handle: str  # the prefill worker's name for the held KV (its context-only request id)
    tokens: int  # leading prompt tokens whose KV it holds
    source: str = ""  # the prefill worker's address (an in-process engine's id, or its URL)
    seconds: float = 0.0  # predicted transfer time (the sim delays the request by it)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0  # higher is scheduled first (the sim honours it; FCFS within a priority)
    hints: Hints | None = None
    retention: Retention | None = None  # None: the engine's default (plain LRU)
    # nvext.cache_salt: requests with different salts never share KV blocks (TensorRT-LLM
    # `generate_async(cache_salt=…)`); the sim engine does not model salts.
    cache_salt: str | None = None
    # Attention data parallelism: the rank whose KV cache the router chose (None: the engine
    # balances). TensorRT-LLM pins it with `SchedulingParams(attention_dp_rank=…,
    # attention_dp_relax=False)`; the sim's `--sim-dp-ranks` engine runs it on that rank.
    dp_rank: int | None = None
    # What the output must match (tool choice, strict schemas, output format, thinking budget), built
    # and checked by the frontend; None: unconstrained (no cost anywhere).
    constraint: Constraint | None = None
    # Disaggregated prefill. `context_only`: prefill the prompt, emit one token and hold the prompt's
    # KV for a decode worker to pull (the last step's `kv_transfer` names it). `kv_transfer`: the
    # prompt's KV waits on a prefill worker; pull it instead of prefilling (if the pull fails, prefill
    # locally: the request is served either way).
    context_only: bool = False
    kv_transfer: KvTransfer | None = None


# --------------------------------------------------------------------------------------------------
# Output


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One output token's log-probability under the distribution it was sampled from, and the
    most likely alternatives (`top`: (token id, log-probability), most likely first; as many as
    `SamplingParams.logprobs` asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@fast_init  # created per token: each field's store is paid per token
@dataclass(frozen=True, slots=True)
class Step:
    """New output since the previous step of the same request.

    A consumer that falls behind gets one step carrying all tokens produced meanwhile (as with
    TensorRT-LLM's `token_ids_diff`), so `token_ids` may hold several ids. `cached_tokens` (prompt
    tokens served from the KV cache) is set on the first step only; `finish_reason` and `usage` on
    the last step only.
    """

    token_ids: Sequence[int]
    text: str
    cached_tokens: int | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    # One entry per token id when the request asked for log-probabilities (None otherwise).
    logprobs: Sequence[TokenLogprob] | None = None
    # Disaggregated prefill: on the last step of a context-only request, the KV held for a pull;
    # on the first step of a request that came with `kv_transfer`, the prompt tokens whose KV
    # arrived (0: the pull failed and the worker prefilled them itself).
    kv_transfer: KvTransfer | None = None
    received_tokens: int | None = None


class StepStream(Protocol):
    """The steps of one request. Closing it before the last step aborts the request."""

    def __aiter__(self) -> AsyncIterator[Step]: ...

    async def __anext__(self) -> Step: ...

    async def aclose(self) -> None: ...


# --------------------------------------------------------------------------------------------------
# KV events


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks now held in the KV cache, in prefix order, each chained to the one before.

    `parent_hash` is the hash of the block right before `block_hashes[0]` (None: they start the
    prompt). `num_tokens` = tokens covered = len(block_hashes) × block size.

    `medium` is the tier now holding them, as in TensorRT-LLM's and Dynamo's events: "gpu" (device
    memory) or "cpu" (the host tier). A block lives in one tier at a time: a stored event for a hash
    already held moves it (a GPU block spilled to host, a host block brought back).
    """

    seq: int
    block_hashes: tuple[int, ...]
    parent_hash: int | None
    num_tokens: int
    medium: str = "gpu"
    dp_rank: int | None = None  # the attention-DP rank whose cache changed (None: no attention DP)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks dropped from every tier (`medium`: the tier they were last held in)."""

    seq: int
    block_hashes: tuple[int, ...]
    medium: str = "gpu"
    dp_rank: int | None = None


@dataclass(frozen=True, slots=True)
class AllCleared:
    """The engine dropped every block (startup, reset): a subscriber forgets this worker's blocks."""

    seq: int
    dp_rank: int | None = None


KvEvent: TypeAlias = BlockStored | BlockRemoved | AllCleared


@dataclass(frozen=True, slots=True)
class KvSnapshot:
    """Every block hash stored after event `seq` was applied: resync point after a gap."""

    seq: int
    block_size: int
    block_hashes: tuple[int, ...]
    host_block_hashes: tuple[int, ...] = ()  # held in the host tier (not in `block_hashes`)
    dp_rank: int | None = None  # the attention-DP rank it describes (None: no attention DP)


# --------------------------------------------------------------------------------------------------
# Load and counters


@dataclass(frozen=True, slots=True)
class Load:
    running: int  # requests admitted to the batch
    waiting: int  # requests queued for admission
    kv_blocks_used: int  # blocks referenced by running requests
    kv_blocks_total: int
    kv_blocks_cached: int = 0  # free blocks still holding a reusable prefix (evictable)
    # Of those, blocks kept above the default priority (agent sessions in a tool gap, the shared
    # prefix): what the planner will not scale below.
    kv_blocks_retained: int = 0
    # Of those, blocks kept without expiry (the shared system+tools prefix): every worker keeps its
    # own copy, so a planner counts them per worker, not summed over the fleet.
    kv_blocks_pinned: int = 0
    kv_host_blocks_used: int = 0  # blocks held in the host (CPU) tier
    kv_host_blocks_total: int = 0  # size of the host tier (0: none)
    # Cumulative counters since start (Prometheus counters are read from these).
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    preemptions: int = 0
    constrained_requests: int = 0  # requests that came with a constraint (`constraints.spec`)
    # CPU seconds this process spent enforcing them (compiling grammars, steering under the mask):
    # None where the engine does that out of sight (TensorRT-LLM's guided decoder, in its executor).
    constraint_cpu_seconds: float | None = None

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


# --------------------------------------------------------------------------------------------------
# Errors


class EngineError(Exception):
    """An engine could not serve a request (base class)."""


class InvalidRequestError(EngineError):
    """The request can never be served as given (empty prompt, larger than the KV cache, …)."""


class DuplicateRequestError(EngineError):
    """A request with this id is still running."""


class EngineNotReadyError(EngineError):
    """The engine is not started (model still loading, or stopped)."""


# --------------------------------------------------------------------------------------------------
# The protocol


@runtime_checkable
class Engine(Protocol):
    @property
    def block_size(self) -> int:
        """Tokens per KV block (must match the router's)."""
        ...

    @property
    def ready(self) -> bool:
        """The model is loaded and `generate` accepts requests."""
        ...

    async def start(self) -> None:
        """Load the model and start the engine loop (may take minutes for a real engine)."""
        ...

    async def stop(self) -> None:
        """Abort everything and release resources."""
        ...

    def generate(self, request: GenerateRequest) -> StepStream:
        """Submit a request; raises `EngineError` subclasses synchronously if it cannot be queued."""
        ...

    def abort(self, request_id: str) -> bool:
        """Abort a request; its stream ends with finish reason `abort`. False if unknown/finished."""
        ...

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        """A new subscription: batches of events in sequence order, from now on, without gaps."""
        ...

    def kv_snapshot(self, dp_rank: int | None = None) -> KvSnapshot:
        """Every block stored now. An engine with attention-DP ranks (`dp_ranks` > 1) keeps one
        event stream and one snapshot per rank: its events carry `dp_rank`, numbered per rank."""
        ...

    def load(self) -> Load: ...
