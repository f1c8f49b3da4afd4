"""How long one batch iteration of the simulated engine takes (pure arithmetic).

One iteration runs prefill chunks and decode tokens together (continuous batching with chunked
prefill). Its time is a sum of terms, each non-decreasing in its inputs:

    t = base                                   weights read + launch, paid once per iteration
      + decode_per_seq     × decoding sequences (MoE experts touched, sampling)
      + kv_read_per_token  × Σ context of decoding sequences (attention reads the KV cache)
      + prefill_per_token  × prefill tokens (GEMMs: 2 × active parameters FLOPs per token)
      + prefill_attn       × Σ over prefill tokens of their context (quadratic attention)

`QWEN3_30B_A3B_B200` gives the default coefficients. They are first-principles estimates, not
measurements: model facts from the Qwen/Qwen3-30B-A3B `config.json` (48 layers, 4 KV heads × 128
head dim, 32 query heads, 3.3 B active of 30.5 B parameters, BF16) and B200 datasheet figures (about
8 TB/s HBM3e, 2.25 PFLOPS dense BF16), with assumed efficiencies (70 % of bandwidth, 20 % of peak
FLOPS for MoE prefill, 40 % for attention). docs/worker.md shows the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one iteration computes: prefill chunks as (tokens already in context, new tokens),
    and the context length of each sequence that decodes one token."""

    prefill: Sequence[tuple[int, int]] = field(default_factory=tuple)
    decode: Sequence[int] = field(default_factory=tuple)
    onboard_tokens: int = 0  # prompt tokens whose KV is copied back from the host tier

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode and not self.onboard_tokens


@dataclass(frozen=True, slots=True)
class TimingModel:
    name: str
    base_s: float
    decode_per_seq_s: float
    kv_read_per_token_s: float
    prefill_per_token_s: float
    prefill_attn_per_token_ctx_s: float
    kv_bytes_per_token: int  # for sizing the default KV pool
    # Host -> GPU copy bandwidth for KV blocks brought back from the host tier.
    host_to_gpu_bytes_per_s: float = 50e9

    def step_seconds(self, work: StepWork) -> float:
        if work.empty:
            return 0.0
        t = self.base_s
        if work.onboard_tokens:
            t += work.onboard_tokens * self.kv_bytes_per_token / self.host_to_gpu_bytes_per_s
        if work.decode:
            t += self.decode_per_seq_s * len(work.decode) + self.kv_read_per_token_s * sum(work.decode)
        for start, n in work.prefill:
            # Σ_{i<n} (start + i) = n·start + n(n-1)/2: each new token attends to all before it.
            t += self.prefill_per_token_s * n + self.prefill_attn_per_token_ctx_s * (
                n * start + n * (n - 1) / 2
            )
        return t


QWEN3_30B_A3B_B200 = TimingModel(
    name="Qwen3-30B-A3B BF16 on one B200 (estimate)",
    # ~6.6 GB of active weights at batch 1 → 0.8 ms at line rate; kernels, launch, MoE routing and
    # sampling overheads bring a single-stream step to ~4 ms (~250 tokens/s).
    base_s=4.0e-3,
    # Larger batches touch more of the 128 experts (61 GB at saturation → ~8 ms more at 256).
    decode_per_seq_s=25e-6,
    # 96 KiB of KV per token (2 × 48 layers × 4 heads × 128 dim × 2 bytes) / (8 TB/s × 0.7).
    kv_read_per_token_s=17.6e-9,
    # 2 × 3.3 G FLOPs per token / (2.25 PFLOPS × 0.2).
    prefill_per_token_s=15e-6,
    # 4 × 48 layers × 32 heads × 128 dim FLOPs per (token, context token) / (2.25 PFLOPS × 0.4).
    prefill_attn_per_token_ctx_s=0.87e-9,
    kv_bytes_per_token=2 * 48 * 4 * 128 * 2,
    # B200 (HGX) sits on PCIe Gen5 x16 to its host: 64 GB/s per direction, ~50 GB/s achieved for
    # large pinned copies (GB200's NVLink-C2C would give ~450 GB/s per direction). 96 KiB/token →
    # ~2 µs per token, against ~15 µs+ to recompute it.
    host_to_gpu_bytes_per_s=50e9,
)

DEFAULT_TIMING = QWEN3_30B_A3B_B200
