"""The TensorRT-LLM `LLM()` arguments the worker image accepts: `workers.llmApiOptions` is checked
against them when the spec is applied, not hours later when the worker builds `LLM(**options)`.

`LLM(model, **kwargs)` validates its arguments as `TorchLlmArgs` (PyTorch backend), a pydantic model
with `extra="forbid"` (`BaseLlmArgs.model_config`): an unknown key fails the worker at start, after the
pod was scheduled and its image pulled. The field names below are those of `BaseLlmArgs` +
`TorchLlmArgs` and of `KvCacheConfig` (the one nested object the worker merges key by key), read in
`tensorrt_llm/llmapi/llm_args.py` of the TensorRT-LLM 1.2 release line
(mikeiovine/TensorRT-LLM snapshot 1b1598c0, a fork whose stored `version.py` reads 1.2.0rc1; the
v1.2.1 tag itself could not be fetched: the repository is 2.5 GB, over the 500 MB fetch limit). The
worker image pins `nvcr.io/nvidia/tensorrt-llm/release:1.2.1` (images/worker-trtllm/Dockerfile).
A deployment that runs another worker image sets `workers.llmApiOptionsCheck: off`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRTLLM_RELEASE = "1.2.1"

# BaseLlmArgs, in declaration order.
_BASE_LLM_ARGS = (
    "model",
    "tokenizer",
    "tokenizer_mode",
    "custom_tokenizer",
    "skip_tokenizer_init",
    "trust_remote_code",
    "tensor_parallel_size",
    "dtype",
    "revision",
    "tokenizer_revision",
    "model_kwargs",
    "pipeline_parallel_size",
    "context_parallel_size",
    "gpus_per_node",
    "moe_cluster_parallel_size",
    "moe_tensor_parallel_size",
    "moe_expert_parallel_size",
    "enable_attention_dp",
    "enable_lm_head_tp_in_adp",
    "pp_partition",
    "cp_config",
    "load_format",
    "enable_lora",
    "lora_config",
    "kv_cache_config",
    "enable_chunked_prefill",
    "guided_decoding_backend",
    "batched_logits_processor",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "peft_cache_config",
    "scheduler_config",
    "cache_transceiver_config",
    "sparse_attention_config",
    "speculative_config",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_beam_width",
    "max_num_tokens",
    "gather_generation_logits",
    "num_postprocess_workers",
    "postprocess_tokenizer_dir",
    "reasoning_parser",
    "decoding_config",
    "mpi_session",
    "otlp_traces_endpoint",
    "backend",
    "return_perf_metrics",
    "perf_metrics_max_requests",
    "orchestrator_type",
    "env_overrides",
)

# TorchLlmArgs(BaseLlmArgs), in declaration order (load_format and backend redeclared).
_TORCH_LLM_ARGS = (
    "garbage_collection_gen0_threshold",
    "cuda_graph_config",
    "attention_dp_config",
    "disable_overlap_scheduler",
    "moe_config",
    "nvfp4_gemm_config",
    "attn_backend",
    "sampler_type",
    "sampler_force_async_worker",
    "enable_iter_perf_stats",
    "enable_iter_req_stats",
    "print_iter_log",
    "batch_wait_timeout_ms",
    "batch_wait_timeout_iters",
    "batch_wait_max_tokens_ratio",
    "torch_compile_config",
    "enable_autotuner",
    "enable_layerwise_nvtx_marker",
    "load_format",
    "enable_min_latency",
    "stream_interval",
    "force_dynamic_quantization",
    "allreduce_strategy",
    "checkpoint_loader",
    "checkpoint_format",
    "kv_connector_config",
    "mm_encoder_only",
    "ray_worker_extension_cls",
    "ray_placement_config",
    "enable_sleep",
    "use_cute_dsl_blockscaling_mm",
    "use_cute_dsl_blockscaling_bmm",
    "disable_flashinfer_sampling",
    "max_stats_len",
    "layer_wise_benchmarks_config",
    "backend",
)

# The top-level keys `LLM()` accepts (sorted: it is also the CRD's CEL list).
LLM_ARGS_FIELDS: tuple[str, ...] = tuple(sorted(set(_BASE_LLM_ARGS) | set(_TORCH_LLM_ARGS)))

# KvCacheConfig (StrictBaseModel: extra keys fail too).
KV_CACHE_CONFIG_FIELDS: tuple[str, ...] = tuple(
    sorted(
        (
            "enable_block_reuse",
            "max_tokens",
            "max_attention_window",
            "sink_token_length",
            "free_gpu_memory_fraction",
            "host_cache_size",
            "onboard_blocks",
            "cross_kv_cache_fraction",
            "secondary_offload_min_priority",
            "event_buffer_max_size",
            "attention_dp_events_gather_period_ms",
            "enable_partial_reuse",
            "copy_on_partial_reuse",
            "use_uvm",
            "max_gpu_total_bytes",
            "dtype",
            "mamba_ssm_cache_dtype",
            "tokens_per_block",
            "use_kv_cache_manager_v2",
            "max_util_for_resume",
        )
    )
)


def unknown_llm_api_options(options: Mapping[str, Any]) -> list[str]:
    """The keys of `options` (dotted below `kv_cache_config`) that TensorRT-LLM's `LLM()` of the pinned
    release would refuse, in order."""
    unknown = [str(k) for k in options if k not in LLM_ARGS_FIELDS]
    kv = options.get("kv_cache_config")
    if isinstance(kv, Mapping):
        unknown += [f"kv_cache_config.{k}" for k in kv if k not in KV_CACHE_CONFIG_FIELDS]
    return unknown
