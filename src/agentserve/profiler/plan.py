"""What `agentserve profile` measures, and which iterations each measurement spans (pure).

Four sweeps, each sized to what the worker says it can hold (`/info`, `/load`):

- **prefill**: a cold prompt of L tokens, one output token; TTFT spans its prefill chunks.
- **cached**: a prompt whose first S tokens are cached (sent once before), N new ones.
- **decode**: B sequences sharing a cached C-token prefix (so B × C never has to fit the cache, and
  priming costs one prefill), each with a few unique tokens, decoding together; the inter-token
  time of the steady window is one decode iteration.
- **mixed**: a P-token chunk on a cached S-token prefix arriving while B sequences decode at C;
  the decoders' longest gap is the mixed iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentserve.worker.timing import StepWork

UNIQUE_TOKENS = 16  # each decoding sequence's own tokens after the shared prefix


@dataclass(frozen=True, slots=True)
class WorkerFacts:
    """What the plan needs from the worker (GET /info and /load)."""

    block_size: int
    kv_tokens: int  # KV cache capacity
    max_num_tokens: int  # tokens per iteration (the prefill chunk)
    max_batch_size: int
    chunked_prefill: bool = True
    time_scale: float = 1.0  # simulated seconds per wall second (a sim at --sim-speedup); 1: real


@dataclass(frozen=True, slots=True)
class Plan:
    prompt_lengths: tuple[int, ...]
    cached: tuple[tuple[int, int], ...]  # (cached prefix S, new tokens N)
    decode: tuple[tuple[int, int], ...]  # (batch B, context C)
    mixed: tuple[tuple[int, int, int, int], ...]  # (chunk P, its cached prefix S, batch B, context C)
    decode_tokens: int  # output tokens per decoding sequence
    repeats: int  # prefill and cached measurements are medians of this many

    @property
    def size(self) -> int:
        return len(self.prompt_lengths) + len(self.cached) + len(self.decode) + len(self.mixed)


FULL = Plan(
    prompt_lengths=(256, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
    cached=((8192, 512), (16384, 1024), (32768, 1024), (32768, 4096)),
    decode=tuple((b, c) for c in (1024, 8192) for b in (1, 4, 16, 64, 128, 256)),
    mixed=((512, 16384, 64, 4096), (2048, 16384, 64, 4096), (6144, 16384, 64, 4096)),
    decode_tokens=48,
    repeats=3,
)
QUICK = Plan(
    prompt_lengths=(256, 2048, 8192, 16384),
    cached=((8192, 512),),
    decode=((1, 1024), (16, 1024), (64, 1024), (16, 8192), (128, 2048)),
    mixed=((2048, 8192, 32, 2048),),
    decode_tokens=32,
    repeats=1,
)


def fit_to(plan: Plan, facts: WorkerFacts, max_context: int | None = None) -> Plan:
    """`plan` without what the worker cannot hold: prompts beyond its KV cache (or `max_context`),
    batches beyond its batch size, chunks beyond one iteration."""
    room = int(facts.kv_tokens * 0.8)
    if max_context is not None:
        room = min(room, max_context)
    limit = room if facts.chunked_prefill else min(room, facts.max_num_tokens)

    def decode_fits(b: int, c: int) -> bool:
        return b <= facts.max_batch_size and c + b * (UNIQUE_TOKENS + plan.decode_tokens) <= room

    return Plan(
        prompt_lengths=tuple(n for n in plan.prompt_lengths if n <= limit),
        cached=tuple((s, n) for s, n in plan.cached if s + n <= limit),
        decode=tuple((b, c) for b, c in plan.decode if decode_fits(b, c)),
        mixed=tuple(
            (p, s, b, c)
            for p, s, b, c in plan.mixed
            if p + b <= facts.max_num_tokens and decode_fits(b, c) and s + p + c <= room
        ),
        decode_tokens=plan.decode_tokens,
        repeats=plan.repeats,
    )


def prefill_steps(start: int, total: int, chunk: int) -> tuple[StepWork, ...]:
    """The iterations that prefill tokens [start, total) of one prompt, `chunk` tokens at a time."""
    steps = []
    while start < total:
        n = min(chunk, total - start)
        steps.append(StepWork(prefill=((start, n),)))
        start += n
    return tuple(steps)
