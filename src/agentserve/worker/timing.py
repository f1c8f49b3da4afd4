"""How long one batch iteration of an engine takes (pure arithmetic): the performance model.

One iteration runs prefill chunks and decode tokens together (continuous batching with chunked
prefill). Its time is a sum of terms, each non-decreasing in its inputs:

    t = base                     fixed per iteration: dense weights read, graph launch, sampling
      + moe_expert × experts touched by the iteration's T tokens, E × (1 − (1 − k/E)^T)
                                 (uniform routing: a batch of 1 reads k experts, a large batch all E)
      + decode_per_seq × decoding sequences + prefill_per_token × prefill tokens  (per-token GEMMs)
      + kv_read × Σ context of decoding sequences (decode attention reads the KV cache)
      + prefill_attn × Σ over prefill tokens of their context (quadratic attention)
      + mixed_step if the iteration prefills and decodes together
      + onboard tokens × KV bytes per token / host → GPU bandwidth (host KV tier)
      + cross_node_step + cross_node_per_token × tokens   (a replica tensor-parallel across nodes:
                                 its all-reduces over the inter-node link; `spanning_nodes`)

and an iteration that prefills takes at least `prefill_floor` (engines replay CUDA graphs for
decode-only iterations; one with a prefill chunk is launched kernel by kernel, which the CPU bounds).

A model is one record of a *profile* (`agentserve.worker.profiles`): measured by `agentserve profile`
or shipped (`h200-qwen3-30b-a3b-pytorch` from measurements, `b200-qwen3-30b-a3b-estimate` from
datasheets). docs/worker.md ("Timing model") shows both against the measurements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace


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
    """The coefficients of the iteration time (module docstring); seconds unless named otherwise."""

    name: str
    base_s: float
    decode_per_seq_s: float
    kv_read_per_token_s: float
    prefill_per_token_s: float
    prefill_attn_per_token_ctx_s: float
    kv_bytes_per_token: int  # for sizing the default KV pool and host-tier copies
    # Host -> GPU copy bandwidth for KV blocks brought back from the host tier (pinned memory).
    host_to_gpu_bytes_per_s: float = 50e9
    gpu_to_host_bytes_per_s: float = 50e9
    # Mixture of experts: routed experts per layer, experts per token, and the cost of reading one
    # expert's weights in every layer once per iteration. 0 experts: no MoE term (dense, or folded
    # into the linear terms as the estimate does).
    moe_experts: int = 0
    moe_active_experts: int = 0
    moe_expert_s: float = 0.0
    mixed_step_s: float = 0.0  # extra cost of an iteration with both prefill and decode work
    prefill_floor_s: float = 0.0  # least time of an iteration that prefills (launch bound)
    model_load_s: float = 0.0  # process start to ready: weights, graphs (an engine starting up)
    # A replica spanning nodes (`spanning_nodes`): per iteration, the fixed latency of the all-reduces
    # crossing nodes; per token, their bytes over the inter-node link.
    cross_node_step_s: float = 0.0
    cross_node_per_token_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f"timing model {self.name!r}: {f.name} must not be negative ({value})")
        if self.moe_experts and not 0 < self.moe_active_experts <= self.moe_experts:
            raise ValueError(
                f"timing model {self.name!r}: moe_active_experts must be in 1..moe_experts "
                f"({self.moe_active_experts} of {self.moe_experts})"
            )
        if self.host_to_gpu_bytes_per_s <= 0 or self.gpu_to_host_bytes_per_s <= 0:
            raise ValueError(f"timing model {self.name!r}: copy bandwidths must be positive")

    def experts_touched(self, tokens: int) -> float:
        """Expected experts per layer that `tokens` tokens route to (uniform top-k routing)."""
        if not self.moe_experts or tokens <= 0:
            return 0.0
        return self.moe_experts * (1.0 - (1.0 - self.moe_active_experts / self.moe_experts) ** tokens)

    def terms(self, work: StepWork) -> dict[str, float]:
        """The iteration's inputs to each linear coefficient (what a fit regresses on)."""
        prefill_tokens = sum(n for _, n in work.prefill)
        # Σ_{i<n} (start + i) = n·start + n(n-1)/2: each new token attends to all before it.
        pairs = sum(n * start + n * (n - 1) / 2 for start, n in work.prefill)
        inputs = (
            1.0,
            self.experts_touched(prefill_tokens + len(work.decode)),
            float(len(work.decode)),
            float(sum(work.decode)),
            float(prefill_tokens),
            float(pairs),
            1.0 if work.prefill and work.decode else 0.0,
        )
        return dict(zip(LINEAR_TERMS, inputs, strict=True))

    def step_seconds(self, work: StepWork) -> float:
        if work.empty:
            return 0.0
        t = self.base_s
        if work.onboard_tokens:
            t += work.onboard_tokens * self.kv_bytes_per_token / self.host_to_gpu_bytes_per_s
        decode = work.decode
        prefill_tokens = 0
        if work.prefill:
            for start, n in work.prefill:
                prefill_tokens += n
                t += self.prefill_per_token_s * n + self.prefill_attn_per_token_ctx_s * (
                    n * start + n * (n - 1) / 2
                )
            if decode:
                t += self.mixed_step_s
        if decode:
            t += self.decode_per_seq_s * len(decode) + self.kv_read_per_token_s * sum(decode)
        if self.moe_experts:
            t += self.moe_expert_s * self.experts_touched(prefill_tokens + len(decode))
        if self.cross_node_step_s or self.cross_node_per_token_s:
            t += self.cross_node_step_s + self.cross_node_per_token_s * (prefill_tokens + len(decode))
        if work.prefill and t < self.prefill_floor_s:
            return self.prefill_floor_s
        return t


