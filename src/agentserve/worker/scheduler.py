"""Continuous batching over a paged KV pool: the simulated engine's scheduler (pure, no I/O).

Every sequence has the same life, whether its tokens are prompt or output: each iteration computes
some of its not-yet-computed tokens (a prefill chunk, or the one token sampled last iteration) and,
once every token it has is computed, samples the next token. The scheduler decides, per iteration:

1. Running sequences first, highest priority then oldest, each getting its uncomputed tokens up to
   the iteration's token budget (`max_num_tokens`; with chunked prefill a long prompt takes several
   iterations). A sequence that needs a new block when the pool is full preempts the lowest-priority,
   newest running sequence (recompute: its blocks stay cached, so it re-admits with prefix hits).
2. Then waiting sequences, highest priority then oldest, while batch slots (`max_batch_size`),
   token budget and blocks allow. Admission reuses the longest cached prefix (chained block hashes);
   the tokens reused are reported once as the request's cached tokens.

Full blocks are hashed and committed to the pool as soon as they are computed, so the pool's KV
events match what a real engine with block reuse publishes. Output tokens come from the sequence's
planned output (the engine's output policy decided it at submission).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentserve.conversation import FinishReason
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import KvEvent, Retention
from agentserve.worker.kvpool import KvPool, block_retentions
from agentserve.worker.timing import StepWork


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    chunked_prefill: bool = True
    prefix_caching: bool = True  # off: blocks stay private to their sequence, nothing is reused

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_num_tokens < 1:
            raise ValueError("max_batch_size and max_num_tokens must be positive")


@dataclass(eq=False, slots=True)
class SimSequence:
    request_id: str
    tokens: list[int]  # prompt, then the output tokens emitted so far
    prompt_len: int
    output: Sequence[int]  # the planned output token ids
    end_reason: FinishReason  # reported when the planned output is exhausted
    priority: int = 0
    arrival: int = 0
    hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks of `tokens`
    held: int = 0  # leading blocks of `hashes` this sequence references in the pool
    private: int = 0  # private (unhashed) blocks it holds: the partial tail
    computed: int = 0  # tokens whose KV is computed
    emitted: int = 0
    cached_tokens: int | None = None  # prefix hit at first admission (GPU or host tier)
    host_tokens: int = 0  # of those, brought back from the host tier
    retention: Retention | None = None  # how long its blocks outlive it (None: default class)
    # Prompt tokens whose KV arrived from a prefill worker (disaggregated prefill): at admission
    # the blocks this pool lacks among them are stored as computed instead of being prefilled.
    received_tokens: int = 0
    received: int = 0  # of those, computed tokens this pool lacked (stored from the transfer)
    decoding: bool = False
    state: str = "new"  # new, waiting, running, finished


@dataclass(slots=True)
class StepOutcome:
    work: StepWork
    started: list[SimSequence]  # admitted for the first time (cached_tokens now known)
    emitted: list[SimSequence]  # each emitted one token: seq.output[seq.emitted - 1]
    finished: list[tuple[SimSequence, FinishReason]]
    preempted: list[SimSequence]
    events: list[KvEvent]


class Scheduler:
    def __init__(self, pool: KvPool, config: SchedulerConfig, hash_seed: int = 0) -> None:
        self.pool = pool
        self.config = config
        self.hash_seed = hash_seed
        self.block_size = pool.block_size
        self.running: list[SimSequence] = []
        self._waiting: list[tuple[int, int, SimSequence]] = []  # heap of (-priority, arrival, seq)
        self._num_waiting = 0
        self._by_id: dict[str, SimSequence] = {}
        self._arrivals = 0
        # Cumulative counters.
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.host_prompt_tokens = 0  # cached prompt tokens brought back from the host tier
        self.received_prompt_tokens = 0  # prompt tokens whose KV arrived from a prefill worker
        self.generated_tokens = 0
        self.finished_count = 0
        self.aborted_count = 0
        self.preemptions = 0

    # -- queue ------------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def has_work(self) -> bool:
        return bool(self.running) or self._num_waiting > 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def add(self, seq: SimSequence) -> None:
        if seq.request_id in self._by_id:
            raise ValueError(f"request {seq.request_id!r} is already scheduled")
        self._arrivals += 1
        seq.arrival = self._arrivals
        if not seq.hashes:
            seq.hashes = block_hashes(seq.tokens, self.block_size, self.hash_seed)
        self._by_id[seq.request_id] = seq
        self.prompt_tokens += seq.prompt_len
        self._push_waiting(seq)

    def abort(self, request_id: str) -> SimSequence | None:
        """Remove a request wherever it is, freeing its blocks."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return None
        if seq.state == "running":
            self._release(seq)
            self.running.remove(seq)
        elif seq.state == "waiting":
            self._num_waiting -= 1  # its heap entry is skipped when it surfaces
        seq.state = "finished"
        self.aborted_count += 1
        return seq

    # -- one iteration ----------------------------------------------------------------------------

    def step(self) -> StepOutcome:
        budget = self.config.max_num_tokens
        scheduled: list[tuple[SimSequence, int]] = []
        preempted: list[SimSequence] = []
        finished: list[tuple[SimSequence, FinishReason]] = []
        chunked = self.config.chunked_prefill

        # 1. Running sequences, in priority order; victims come from the tail.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            remaining = len(seq.tokens) - seq.computed
            n = min(remaining, budget)
            if n < remaining and not chunked:
                i += 1
                continue
            need = self.blocks_for(seq.computed + n) - seq.held - seq.private
            while need > 0 and not self.pool.allocate(need):
                if len(self.running) == 1:
                    # Alone and still out of blocks: its context outgrew the whole KV cache.
                    self._finish(seq, "length", finished)
                    self.running.remove(seq)
                    break
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.state != "running":
                continue  # removed from self.running at index i
            seq.private += max(need, 0)
            scheduled.append((seq, n))
            budget -= n
            i += 1

        # 2. Admission from the waiting queue.
        started: list[SimSequence] = []
        onboard = 0
        while self._waiting and budget > 0 and len(self.running) < self.config.max_batch_size:
            seq = self._waiting[0][2]
            if seq.state != "waiting":
                heapq.heappop(self._waiting)  # aborted while waiting
                continue
            n, back = self._admit(seq, budget)
            onboard += back
            if n == 0:
                break  # head of line does not fit yet: keep FCFS order within priorities
            heapq.heappop(self._waiting)
            self._num_waiting -= 1
            seq.state = "running"
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
            if seq.cached_tokens is None:
                seq.cached_tokens = seq.computed - seq.received
                seq.host_tokens = back * self.block_size
                self.cached_prompt_tokens += seq.computed
                self.host_prompt_tokens += seq.host_tokens
                started.append(seq)
        if started or preempted:
            self.running.sort(key=_order)

        # 3. Compute: commit full blocks, sample for sequences that caught up.
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        emitted: list[SimSequence] = []
        bs = self.block_size
        for seq, n in scheduled:
            if seq.decoding:
                decode.append(seq.computed)
            else:
                prefill.append((seq.computed, n))
            seq.computed += n
            full = seq.computed // bs
            if full > seq.held and self.config.prefix_caching:
                self._ensure_hashes(seq, full)
                parent = seq.hashes[seq.held - 1] if seq.held else None
                self.pool.commit(seq.hashes[seq.held : full], parent)
                seq.private -= full - seq.held
                seq.held = full
            if seq.computed == len(seq.tokens):
                seq.decoding = True
                if seq.emitted < len(seq.output):
                    seq.tokens.append(seq.output[seq.emitted])
                    seq.emitted += 1
                    self.generated_tokens += 1
                    emitted.append(seq)
                if seq.emitted >= len(seq.output):
                    self._finish(seq, seq.end_reason, finished)
        if finished:
            self.running = [s for s in self.running if s.state == "running"]
        return StepOutcome(
            StepWork(prefill, decode, onboard * bs),
            started,
            emitted,
            finished,
            preempted,
            self.pool.take_events(),
        )

    # -- internals --------------------------------------------------------------------------------

    def _admit(self, seq: SimSequence, budget: int) -> tuple[int, int]:
        """Reserve blocks for a waiting sequence's first chunk: (tokens scheduled (0: not now),
        blocks brought back from the host tier)."""
        total = len(seq.tokens)
        bs = self.block_size
        self._ensure_hashes(seq, total // bs)
        hits, on_host = self.pool.match_tiers(seq.hashes) if self.config.prefix_caching else (0, 0)
        # Blocks present once a transfer from a prefill worker landed (prefix caching keeps them).
        got = (
            max(hits, min(seq.received_tokens // bs, len(seq.hashes))) if self.config.prefix_caching else hits
        )
        # At least one token is computed to produce logits, even on a full hit.
        computed = min(got * bs, total - 1)
        n = min(total - computed, budget)
        if n < total - computed and not self.config.chunked_prefill:
            return 0, 0
        if not self.pool.acquire(seq.hashes[:hits]):
            return 0, 0
        arrived = got - hits
        need = max(self.blocks_for(computed + n) - got, 0)
        if not self.pool.allocate(arrived + need):
            self.pool.release(seq.hashes[:hits], self._retentions(seq, hits))
            return 0, on_host
        if arrived:
            # The transferred blocks land as computed, announced by the pool's stored events.
            self.pool.commit(seq.hashes[hits:got], seq.hashes[hits - 1] if hits else None)
            seq.received = computed - min(hits * bs, computed)  # computed here thanks to the transfer
            self.received_prompt_tokens += seq.received
        seq.received_tokens = 0  # a later re-admission (after preemption) finds them cached or recomputes
        seq.held = got
        seq.private = need
        seq.computed = computed
        return n, on_host

    def _retentions(self, seq: SimSequence, n: int) -> list[tuple[int, float | None]] | None:
        return block_retentions(seq.retention, n, self.block_size, seq.prompt_len)

    def _ensure_hashes(self, seq: SimSequence, full: int) -> None:
        bs = self.block_size
        while len(seq.hashes) < full:
            k = len(seq.hashes)
            parent = seq.hashes[-1] if k else None
            seq.hashes += block_hashes(seq.tokens[k * bs : (k + 1) * bs], bs, self.hash_seed, parent)

    def _release(self, seq: SimSequence) -> None:
        self.pool.release(seq.hashes[: seq.held], self._retentions(seq, seq.held))
        self.pool.free(seq.private)
        seq.held = seq.private = seq.computed = 0

    def _preempt(self, seq: SimSequence) -> None:
        self._release(seq)
        seq.decoding = False
        self.running.remove(seq)
        self.preemptions += 1
        self._push_waiting(seq)

    def _finish(
        self, seq: SimSequence, reason: FinishReason, finished: list[tuple[SimSequence, FinishReason]]
    ) -> None:
        self._release(seq)
        seq.state = "finished"
        del self._by_id[seq.request_id]
        self.finished_count += 1
        finished.append((seq, reason))

    def _push_waiting(self, seq: SimSequence) -> None:
        seq.state = "waiting"
        heapq.heappush(self._waiting, (-seq.priority, seq.arrival, seq))
        self._num_waiting += 1


def _order(seq: SimSequence) -> tuple[int, int]:
    return (-seq.priority, seq.arrival)
