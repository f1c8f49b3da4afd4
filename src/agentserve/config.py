"""Component configuration: one flat model per component, the single vocabulary of its settings.

The same model feeds three edges: command-line flags (generated from the fields: `tool_call_parser`
is `--tool-call-parser`, booleans get `--x/--no-x`), YAML config files (`--config FILE`, keys are
field names), and the Kubernetes operator, which renders a CR's spec into these keys in a ConfigMap.
Flags override the file; the file overrides defaults. Flag names follow Dynamo's where the meaning is
the same (`--strip-anthropic-preamble`, `--enable-streaming-tool-dispatch`, `--reasoning-parser`).
"""

from __future__ import annotations

import argparse
import copy
import types
import typing
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ReplayPolicy(StrEnum):
    """How past reasoning goes back into the prompt (see agentserve.prompt)."""

    AUTO = "auto"  # native if the chat template reads reasoning_content, else inject
    NATIVE = "native"  # hand segments to the template as reasoning_content
    INJECT = "inject"  # render each segment as the family's think block before its own tool call
    DROP = "drop"


ApiName = Literal["anthropic", "chat", "responses"]
ALL_APIS: tuple[ApiName, ...] = ("anthropic", "chat", "responses")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def http_url(value: str, *, what: str, port: bool = True) -> str:
    """`value` if it is http(s)://host[:port] (the port required when `port`), else a ValueError
    saying the form expected, with an example."""
    example = "http://10.0.0.5:8200" if port else "http://router:8100"
    form = "http://host:port" if port else "http://host[:port]"
    parts = urlsplit(value.strip())
    try:
        has_port = parts.port is not None
    except ValueError:  # a port that is not a number ("Port could not be cast to integer value")
        has_port = False
        port = True
    if parts.scheme not in ("http", "https") or not parts.hostname or (port and not has_port):
        raise ValueError(f"{value!r} is not a {what} URL: expected {form}, e.g. {example}")
    return value.strip().rstrip("/")


def _url_list(values: list[str], what: str) -> list[str]:
    # `--workers a,b` is how many people write a list: commas separate URLs as repeating the flag does.
    return [http_url(part, what=what) for value in values for part in value.split(",") if part.strip()]


class PromptConfig(_Config):
    """Settings of the prompt pipeline, shared by the frontend and the CLIs that render prompts."""

    model: str = Field("qwen3-sim", description="model name served to clients (its family: qwen3)")
    model_path: str | None = Field(None, description="model directory (tokenizer.json, chat template)")
    family: str | None = Field(None, description="model family (default: inferred from the model name)")
    reasoning_parser: str | None = Field(None, description="reasoning parser (default: the family's)")
    tool_call_parser: str | None = Field(None, description="tool-call parser (default: the family's)")
    chat_template: str | None = Field(None, description="chat template file overriding the model's")
    replay_policy: ReplayPolicy = Field(ReplayPolicy.AUTO, description="how past reasoning is replayed")
    truncate_history_thinking: bool = Field(False, description="let templates drop older reasoning")
    reasoning_default: Literal["template", "on", "off"] = Field(
        "template",
        description="thinking when a request asks for none either way (no effort, no thinking switch): "
        "template (the chat template's own default), on, off",
    )
    strip_anthropic_preamble: bool = Field(True, description="strip Claude Code's billing header block")
    strip_pattern: list[str] = Field(
        default_factory=list, description="extra volatile span to strip, NAME=REGEX (repeatable)"
    )
    block_size: int = Field(32, ge=1, description="tokens per KV block (must match the workers)")
    hash_seed: int = Field(0, ge=0, description="seed of the chained block hashes")
    context_length: int | None = Field(None, ge=1, description="context window in tokens")
    tokenizer: str | None = Field(
        None, description="tokenizer directory or tokenizer.json (default: model_path)"
    )


RetentionMode = Literal["off", "agent"]