# The coefficients a fit estimates; `TimingModel.terms` gives their inputs in this order.
LINEAR_TERMS: tuple[str, ...] = (
    "base_s",
    "moe_expert_s",
    "decode_per_seq_s",
    "kv_read_per_token_s",
    "prefill_per_token_s",
    "prefill_attn_per_token_ctx_s",
    "mixed_step_s",
)


# -- replicas spanning nodes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interconnect:
    """The link between the nodes of one replica, per GPU (HGX B200: one NIC per GPU)."""

    name: str
    bytes_per_s: float  # each direction
    latency_s: float  # one step of a collective across nodes


# Datasheet line rates at ~80 % for large messages; latencies are typical small-message figures.
INTERCONNECTS: Mapping[str, Interconnect] = {
    # ConnectX-7, 400 Gb/s per GPU (HGX B200's reference networking).
    "infiniband-ndr": Interconnect("infiniband-ndr", 40e9, 5e-6),
    # ConnectX-8, 800 Gb/s per GPU.
    "infiniband-xdr": Interconnect("infiniband-xdr", 80e9, 5e-6),
    # Spectrum-X / RoCE at 400 Gb/s per GPU.
    "roce-400g": Interconnect("roce-400g", 40e9, 10e-6),
}


def spanning_nodes(
    model: TimingModel,
    nodes: int,
    link: Interconnect,
    *,
    layers: int,
    hidden: int,
    gpus_per_node: int = 8,
    dtype_bytes: int = 2,
) -> TimingModel:
    """`model` measured on one node's GPUs, as a replica tensor-parallel over `nodes` such nodes.

    First order: each GPU holds 1/nodes of the weights and of the KV, so the terms that read them or
    compute with them shrink by 1/nodes (the launch-bound floor and the mixed-iteration penalty do
    not); and each layer's two all-reduces (attention out, MLP out) now cross the inter-node link. They
    run hierarchically, as NCCL does: within a node over NVLink (already in the measured model), then
    across nodes each GPU exchanges its 1/gpus_per_node shard over its own NIC, 2(n−1)/n of it in a
    ring, in 2(n−1) steps.
    """
    if nodes <= 1:
        return model
    if layers < 1 or hidden < 1 or gpus_per_node < 1:
        raise ValueError("spanning_nodes needs the model's layers and hidden size")
    collectives = 2 * layers
    shard = hidden * dtype_bytes / gpus_per_node
    per_token = collectives * shard * 2 * (nodes - 1) / nodes / link.bytes_per_s
    step = collectives * 2 * (nodes - 1) * link.latency_s
    k = 1.0 / nodes
    return replace(
        model,
        name=f"{model.name} ×{nodes} nodes ({link.name})",
        base_s=model.base_s * k,
        decode_per_seq_s=model.decode_per_seq_s * k,
        kv_read_per_token_s=model.kv_read_per_token_s * k,
        prefill_per_token_s=model.prefill_per_token_s * k,
        prefill_attn_per_token_ctx_s=model.prefill_attn_per_token_ctx_s * k,
        moe_expert_s=model.moe_expert_s * k,
        cross_node_step_s=model.cross_node_step_s + step,
        cross_node_per_token_s=model.cross_node_per_token_s + per_token,
    )
