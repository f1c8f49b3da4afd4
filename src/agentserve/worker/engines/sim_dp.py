"""The simulated engine with attention data parallelism (`--sim-dp-ranks N`).

With TensorRT-LLM's attention DP (`enable_attention_dp`), each of the N ranks runs attention for
its own requests over its own KV cache: a prefix cached on rank 0 is no hit for a request that
lands on rank 1. Its KV events say which rank they come from (`attention_dp_rank`), and a request
can be pinned to a rank (`SchedulingParams(attention_dp_rank=…, attention_dp_relax=False)`);
unpinned requests are balanced by the engine.

This engine models exactly that with N independent `SimEngine`s (one KV pool and scheduler each)
behind one `Engine`: events carry `dp_rank` and are numbered per rank (each rank starts with its
own `cleared` at 1), `kv_snapshot(rank)` is per rank, `GenerateRequest.dp_rank` pins a request and
an unpinned one goes to the rank with the fewest requests. So worker → router index → placement
is testable end to end without a GPU.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from agentserve.worker.engine import (
    DuplicateRequestError,
    GenerateRequest,
    InvalidRequestError,
    KvEvent,
    KvSnapshot,
    Load,
    StepStream,
)
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.events import EventHub
from agentserve.worker.outputs import OutputPolicy
from agentserve.worker.tokenizer import Tokenizer


class DpSimEngine:
    """N attention-DP ranks of the simulated engine (see the module docstring)."""

    def __init__(
        self,
        ranks: int,
        config: SimConfig | None = None,
        tokenizer: Tokenizer | None = None,
        policy: OutputPolicy | None = None,
    ) -> None:
        if ranks < 2:
            raise ValueError("attention DP needs at least 2 ranks")
        self._hub = EventHub()
        self.ranks = [SimEngine(config, tokenizer, policy, dp_rank=r, hub=self._hub) for r in range(ranks)]
        self._owner: dict[str, int] = {}  # request id -> rank serving it

    @property
    def dp_ranks(self) -> int:
        return len(self.ranks)

    @property
    def block_size(self) -> int:
        return self.ranks[0].block_size

    @property
    def ready(self) -> bool:
        return all(r.ready for r in self.ranks)

    async def start(self) -> None:
        for rank in self.ranks:
            await rank.start()

    async def stop(self) -> None:
        for rank in self.ranks:
            await rank.stop()
        self._hub.close()

    def generate(self, request: GenerateRequest) -> StepStream:
        rid = request.request_id
        if rid and rid in self._owner and self.ranks[self._owner[rid]].has_request(rid):
            raise DuplicateRequestError(f"request {rid!r} is still running")
        rank = request.dp_rank
        if rank is None:  # unpinned: the engine balances (TensorRT-LLM's relaxed placement)
            rank = min(range(len(self.ranks)), key=lambda r: _busy(self.ranks[r].load()))
        elif not 0 <= rank < len(self.ranks):
            last = len(self.ranks) - 1
            raise InvalidRequestError(f"dp_rank {rank} is not a rank of this engine (0..{last})")
        stream = self.ranks[rank].generate(request)
        if rid:
            self._owner[rid] = rank
            if len(self._owner) > 4 * 65536:  # bounded: forget finished requests' ranks
                self._owner = {k: v for k, v in self._owner.items() if self.ranks[v].has_request(k)}
        return stream

    def abort(self, request_id: str) -> bool:
        rank = self._owner.pop(request_id, None)
        return rank is not None and self.ranks[rank].abort(request_id)

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._hub.subscribe()

    def kv_snapshot(self, dp_rank: int | None = None) -> KvSnapshot:
        if dp_rank is None or not 0 <= dp_rank < len(self.ranks):
            raise InvalidRequestError(f"a snapshot needs a dp_rank in 0..{len(self.ranks) - 1}")
        return self.ranks[dp_rank].kv_snapshot(dp_rank)

    def rank_loads(self) -> list[Load]:
        return [r.load() for r in self.ranks]

    def load(self) -> Load:
        loads = self.rank_loads()
        return Load(
            running=sum(x.running for x in loads),
            waiting=sum(x.waiting for x in loads),
            kv_blocks_used=sum(x.kv_blocks_used for x in loads),
            kv_blocks_total=sum(x.kv_blocks_total for x in loads),
            kv_blocks_cached=sum(x.kv_blocks_cached for x in loads),
            kv_blocks_retained=sum(x.kv_blocks_retained for x in loads),
            kv_blocks_pinned=sum(x.kv_blocks_pinned for x in loads),  # each rank keeps its own copy
            kv_host_blocks_used=sum(x.kv_host_blocks_used for x in loads),
            kv_host_blocks_total=sum(x.kv_host_blocks_total for x in loads),
            prompt_tokens=sum(x.prompt_tokens for x in loads),
            cached_prompt_tokens=sum(x.cached_prompt_tokens for x in loads),
            generated_tokens=sum(x.generated_tokens for x in loads),
            requests_finished=sum(x.requests_finished for x in loads),
            requests_aborted=sum(x.requests_aborted for x in loads),
            preemptions=sum(x.preemptions for x in loads),
            constrained_requests=sum(x.constrained_requests for x in loads),
            constraint_cpu_seconds=sum(x.constraint_cpu_seconds or 0.0 for x in loads),
        )


def _busy(load: Load) -> int:
    return load.running + load.waiting