class RetentionSettings(BaseModel):
    """How long KV blocks outlive their request (docs/worker.md, "KV retention"), defined once: the
    frontend's flat settings (`RETENTION_KEYS`), the CRD's `workers.kvCache.retention` (its spec
    model inherits these fields) and the policy the frontend decides with
    (`frontend.retention.RetentionPolicy.from_settings`) are all this record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: RetentionMode = Field(
        "agent",
        description="agent: keep sessions' KV through tool-call gaps and pin the shared system/tools "
        "prefix (a retention sent with each request); off: the engines' plain LRU",
    )
    session_seconds: float = Field(
        600.0, gt=0, description="how long an agent session's KV outlives its turn (tool-call gaps)"
    )
    idle_seconds: float = Field(
        120.0, gt=0, description="how long a chat or late-returning session's KV is kept"
    )
    session_priority: int = Field(
        80, ge=0, le=100, description="retention priority of agent session blocks (0-100)"
    )
    prefix_priority: int = Field(
        90, ge=0, le=100, description="retention priority of the shared system/tools prefix (no expiry)"
    )
    subagent_trees: bool = Field(
        True,
        description="link subagents to their parent session (headers, billing line, spawn calls); hold "
        "a parent waiting on subagents, release an answered subagent's KV and keep the parent's worker "
        "(docs/subagents.md); never changes replies",
    )


# Each retention setting's key among the frontend's flat settings (flag `--kv-retention-…`).
RETENTION_KEYS: dict[str, str] = {
    name: {"mode": "kv_retention", "subagent_trees": "subagent_trees"}.get(name, f"kv_retention_{name}")
    for name in RetentionSettings.model_fields
}


def _retention_field(name: str) -> Any:
    """The retention setting `name` as a field of the flat frontend config (default, bounds and
    description from `RetentionSettings`)."""
    return copy.copy(RetentionSettings.model_fields[name])


class FrontendConfig(PromptConfig):
    host: str = Field("0.0.0.0", description="address to listen on")
    # The retention settings, flat (one flag each); `retention` gives them back as the one record.
    kv_retention: RetentionMode = _retention_field("mode")
    kv_retention_session_seconds: float = _retention_field("session_seconds")
    kv_retention_idle_seconds: float = _retention_field("idle_seconds")
    kv_retention_session_priority: int = _retention_field("session_priority")
    kv_retention_prefix_priority: int = _retention_field("prefix_priority")
    subagent_trees: bool = _retention_field("subagent_trees")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on")
    apis: list[ApiName] = Field(default_factory=lambda: list(ALL_APIS), description="APIs served")
    enable_streaming_tool_dispatch: bool = Field(True, description="dispatch tool calls while decoding")
    constrained_decoding: bool = Field(
        True,
        description="enforce tool_choice, parallel_tool_calls, strict tools, JSON output formats and "
        "thinking budgets with a grammar (off: such requests are refused with 400)",
    )
    constraint_cache_size: int = Field(
        256, ge=1, description="compiled grammars kept (least recently used go first)"
    )
    codex_catalog: bool = Field(True, description="serve the Codex model catalog")
    router_url: str | None = Field(None, description="router service URL (default: embedded router)")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="largest request body accepted")
    api_keys_file: str | None = Field(None, description="file with one accepted API key per line")
    trace_sink: str | None = Field(None, description="JSONL trace file (rotated, gzip); none by default")
    trace_rotate_bytes: int = Field(
        256 * 1024 * 1024, ge=4096, description="rotate the trace file when it reaches this size"
    )
    trace_keep_files: int = Field(16, ge=1, description="rotated trace files kept (oldest deleted)")
    trace_gzip: bool = Field(True, description="gzip rotated trace files")
    trace_queue_size: int = Field(
        4096, ge=1, description="trace records buffered for the writer; beyond it they are dropped"
    )
    trace_replay_hashes: bool = Field(True, description="put the prompt's block hashes in trace records")
    tool_events_zmq: str | None = Field(
        None, description="ZeroMQ endpoint to bind for harness tool events (e.g. tcp://127.0.0.1:20390)"
    )
    model_aliases: list[str] = Field(
        default_factory=list, description="more model ids listed in the catalogs (e.g. claude-… for pickers)"
    )
    accept_any_model: bool = Field(
        True, description="serve requests naming any model with the served model (harnesses send their own)"
    )
    signing_key_file: str | None = Field(
        None,
        description="file with the key for thinking signatures and sealed reasoning: hex, base64 or raw "
        "bytes, at least 16 (replicas must share one; default: random per process)",
    )
    ping_interval_s: float = Field(
        10.0, ge=0, description="keep-alive ping on idle streams every N seconds (0: never)"
    )
    worker_urls: list[str] = Field(
        default_factory=list, description="worker URLs for the embedded router (http://host:port)"
    )

    @field_validator("worker_urls")
    @classmethod
    def _worker_urls(cls, value: list[str]) -> list[str]:
        return _url_list(value, "worker")

    prefill_worker_urls: list[str] = Field(
        default_factory=list,
        description="prefill worker URLs for the embedded router (disaggregated prefill; with worker_urls)",
    )

    @field_validator("prefill_worker_urls")
    @classmethod
    def _prefill_worker_urls(cls, value: list[str]) -> list[str]:
        return _url_list(value, "prefill worker")

    @model_validator(mode="after")
    def _prefill_urls_apart(self) -> FrontendConfig:
        both = set(self.worker_urls) & set(self.prefill_worker_urls)
        if both:
            raise ValueError(f"a worker is a decode or a prefill worker, not both: {', '.join(sorted(both))}")
        return self

    @field_validator("router_url")
    @classmethod
    def _router_url(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value, what="router", port=False)

    @property
    def retention(self) -> RetentionSettings:
        """The retention settings as their one record."""
        return RetentionSettings.model_validate({n: getattr(self, k) for n, k in RETENTION_KEYS.items()})

    call_memory_turns: int = Field(4096, ge=1, description="assistant turns kept to restore client edits")
    exact_replay: bool = Field(
        True,
        description="put each session's previous turn back into its next prompt as the model produced it "
        "(its own tokens and whitespace) when the client's echo means the same turn",
    )
    response_store_size: int = Field(1024, ge=1, description="stored responses for previous_response_id")
    drain_delay_s: float = Field(
        5.0, ge=0, description="on SIGTERM: seconds not ready but still serving (endpoints update)"
    )
    drain_grace_s: float = Field(
        120.0, ge=0, description="on SIGTERM: seconds open streams get to finish before exit"
    )
    migration_limit: int = Field(
        3, ge=0, description="times one stream moves to another worker after its worker dies mid-stream"
    )
    state_url: str | None = Field(
        None,
        description="shared state store for replicas: redis://host:port/db (Redis or Valkey); "
        "default: in this process",
    )
    state_url_file: str | None = Field(
        None, description="file holding the state URL (a mounted Secret; used when state_url is unset)"
    )
    processes: int = Field(
        1,
        ge=1,
        le=256,
        description="frontend processes on the port (SO_REUSEPORT); more than 1 needs state_url",
    )
    state_entries: int = Field(65536, ge=1, description="entries the in-process state store keeps")
    state_max_bytes: int = Field(
        256 << 20, ge=1, description="bytes the in-process state store keeps (least recently used go first)"
    )
    response_ttl_s: float = Field(
        30 * 86400.0, gt=0, description="how long a stored response (store: true) is kept, in seconds"
    )
    call_memory_ttl_s: float = Field(
        6 * 3600.0, gt=0, description="how long a remembered assistant turn is kept, in seconds"
    )


PLANNER_SETTINGS = frozenset(
    {"ttft_target_ms", "itl_target_ms", "planner_interval_s", "scale_down_delay_s", "sim_model_load_s"}
)


class UpConfig(FrontendConfig):
    """`agentserve up`: the frontend, an embedded router and in-process sim workers on one port."""

    host: str = Field("127.0.0.1", description="address to listen on")
    model: str = Field("qwen3-sim", description="model name served to clients (its family: qwen3)")
    processes: int = Field(1, ge=1, le=1, description="agentserve up runs in one process")
    workers: int = Field(2, ge=1, le=64, description="in-process sim workers")
    prefill_workers: int = Field(
        0,
        ge=0,
        le=64,
        description="in-process prefill sim workers beside the --workers decode workers: the router "
        "sends cold prompts there and moves their KV (0: aggregated)",
    )
    prefill_threshold_tokens: int | None = Field(
        None,
        ge=0,
        description="uncached prompt tokens above which a prefill worker prefills (default: derived "
        "from the sim profile's timing model)",
    )
    script: str | None = Field(None, description="scenario file of scripted raw outputs (sim_script)")
    sim_speedup: float = Field(
        1.0, ge=0, description="sim engine time scale (2: twice as fast; 0 or inf: no waiting)"
    )
    sim_profile: str = Field(
        "b200-qwen3-30b-a3b-estimate",
        description="engine profile the sim's timing follows: a shipped name (h200-qwen3-30b-a3b-pytorch, "
        "measured; b200-qwen3-30b-a3b-estimate) or a profile YAML file (agentserve profile writes one)",
    )
    sim_kv_blocks: int = Field(32768, ge=1, description="KV cache size of each sim worker, in blocks")
    sim_host_kv_blocks: int = Field(
        0, ge=0, description="host-tier KV blocks of each sim worker (0: no host tier)"
    )
    autoscale: str | None = Field(
        None,
        description="MIN:MAX: the planner scales the sim workers between MIN and MAX to hold the TTFT "
        "and ITL targets (default: a fixed --workers)",
    )
    ttft_target_ms: float = Field(2000.0, gt=0, description="the planner's TTFT target (ms)")
    itl_target_ms: float = Field(100.0, gt=0, description="the planner's ITL target (ms)")
    planner_interval_s: float = Field(
        5.0,
        gt=0,
        description="seconds between the planner's decisions (sim seconds, as every planner duration)",
    )
    scale_down_delay_s: float = Field(
        60.0,
        ge=0,
        description="seconds every decision must ask for fewer workers before one goes (sim seconds)",
    )
    sim_model_load_s: float | None = Field(
        None,
        ge=0,
        description="model load time of a worker the planner adds, in sim seconds (default: the profile's)",
    )

    @field_validator("autoscale")
    @classmethod
    def _autoscale(cls, value: str | None) -> str | None:
        if value is None:
            return None
        low, sep, high = value.partition(":")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise ValueError(f"{value!r}: expected MIN:MAX worker counts, e.g. 1:4")
        if not 1 <= int(low) <= int(high) <= 64:
            raise ValueError(f"{value!r}: need 1 <= MIN <= MAX <= 64")
        return f"{int(low)}:{int(high)}"

    @model_validator(mode="after")
    def _prefill_workers_without_autoscale(self) -> UpConfig:
        if self.prefill_workers and self.autoscale is not None:
            raise ValueError("--prefill-workers and --autoscale do not combine (the planner scales one pool)")
        if self.prefill_worker_urls:
            raise ValueError("agentserve up runs its workers in-process: use --prefill-workers N")
        return self

    @model_validator(mode="after")
    def _planner_settings_need_autoscale(self) -> UpConfig:
        # A planner setting without a planner would be accepted and do nothing: refuse it.
        given = sorted(PLANNER_SETTINGS & self.model_fields_set)
        if self.autoscale is None and given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} set the planner: add --autoscale MIN:MAX")
        return self

    @property
    def autoscale_range(self) -> tuple[int, int] | None:
        if self.autoscale is None:
            return None
        low, _, high = self.autoscale.partition(":")
        return int(low), int(high)


class RouterConfig(_Config):
    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8100, ge=0, le=65535, description="port to listen on")
    policy: Literal["kv", "round-robin", "random", "least-loaded"] = Field("kv", description="placement")
    overlap_weight: float = Field(1.0, ge=0, description="weight of prefill blocks not cached on a worker")
    # 0.15: bringing a block back from host (~2 µs/token over PCIe) vs recomputing it (~15 µs+).
    host_hit_weight: float = Field(
        0.15,
        ge=0,
        le=1,
        description="cost of a prompt block a worker holds only on host, as a fraction of a miss",
    )
    # 0.1: an active block costs a decode step ~0.6 µs, a prefilled block ~1 ms (docs/router.md).
    load_weight: float = Field(0.1, ge=0, description="weight of a worker's active decode blocks")
    temperature: float = Field(0.0, ge=0, description="softmax temperature over costs (0: argmin)")
    affinity_ttl_s: float = Field(300.0, ge=0, description="session affinity lifetime in seconds")
    block_size: int = Field(32, ge=1, description="tokens per KV block (must match the workers)")
    workers: list[str] = Field(default_factory=list, description="static worker URLs")

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: list[str]) -> list[str]:
        return _url_list(value, "worker")

    # Disaggregated prefill (docs/router.md "Prefill and decode, decided per request").
    prefill_workers: list[str] = Field(
        default_factory=list, description="static URLs of prefill workers (role prefill); empty: none"
    )

    @field_validator("prefill_workers")
    @classmethod
    def _prefill_workers(cls, value: list[str]) -> list[str]:
        return _url_list(value, "prefill worker")

    @model_validator(mode="after")
    def _prefill_pool_is_its_own(self) -> RouterConfig:
        both = set(self.workers) & set(self.prefill_workers)
        if both:
            raise ValueError(
                f"a worker is in workers or prefill_workers, not both: {', '.join(sorted(both))}"
            )
        if self.prefill_workers and self.discovery == "kubernetes":
            raise ValueError(
                "prefill_workers are static URLs (discovery: static); use prefill_worker_service"
            )
        if self.prefill_worker_service and self.discovery != "kubernetes":
            raise ValueError("prefill_worker_service needs discovery: kubernetes")
        return self

    prefill_threshold_tokens: int | None = Field(
        None,
        ge=0,
        description="prompt tokens uncached on the decode worker above which a prefill worker prefills "
        "(default: derived from the profile's timing model)",
    )
    prefill_policy: Literal["cost", "threshold"] = Field(
        "cost",
        description="threshold: a prefill worker prefills every prompt whose uncached span exceeds the "
        "threshold (0: every prompt); cost: only when that also costs less than local prefill "
        "(a backlogged prefill pool leaves prompts local)",
    )
    kv_link: Literal["nvlink", "nvlink-b200", "rdma", "rdma-xdr"] = Field(
        "rdma", description="link the KV crosses from prefill to decode worker (transfer cost)"
    )
    profile: str | None = Field(
        None,
        description="engine profile the prefill decision predicts with: a shipped name or a profile YAML "
        "file (default: b200-qwen3-30b-a3b-estimate)",
    )
    discovery: Literal["static", "kubernetes"] = Field("static", description="how workers are found")
    worker_service: str | None = Field(None, description="Kubernetes Service of the workers")
    prefill_worker_service: str | None = Field(
        None,
        description="Kubernetes Service of the prefill workers (discovery: kubernetes)",
    )
    namespace: str | None = Field(None, description="namespace of the worker Service")
    max_inflight_per_worker: int = Field(
        256, ge=1, description="requests a worker may run before new ones wait in the priority queue"
    )
    queue_max: int = Field(
        10_000, ge=1, description="waiting requests beyond which the API answers overloaded"
    )
    kv_events_timeout_s: float = Field(
        5.0, gt=0, description="a worker silent this long on its KV event socket is removed (heartbeat 0.5 s)"
    )
    health_interval_s: float = Field(
        1.0, gt=0, description="period of the workers' /ready probes; two failures in a row remove one"
    )
    ticket_ttl_s: float = Field(
        1800.0, gt=0, description="a routed request never reported finished stops counting as load after this"
    )


class WorkerConfig(_Config):
    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8200, ge=0, le=65535, description="port of the generate API")
    kv_events_port: int = Field(5557, ge=0, le=65535, description="ZeroMQ PUB port for KV events")
    drain_delay_s: float = Field(
        2.0, ge=0, description="on SIGTERM: seconds refusing new requests before the listener closes"
    )
    drain_grace_s: float = Field(
        120.0, ge=0, description="on SIGTERM: seconds running requests get to finish before exit"
    )
    engine: Literal["sim", "trtllm"] = Field("sim", description="inference engine")
    model: str = Field("qwen3-sim", description="model name (its family: qwen3)")
    model_path: str | None = Field(None, description="model directory (weights, tokenizer)")
    family: str | None = Field(None, description="model family of the raw output format")
    block_size: int = Field(32, ge=1, description="tokens per KV block")
    hash_seed: int = Field(0, ge=0, description="seed of the chained block hashes")
    tensor_parallel_size: int = Field(1, ge=1, description="tensor parallel size (trtllm)")
    pipeline_parallel_size: int = Field(1, ge=1, description="pipeline parallel size (trtllm)")
    gpus_per_node: int | None = Field(
        None, ge=1, description="GPUs of one node, for a replica spanning nodes (trtllm; default: auto)"
    )
    free_gpu_memory_fraction: float = Field(0.9, gt=0, le=1, description="GPU memory share for KV cache")
    enable_block_reuse: bool = Field(True, description="reuse KV blocks across requests (prefix cache)")
    extra_llm_api_options: str | None = Field(None, description="YAML of extra TensorRT-LLM LLM() options")
    max_seq_len: int | None = Field(
        None, ge=1, description="longest sequence, prompt + output (default: model's)"
    )
    tokenizer: str | None = Field(
        None, description="tokenizer.json (default: the model's, then the embedded one)"
    )
    max_batch_size: int = Field(256, ge=1, description="most requests in one engine iteration")
    max_num_tokens: int = Field(8192, ge=1, description="most tokens computed in one engine iteration")
    enable_chunked_prefill: bool = Field(True, description="split long prompts across iterations")
    request_abort: bool = Field(True, description="abort engine requests whose caller disconnected")
    sim_kv_blocks: int = Field(32768, ge=1, description="KV cache size of the sim engine, in blocks")
    sim_host_kv_blocks: int = Field(
        0, ge=0, description="host-tier KV blocks of the sim engine (0: evicted blocks are dropped)"
    )
    kv_retention: Literal["off", "agent"] = Field(
        "agent", description="honour the retention sent with requests (off: plain LRU)"
    )
    guided_decoding_backend: Literal["llguidance", "xgrammar"] | None = Field(
        "llguidance",
        description="grammar backend for constrained requests (trtllm LLM(guided_decoding_backend=…); "
        "None: constrained requests are refused)",
    )
    constraint_cache_size: int = Field(
        256, ge=1, description="compiled grammars the sim engine keeps (least recently used go first)"
    )
    host_cache_size: int = Field(
        0, ge=0, description="host (secondary) KV cache in bytes (trtllm KvCacheConfig.host_cache_size)"
    )
    sim_speedup: float = Field(
        1.0, ge=0, description="sim engine time scale (2: twice as fast; 0 or inf: no waiting)"
    )
    sim_profile: str = Field(
        "b200-qwen3-30b-a3b-estimate",
        description="engine profile the sim's timing follows: a shipped name (h200-qwen3-30b-a3b-pytorch, "
        "measured; b200-qwen3-30b-a3b-estimate) or a profile YAML file (agentserve profile writes one)",
    )
    sim_nodes: int = Field(
        1,
        ge=1,
        le=16,
        description="nodes the simulated replica spans: the profile's replica tensor-parallel over that many "
        "of its nodes (compute per GPU ÷ nodes, plus the all-reduces over sim_interconnect)",
    )
    sim_interconnect: Literal["infiniband-ndr", "infiniband-xdr", "roce-400g"] = Field(
        "infiniband-ndr", description="the link between the simulated replica's nodes (sim_nodes > 1)"
    )
    sim_catch_up_s: float = Field(
        0.05,
        ge=0,
        description="a paced sim that fell behind catches up at most this many seconds with merged steps "
        "(0: never, one event-loop hop per iteration)",
    )
    sim_script: str | None = Field(None, description="scenario file of scripted raw outputs (sim engine)")
    sim_dp_ranks: int = Field(
        1,
        ge=1,
        le=64,
        description="attention-DP ranks of the sim engine, each with its own KV cache and per-rank KV "
        "events (as TensorRT-LLM's enable_attention_dp); sim_kv_blocks is per rank",
    )
    role: Literal["prefill", "decode", "both"] = Field(
        "both",
        description="disaggregated prefill: prefill (context-only requests, KV held for decode workers "
        "to pull), decode, or both (aggregated); the router takes prefill workers from prefill_workers",
    )
    sim_kv_hold_s: float = Field(
        60.0,
        ge=0,
        description="a prefill worker holds a context-only request's KV this many seconds for its "
        "decode worker to pull, then releases it (sim engine)",
    )


class PlannerServiceConfig(_Config):
    """`agentserve planner`: the planner over a fleet it reads over the network (docs/planner.md)."""

    host: str = Field("0.0.0.0", description="address of /metrics and /health")
    port: int = Field(8300, ge=0, le=65535, description="port of /metrics and /health")
    discovery: Literal["static", "kubernetes"] = Field(
        "static", description="how the workers, frontends and routers are found"
    )
    namespace: str | None = Field(None, description="namespace of the Services and the deployment")
    deployment: str | None = Field(
        None,
        description="the AgentServingDeployment whose workers it scales (kubernetes; without it the "
        "planner only advises: it logs and exports what it would do)",
    )
    worker_service: str | None = Field(None, description="Kubernetes Service of the workers")
    frontend_service: str | None = Field(None, description="Kubernetes Service of the frontends")
    router_service: str | None = Field(None, description="Kubernetes Service of the routers")
    workers: list[str] = Field(default_factory=list, description="static worker URLs (GET /load)")
    frontends: list[str] = Field(default_factory=list, description="static frontend URLs (GET /metrics)")
    routers: list[str] = Field(default_factory=list, description="static router URLs (GET /metrics)")
    min_workers: int = Field(1, ge=1, le=1000, description="fewest workers")
    max_workers: int = Field(4, ge=1, le=1000, description="most workers")
    ttft_target_ms: float = Field(2000.0, gt=0, description="p90 time-to-first-token target (ms)")
    itl_target_ms: float = Field(100.0, gt=0, description="p90 inter-token latency target (ms)")
    interval_s: float = Field(15.0, gt=0, description="seconds between decisions")
    scale_down_delay_s: float = Field(
        300.0, ge=0, description="seconds every decision must ask for fewer workers before one goes"
    )
    profile: str = Field(
        "b200-qwen3-30b-a3b-estimate",
        description="engine profile the predictions use: a shipped name or a profile YAML file",
    )
    max_num_tokens: int = Field(8192, ge=1, description="the workers' prefill chunk (tokens per iteration)")
    kv_blocks_per_worker: int | None = Field(
        None, ge=1, description="KV blocks of one worker (default: what the workers report on /load)"
    )

    @field_validator("workers", "frontends", "routers")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        return _url_list(value, "planner source")

    @model_validator(mode="after")
    def _consistent(self) -> PlannerServiceConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers {self.min_workers} > max_workers {self.max_workers}")
        if self.discovery == "kubernetes" and not self.worker_service:
            raise ValueError("discovery kubernetes needs worker_service")
        if self.discovery == "static" and not self.workers:
            raise ValueError("discovery static needs workers (URLs)")
        if self.deployment is not None and self.discovery != "kubernetes":
            raise ValueError("deployment (scaling an AgentServingDeployment) needs discovery kubernetes")
        return self


C = TypeVar("C", bound=BaseModel)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(annotation: Any) -> tuple[Any, list[Any] | None, bool]:
    """(python type, choices, is_list) for a field annotation."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _scalar_type(args[0])
    if origin is list:
        inner, choices, _ = _scalar_type(get_args(annotation)[0])
        return inner, choices, True
    if origin is Literal:
        choices = list(get_args(annotation))
        return type(choices[0]), choices, False
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return str, [m.value for m in annotation], False
    return annotation, None, False


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """Add `--config FILE` and one flag per field of `model` (defaults left to the model)."""
    parser.add_argument("--config", type=Path, help="YAML file with settings (flags override it)")
    for name, field in model.model_fields.items():
        kind, choices, is_list = _scalar_type(field.annotation)
        help_text = field.description or ""
        if kind is bool:
            parser.add_argument(
                _flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif is_list:
            parser.add_argument(
                _flag(name),
                dest=name,
                action="append",
                type=kind,
                choices=choices,
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(
                _flag(name), dest=name, type=kind, choices=choices, default=None, help=help_text
            )


class ConfigError(ValueError):
    pass


def load_config(model: type[C], path: Path | None = None, overrides: dict[str, Any] | None = None) -> C:
    """Defaults ← YAML file ← overrides (None values are ignored), validated."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of settings")
        data.update(loaded)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain(model, exc)) from None


def explain(model: type[BaseModel], exc: ValidationError) -> str:
    """One line per problem, naming the flag (and the config file's key) and what it takes."""
    lines = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else ""
        message = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a check across settings (a model validator): its message says which
            lines.append(message)
            continue
        if name not in model.model_fields:
            lines.append(f"unknown setting {name!r} (see --help for the settings)")
            continue
        where = f"{_flag(name)} ({name})"
        if err["type"] != "value_error":  # pydantic's own check: say what was given
            message += f", got {err.get('input')!r}"
        lines.append(f"{where}: {message}")
    return "; ".join(lines)


def config_from_args(model: type[C], args: argparse.Namespace) -> C:
    overrides = {name: getattr(args, name, None) for name in model.model_fields}
    return load_config(model, getattr(args, "config", None), overrides)


def config_to_yaml(config: BaseModel) -> str:
    """The YAML a component reads back with `--config` (what the operator puts in its ConfigMap)."""
    return yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=True)
