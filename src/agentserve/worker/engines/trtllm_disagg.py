"""Disaggregated prefill on TensorRT-LLM: our `KvTransfer` ↔ its `DisaggregatedParams`, and the LLM
arguments a prefill or decode worker needs (pure; the engine applies them).

TensorRT-LLM's flow through the LLM API (facts read in the stored NVIDIA/TensorRT-LLM snapshot of
`tensorrt_llm/disaggregated_params.py` and the LLM API's disaggregated tests; the image pins release
1.2.1, whose tag is not fetchable here — docs/worker.md lists what is not verified on a GPU):

1. the prefill worker runs the prompt with `DisaggregatedParams(request_type="context_only")` and one
   output token; the finished result's `disaggregated_params` (first_gen_tokens, ctx_request_id,
   opaque_state, draft_tokens, disagg_request_id, ctx_dp_rank, ctx_info_endpoint) say where the KV
   waits; the context server keeps it until the generation side has read it, or
   `cache_transceiver_config.kv_transfer_timeout_ms` passes;
2. the decode worker runs the same prompt with those params and
   `request_type="generation_only"`: its cache transceiver pulls the KV from the context server
   (the endpoint is in the params) and the output starts with the first token the prefill made —
   the generation-only output equals the aggregated one.

Both sides need `cache_transceiver_config` in the LLM arguments, with a buffer at least the longest
prompt (`max_tokens_in_buffer`: below it workers can deadlock under load, deploy.md §2.5); a context
server runs with `disable_overlap_scheduler: True` (TensorRT-LLM's disaggregated-serving docs).

Our `KvTransfer.handle` carries the params across processes: `trtllm:` + base64url of their JSON,
`opaque_state` (bytes) base64-encoded inside. The sim's handles are request ids; the two never mix
(a deployment runs one engine).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from agentserve.worker.engine import InvalidRequestError

HANDLE_PREFIX = "trtllm:"
# DisaggregatedParams fields that travel from the context response to the generation request.
PARAM_FIELDS: tuple[str, ...] = (
    "first_gen_tokens",
    "ctx_request_id",
    "opaque_state",
    "draft_tokens",
    "disagg_request_id",
    "ctx_dp_rank",
    "ctx_info_endpoint",
)
TRANSCEIVER_BACKEND = "DEFAULT"  # NIXL unless a TRTLLM_USE_*_KVCACHE variable picks another


def context_only_params() -> dict[str, Any]:
    """`DisaggregatedParams(**…)` of a prefill worker's request."""
    return {"request_type": "context_only"}


def handle_of(params: Any) -> str:
    """The finished context response's `disaggregated_params` as a `KvTransfer.handle`."""
    if params is None:
        raise InvalidRequestError("the context-only response carries no disaggregated_params")
    data: dict[str, Any] = {}
    for name in PARAM_FIELDS:
        value = getattr(params, name, None)
        if value is None:
            continue
        if name == "opaque_state":
            value = base64.b64encode(bytes(value)).decode()
        elif name in ("first_gen_tokens", "draft_tokens"):
            value = [int(t) for t in value]
        data[name] = value
    if "ctx_request_id" not in data and "disagg_request_id" not in data:
        raise InvalidRequestError("the context-only response names no request to pull from")
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return HANDLE_PREFIX + base64.urlsafe_b64encode(raw).decode()


def generation_only_params(handle: str) -> dict[str, Any]:
    """`DisaggregatedParams(**…)` of the decode worker's request, from a prefill worker's handle."""
    if not handle.startswith(HANDLE_PREFIX):
        raise InvalidRequestError("kv_transfer.handle is not a TensorRT-LLM prefill worker's")
    try:
        data = json.loads(base64.urlsafe_b64decode(handle[len(HANDLE_PREFIX) :]))
    except (ValueError, binascii.Error) as exc:
        raise InvalidRequestError(f"kv_transfer.handle is malformed: {exc}") from exc
    if not isinstance(data, dict) or set(data) - set(PARAM_FIELDS):
        raise InvalidRequestError("kv_transfer.handle carries unknown fields")
    out: dict[str, Any] = {"request_type": "generation_only", **data}
    if "opaque_state" in out:
        try:
            out["opaque_state"] = base64.b64decode(out["opaque_state"], validate=True)
        except (ValueError, binascii.Error) as exc:
            raise InvalidRequestError(f"kv_transfer.handle has a malformed opaque_state: {exc}") from exc
    return out


def transceiver_kwargs(role: str, max_input_tokens: int | None) -> dict[str, Any]:
    """LLM arguments of a worker with `role`: none for `both`; the cache transceiver (buffer ≥ the
    longest prompt) for prefill and decode, and no overlap scheduler on a prefill worker."""
    if role == "both":
        return {}
    if max_input_tokens is None or max_input_tokens < 1:
        raise ValueError(
            f"a {role} worker needs max_seq_len: the KV transfer buffer must hold the longest prompt"
        )
    out: dict[str, Any] = {
        "cache_transceiver_config": {"backend": TRANSCEIVER_BACKEND, "max_tokens_in_buffer": max_input_tokens}
    }
    if role == "prefill":
        out["disable_overlap_scheduler"] = True
    return out


def transferred_tokens(kwargs: Mapping[str, Any]) -> int | None:
    """The transfer buffer the merged LLM arguments give (None: no cache transceiver)."""
    config = kwargs.get("cache_transceiver_config")
    if not isinstance(config, Mapping):
        return None
    value = config.get("max_tokens_in_buffer")
    return value if isinstance(value, int) else None
