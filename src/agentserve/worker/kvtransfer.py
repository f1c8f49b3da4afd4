"""What moving a prompt's KV from a prefill worker to a decode worker costs (pure arithmetic).

A transfer ships the KV of `tokens` prompt tokens: `kv_bytes_per_token` (from the model shape: 2 (K
and V) × layers × KV heads × head dim × dtype bytes; 96 KiB for Qwen3-30B-A3B in bf16) each, over
the link between the two workers:

    t = setup + latency + tokens × kv_bytes_per_token / (link bandwidth × parallel links)

`setup` is the per-transfer handshake (descriptor exchange, memory registration lookups) that
NIXL/UCX pay once per request; the bandwidth is the link's line rate at ~80 % for large messages.
A replica of several GPUs sends each GPU's shard of the KV over its own link (`parallel`), as
TensorRT-LLM's cache transceiver does between equal tensor-parallel layouts.

The transfer runs beside the decode worker's iterations (copy engines / NIC, not the SMs): it delays
the request it carries, not the batch it joins.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentserve.worker.timing import INTERCONNECTS, Interconnect

TRANSFER_SETUP_S = 1e-3  # one handshake per request (NIXL/UCX metadata exchange), an estimate

# Links a KV transfer can take. NVLink within a node: H100/H200 NVLink 4 is 450 GB/s per direction
# per GPU, B200 NVLink 5 900 GB/s; at ~80 %. RDMA between nodes: the node's NICs (one per GPU).
KV_LINKS: Mapping[str, Interconnect] = {
    "nvlink": Interconnect("nvlink", 360e9, 2e-6),
    "nvlink-b200": Interconnect("nvlink-b200", 720e9, 2e-6),
    "rdma": INTERCONNECTS["infiniband-ndr"],
    "rdma-xdr": INTERCONNECTS["infiniband-xdr"],
}
DEFAULT_KV_LINK = "rdma"  # prefill and decode pools on different nodes: the conservative case


def kv_link(name: str) -> Interconnect:
    """The link called `name` (ValueError naming the known ones)."""
    try:
        return KV_LINKS[name]
    except KeyError:
        raise ValueError(f"unknown KV link {name!r}; known: {', '.join(KV_LINKS)}") from None


def transfer_seconds(tokens: int, kv_bytes_per_token: int, link: Interconnect, parallel: int = 1) -> float:
    """Seconds to ship the KV of `tokens` tokens over `parallel` links like `link` (0 for none)."""
    if tokens <= 0:
        return 0.0
    if parallel < 1:
        raise ValueError("parallel links must be at least 1")
    return TRANSFER_SETUP_S + link.latency_s + tokens * kv_bytes_per_token / (link.bytes_per_s * parallel)
