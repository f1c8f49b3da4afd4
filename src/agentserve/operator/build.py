"""Desired state as a pure function: an `AgentServingDeployment` spec → the Kubernetes objects it needs.

`build(spec, name, namespace, uid)` returns plain dicts (what server-side apply sends). Nothing here
talks to a cluster; `agentserve manifests` prints the result and the operator applies it.

The component configuration goes through `agentserve.config`: `MAPPINGS` is the one table of which
spec field lands in which component config key. `render_configs` walks it, validates the result by
constructing `FrontendConfig`/`RouterConfig`/`WorkerConfig`, and the ConfigMap carries their YAML,
which each container reads with `agentserve <component> --config /etc/agentserve/<component>.yaml`.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from agentserve import __version__
from agentserve.config import (
    RETENTION_KEYS,
    FrontendConfig,
    PlannerServiceConfig,
    RouterConfig,
    WorkerConfig,
    config_to_yaml,
)
from agentserve.operator.spec import (
    API_VERSION,
    KIND,
    MANAGED_SIGNING_KEY,
    AgentServingDeploymentSpec,
    ComponentSpec,
)
from agentserve.planner.access import role_rules
from agentserve.worker.profiles import DEFAULT_PROFILE

Component = Literal["frontend", "router", "worker"]
COMPONENTS: tuple[Component, ...] = ("frontend", "router", "worker")
# The planner runs only with spec.autoscaling: a part of the deployment, not one of the components
# every deployment has (status, PDBs and the config mappings are about those three).
Part = Literal["frontend", "router", "worker", "planner"]
PLANNER: Part = "planner"
CONFIG_MODELS: dict[Component, type[BaseModel]] = {
    "frontend": FrontendConfig,
    "router": RouterConfig,
    "worker": WorkerConfig,
}

PORTS: dict[Part, int] = {"frontend": 8000, "router": 8100, "worker": 8200, "planner": 8300}
KV_EVENTS_PORT = 5557
CONFIG_DIR = "/etc/agentserve"
MODEL_DIR = "/models"
CACHE_DIR = "/var/cache/agentserve"
AUTH_DIR = "/etc/agentserve/auth"
SIGNING_DIR = "/etc/agentserve/signing"
STATE_DIR = "/etc/agentserve/state"
VALKEY_PORT = 6379
# Seconds a draining process stays listening but not ready (config drain_delay_s): the frontend's
# covers the Service's endpoint update, a worker's the router's next health probe.
DRAIN_DELAY: dict[str, float] = {"frontend": 5.0, "router": 0.0, "worker": 2.0}
SECRET_FILE_MODE = 0o440  # owner root, group fsGroup (the frontend's): read-only, nobody else
TRACE_DIR = "/var/lib/agentserve/traces"
TEMPLATE_DIR = "/etc/agentserve/chat-template"
PROFILE_DIR = "/etc/agentserve/profile"
PROFILE_FILE = "profile.yaml"
LLM_API_OPTIONS_KEY = "llm-api-options.yaml"
# The prefill pool (spec.workers.prefill): its objects' name suffix and component label, its files.
PREFILL = "prefill-worker"
PREFILL_CONFIG_KEY = f"{PREFILL}.yaml"
PREFILL_LLM_API_OPTIONS_KEY = "prefill-llm-api-options.yaml"
INLINE_TEMPLATE_KEY = "chat-template.jinja"
RUN_AS = 1000

# LeaderWorkerSet (sigs.k8s.io/lws v0.9.0: api/leaderworkerset/v1): workers spanning nodes.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # set on each pod; 0: the leader
LWS_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"

IMAGE_REPOSITORY = "ghcr.io/agentserve"
MANAGED_BY = "agentserve-operator"
CONFIG_HASH_ANNOTATION = "agentserve.dev/config-hash"

L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_PART_OF = "app.kubernetes.io/part-of"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
L_VERSION = "app.kubernetes.io/version"


@dataclass(frozen=True)
class Target:
    """Where the objects go: the CR's name and namespace (and uid, for owner references)."""

    name: str
    namespace: str
    uid: str | None = None

    def child(self, component: Part) -> str:
        return f"{self.name}-{component}"

    @property
    def worker_group(self) -> str:
        """The LeaderWorkerSet of workers spanning nodes. Not NAME-worker: LWS makes a headless Service
        of its own name for the pods' DNS, and NAME-worker is ours (leaders only, for the router).
        Short, because a StatefulSet name + "-" + group index must stay within 52 characters."""
        return f"{self.name}-lws"

    @property
    def prefill_workers(self) -> str:
        """The prefill pool's Deployment, Service and PDB (`spec.workers.prefill`)."""
        return f"{self.name}-{PREFILL}"

    @property
    def config_map(self) -> str:
        return f"{self.name}-config"

    @property
    def signing_secret(self) -> str:
        """The Secret the operator creates for the signing key when the spec names none."""
        return f"{self.name}-signing-key"

    @property
    def state_service(self) -> str:
        """The managed Valkey's Service and StatefulSet (`spec.state.managed`)."""
        return f"{self.name}-state"

    @property
    def frontend_url(self) -> str:
        return f"http://{self.child('frontend')}.{self.namespace}.svc:{PORTS['frontend']}"


@dataclass(frozen=True)
class Ctx:
    spec: AgentServingDeploymentSpec
    target: Target


# ------------------------------------------------------------------------------- resolved settings


def model_path(spec: AgentServingDeploymentSpec) -> str | None:
    source = spec.model.source
    if source is None:
        return None
    if source.pvc is not None:
        return posixpath.normpath(posixpath.join(MODEL_DIR, source.pvc.path.strip("/"))) or MODEL_DIR
    if source.host_path is not None:
        return MODEL_DIR
    assert source.image is not None
    return source.image.path


def resolved_family(spec: AgentServingDeploymentSpec) -> str | None:
    """The family in effect: the spec's, else the one the registry infers from the model name."""
    if spec.model.family:
        return spec.model.family
    from agentserve.families import family_for_model

    family = family_for_model(spec.model.name)
    return family.name if family is not None else None


def _tokenizer(spec: AgentServingDeploymentSpec) -> str | None:
    tokenizer = spec.model.tokenizer
    if tokenizer is None or posixpath.isabs(tokenizer):
        return tokenizer
    base = model_path(spec)
    return posixpath.join(base, tokenizer) if base else tokenizer


def _chat_template(spec: AgentServingDeploymentSpec) -> str | None:
    template = spec.model.chat_template
    if template is None:
        return None
    if template.inline is not None:
        return posixpath.join(CONFIG_DIR, INLINE_TEMPLATE_KEY)
    return posixpath.join(TEMPLATE_DIR, "template.jinja")


def _api_keys_file(spec: AgentServingDeploymentSpec) -> str | None:
    return posixpath.join(AUTH_DIR, "api-keys") if spec.auth.api_keys_secret is not None else None


def signing_key_source(spec: AgentServingDeploymentSpec, target: Target) -> tuple[str, str]:
    """The Secret and key every frontend replica reads its signing key from: the spec's, else ours."""
    ref = spec.auth.signing_key_secret
    if ref is not None:
        return ref.name, ref.key
    return target.signing_secret, MANAGED_SIGNING_KEY


def _signing_key_file(spec: AgentServingDeploymentSpec) -> str:
    # Named after the Secret's key: pointing the spec at another key changes frontend.yaml too.
    ref = spec.auth.signing_key_secret
    return posixpath.join(SIGNING_DIR, ref.key if ref is not None else MANAGED_SIGNING_KEY)


def _state_url(ctx: Ctx) -> str | None:
    if ctx.spec.state.managed is None:
        return None
    return f"redis://{ctx.target.state_service}.{ctx.target.namespace}.svc:{VALKEY_PORT}/0"


def _state_url_file(spec: AgentServingDeploymentSpec) -> str | None:
    ref = spec.state.url_secret
    return posixpath.join(STATE_DIR, ref.key) if ref is not None else None


def cpu_cores(quantity: int | str | None) -> float | None:
    """A Kubernetes CPU quantity in cores ("2", 2, "1500m", "0.5"); None when unset or unreadable."""
    if quantity is None:
        return None
    text = str(quantity).strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None


def frontend_processes(spec: AgentServingDeploymentSpec) -> int:
    """`frontend.processes`, else one per whole core of the pod's CPU limit (else request) when the
    state is shared: one Python process uses one core. Without shared state: 1 (each process would
    keep its own responses and remembered turns)."""
    if spec.frontend.processes is not None:
        return spec.frontend.processes
    if not spec.state.shared:
        return 1
    res = spec.frontend.resources
    if res is None:
        return 1
    cores = cpu_cores(res.limits.get("cpu")) or cpu_cores(res.requests.get("cpu"))
    return max(1, min(64, int(cores))) if cores else 1


def _drain_grace(component: Component) -> Callable[[Ctx], float]:
    """What is left of the pod's termination grace period once the drain delay passed (2 s spare)."""

    def grace(ctx: Ctx) -> float:
        cs = _component_spec(ctx.spec, component)
        period = cs.termination_grace_period_seconds
        if period is None:
            period = _default_grace(component)
        return max(0.0, period - DRAIN_DELAY[component] - 2.0)

    return grace


def _default_grace(component: Component) -> int:
    return 60 if component == "worker" else 30


def _trace_sink(spec: AgentServingDeploymentSpec) -> str | None:
    return posixpath.join(TRACE_DIR, "trace.jsonl") if spec.observability.trace_sink.enabled else None


def _llm_api_options(spec: AgentServingDeploymentSpec) -> str | None:
    if spec.workers.llm_api_options is None:
        return None
    return posixpath.join(CONFIG_DIR, LLM_API_OPTIONS_KEY)


# --------------------------------------------------------------------------------- mapping table


@dataclass(frozen=True)
class Mapping:
    """One row: the spec field (camelCase path under `spec`) → one component config key."""

    spec: str
    component: Component
    key: str
    value: Callable[[Ctx], Any]
    note: str = ""


def _s(get: Callable[[AgentServingDeploymentSpec], Any]) -> Callable[[Ctx], Any]:
    return lambda ctx: get(ctx.spec)


def _retention_setting(name: str) -> Callable[[Ctx], Any]:
    return lambda ctx: getattr(ctx.spec.workers.kv_cache.retention, name)


def inflight_limit(spec: AgentServingDeploymentSpec) -> int:
    """The router's in-flight limit per worker: the spec's, else the engine's batch size. More than the
    batch would queue requests inside TensorRT-LLM, where the router cannot reorder them."""
    if spec.router.max_inflight_per_worker is not None:
        return spec.router.max_inflight_per_worker
    options = spec.workers.llm_api_options or {}
    batch = options.get("max_batch_size")
    if not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
        batch = WorkerConfig.model_fields["max_batch_size"].default
    # With attention DP every tensor-parallel rank runs its own batch: the executor admits up to
    # tp_size × max_batch_size requests (executor_request_queue.py, `_fetch_new_requests_attention_dp`).
    ranks = spec.workers.tensor_parallel_size if options.get("enable_attention_dp") is True else 1
    return int(batch) * ranks


MAPPINGS: tuple[Mapping, ...] = (
    # model
    Mapping("model.name", "frontend", "model", _s(lambda s: s.model.name)),
    Mapping("model.name", "worker", "model", _s(lambda s: s.model.name)),
    Mapping("model.family", "frontend", "family", _s(resolved_family), "inferred from model.name when unset"),
    Mapping("model.family", "worker", "family", _s(resolved_family), "inferred from model.name when unset"),
    Mapping("model.source", "frontend", "model_path", _s(model_path), "mounted read-only at /models"),
    Mapping("model.source", "worker", "model_path", _s(model_path), "mounted read-only at /models"),
    Mapping(
        "model.tokenizer", "frontend", "tokenizer", _s(_tokenizer), "relative paths: under the model dir"
    ),
    Mapping("model.tokenizer", "worker", "tokenizer", _s(_tokenizer), "the sim worker's output tokenizer"),
    Mapping("model.chatTemplate", "frontend", "chat_template", _s(_chat_template), "mounted file"),
    Mapping("model.contextLength", "frontend", "context_length", _s(lambda s: s.model.context_length)),
    Mapping("model.contextLength", "worker", "max_seq_len", _s(lambda s: s.model.context_length)),
    # agent
    Mapping("agent.reasoningParser", "frontend", "reasoning_parser", _s(lambda s: s.agent.reasoning_parser)),
    Mapping("agent.toolCallParser", "frontend", "tool_call_parser", _s(lambda s: s.agent.tool_call_parser)),
    Mapping("agent.replay.policy", "frontend", "replay_policy", _s(lambda s: s.agent.replay.policy)),
    Mapping(
        "agent.replay.truncateHistoryThinking",
        "frontend",
        "truncate_history_thinking",
        _s(lambda s: s.agent.replay.truncate_history_thinking),
    ),
    Mapping(
        "agent.reasoningDefault", "frontend", "reasoning_default", _s(lambda s: s.agent.reasoning_default)
    ),
    Mapping("agent.exactReplay", "frontend", "exact_replay", _s(lambda s: s.agent.exact_replay)),
    Mapping(
        "agent.preambleStripping.enabled",
        "frontend",
        "strip_anthropic_preamble",
        _s(lambda s: s.agent.preamble_stripping.enabled),
    ),
    Mapping(
        "agent.preambleStripping.patterns",
        "frontend",
        "strip_pattern",
        _s(lambda s: [f"{p.name}={p.regex}" for p in s.agent.preamble_stripping.patterns]),
        "each as NAME=REGEX",
    ),
    Mapping(
        "agent.streamingToolDispatch.enabled",
        "frontend",
        "enable_streaming_tool_dispatch",
        _s(lambda s: s.agent.streaming_tool_dispatch.enabled),
    ),
    Mapping(
        "agent.constrainedDecoding.enabled",
        "frontend",
        "constrained_decoding",
        _s(lambda s: s.agent.constrained_decoding.enabled),
    ),
    Mapping(
        "agent.constrainedDecoding.cacheSize",
        "frontend",
        "constraint_cache_size",
        _s(lambda s: s.agent.constrained_decoding.cache_size),
    ),
    Mapping(
        "agent.constrainedDecoding.cacheSize",
        "worker",
        "constraint_cache_size",
        _s(lambda s: s.agent.constrained_decoding.cache_size),
    ),
    Mapping(
        "agent.constrainedDecoding.backend",
        "worker",
        "guided_decoding_backend",
        _s(lambda s: s.agent.constrained_decoding.backend),
        "TensorRT-LLM LLM(guided_decoding_backend=…); disabled: the frontend sends no constraint",
    ),
    Mapping("agent.apis", "frontend", "apis", _s(lambda s: list(s.agent.apis))),
    Mapping("agent.codexCatalog", "frontend", "codex_catalog", _s(lambda s: s.agent.codex_catalog)),
    # frontend
    Mapping(
        "frontend.maxRequestBodyBytes",
        "frontend",
        "max_body_bytes",
        _s(lambda s: s.frontend.max_request_body_bytes),
    ),
    Mapping(
        "frontend.processes",
        "frontend",
        "processes",
        _s(frontend_processes),
        "unset: whole cores of the CPU limit (else request) with shared state, else 1",
    ),
    Mapping(
        "auth.apiKeysSecret", "frontend", "api_keys_file", _s(_api_keys_file), "Secret key mounted as a file"
    ),
    Mapping(
        "auth.signingKeySecret",
        "frontend",
        "signing_key_file",
        _s(_signing_key_file),
        "Secret key mounted read-only as a file; unset: NAME-signing-key, created by the operator",
    ),
    Mapping("observability.traceSink", "frontend", "trace_sink", _s(_trace_sink), "emptyDir or PVC, per pod"),
    Mapping("state.managed", "frontend", "state_url", _state_url, "the operator's Valkey Service"),
    Mapping(
        "state.urlSecret", "frontend", "state_url_file", _s(_state_url_file), "Secret key mounted as a file"
    ),
    Mapping(
        "state.responseTtlSeconds", "frontend", "response_ttl_s", _s(lambda s: s.state.response_ttl_seconds)
    ),
    Mapping(
        "state.callMemoryTtlSeconds",
        "frontend",
        "call_memory_ttl_s",
        _s(lambda s: s.state.call_memory_ttl_seconds),
    ),
    Mapping("(fixed)", "frontend", "drain_delay_s", lambda c: DRAIN_DELAY["frontend"]),
    Mapping(
        "frontend.terminationGracePeriodSeconds",
        "frontend",
        "drain_grace_s",
        _drain_grace("frontend"),
        "the grace period less the drain delay",
    ),
    Mapping("(fixed)", "worker", "drain_delay_s", lambda c: DRAIN_DELAY["worker"]),
    Mapping(
        "workers.terminationGracePeriodSeconds",
        "worker",
        "drain_grace_s",
        _drain_grace("worker"),
        "the grace period less the drain delay",
    ),
    # router
    Mapping("router.policy", "router", "policy", _s(lambda s: s.router.policy)),
    Mapping("router.weights.overlap", "router", "overlap_weight", _s(lambda s: s.router.weights.overlap)),
    Mapping("router.weights.load", "router", "load_weight", _s(lambda s: s.router.weights.load)),
    Mapping("router.temperature", "router", "temperature", _s(lambda s: s.router.temperature)),
    Mapping(
        "router.affinityTtlSeconds", "router", "affinity_ttl_s", _s(lambda s: s.router.affinity_ttl_seconds)
    ),
    Mapping(
        "router.maxInflightPerWorker",
        "router",
        "max_inflight_per_worker",
        _s(inflight_limit),
        "default: llmApiOptions.max_batch_size, else the worker's max_batch_size; × tensorParallelSize "
        "with llmApiOptions.enable_attention_dp (one batch per rank)",
    ),
    # workers
    Mapping("workers.engine", "worker", "engine", _s(lambda s: s.workers.engine)),
    Mapping(
        "workers.sim.profile",
        "worker",
        "sim_profile",
        _s(lambda s: s.workers.sim.profile if s.workers.sim is not None else None),
        "a shipped profile's name (sim engine only)",
    ),
    Mapping(
        "workers.tensorParallelSize",
        "worker",
        "tensor_parallel_size",
        _s(lambda s: s.workers.tensor_parallel_size),
    ),
    Mapping(
        "workers.pipelineParallelSize",
        "worker",
        "pipeline_parallel_size",
        _s(lambda s: s.workers.pipeline_parallel_size),
    ),
    Mapping(
        "nodePool.gpusPerNode",
        "worker",
        "gpus_per_node",
        _s(lambda s: s.node_pool.gpus_per_node if s.resolved_nodes_per_worker() > 1 else None),
        "set for workers spanning nodes",
    ),
    Mapping(
        "workers.kvCache.enableBlockReuse",
        "worker",
        "enable_block_reuse",
        _s(lambda s: s.workers.kv_cache.enable_block_reuse),
    ),
    Mapping(
        "workers.kvCache.freeGpuMemoryFraction",
        "worker",
        "free_gpu_memory_fraction",
        _s(lambda s: s.workers.kv_cache.free_gpu_memory_fraction),
    ),
    # The retention settings, each to the frontend's flat key (one record: config.RetentionSettings).
    *(
        Mapping(
            f"workers.kvCache.retention.{to_camel(name)}",
            "frontend",
            key,
            _retention_setting(name),
            "the frontend decides each request's retention" if name == "mode" else "",
        )
        for name, key in RETENTION_KEYS.items()
    ),
    Mapping(
        "workers.kvCache.retention.mode",
        "worker",
        "kv_retention",
        _s(lambda s: s.workers.kv_cache.retention.mode),
        "off: the worker ignores retention",
    ),
    Mapping(
        "workers.kvCache.hostCacheBytes",
        "worker",
        "host_cache_size",
        _s(lambda s: s.workers.kv_cache.host_cache_bytes),
        "TensorRT-LLM KvCacheConfig.host_cache_size",
    ),
    Mapping(
        "workers.kvCache.tokensPerBlock",
        "worker",
        "block_size",
        _s(lambda s: s.workers.kv_cache.tokens_per_block),
    ),
    Mapping(
        "workers.kvCache.tokensPerBlock",
        "router",
        "block_size",
        _s(lambda s: s.workers.kv_cache.tokens_per_block),
        "shared: router hashes like the workers",
    ),
    Mapping(
        "workers.kvCache.tokensPerBlock",
        "frontend",
        "block_size",
        _s(lambda s: s.workers.kv_cache.tokens_per_block),
        "shared: frontend hashes like the workers",
    ),
    Mapping(
        "workers.llmApiOptions",
        "worker",
        "extra_llm_api_options",
        _s(_llm_api_options),
        "rendered to llm-api-options.yaml in the ConfigMap",
    ),
    # wiring from the object itself (no spec field)
    Mapping(
        "(metadata.name)",
        "frontend",
        "router_url",
        lambda c: f"http://{c.target.child('router')}:{PORTS['router']}",
    ),
    Mapping("(fixed)", "router", "discovery", lambda c: "kubernetes", "EndpointSlices of the worker Service"),
    Mapping("(metadata.name)", "router", "worker_service", lambda c: c.target.child("worker")),
    Mapping(
        "workers.prefill",
        "router",
        "prefill_worker_service",
        lambda c: c.target.prefill_workers if c.spec.workers.prefill is not None else None,
        "EndpointSlices of the prefill pool's Service",
    ),
    Mapping(
        "workers.prefill.thresholdTokens",
        "router",
        "prefill_threshold_tokens",
        _s(lambda s: s.workers.prefill.threshold_tokens if s.workers.prefill is not None else None),
    ),
    Mapping(
        "workers.prefill",
        "worker",
        "role",
        _s(lambda s: "decode" if s.workers.prefill is not None else None),
        "decode beside a prefill pool (whose pods get role prefill), else both",
    ),
    Mapping("(metadata.namespace)", "router", "namespace", lambda c: c.target.namespace),
    Mapping("(fixed)", "frontend", "port", lambda c: PORTS["frontend"]),
    Mapping("(fixed)", "router", "port", lambda c: PORTS["router"]),
    Mapping("(fixed)", "worker", "port", lambda c: PORTS["worker"]),
    Mapping("(fixed)", "worker", "kv_events_port", lambda c: KV_EVENTS_PORT),
)

# Config keys no spec field sets: the component's default is what a cluster wants.
COMPONENT_DEFAULTS: dict[Component, frozenset[str]] = {
    "frontend": frozenset(
        {
            "host",
            "hash_seed",
            # trace file tuning and the tool-event socket: component defaults until the spec exposes them
            "trace_rotate_bytes",
            "trace_keep_files",
            "trace_gzip",
            "trace_queue_size",
            "trace_replay_hashes",
            "tool_events_zmq",
            # Serving details with working defaults. A cluster frontend reaches workers through the
            # router service (router_url), never a static worker list.
            "model_aliases",
            "accept_any_model",
            "ping_interval_s",
            "worker_urls",
            "prefill_worker_urls",
            "call_memory_turns",
            "response_store_size",
            "state_entries",
            "state_max_bytes",
            "migration_limit",
        }
    ),
    # Queue limits: the defaults match the workers' default batch size. Liveness timing: the
    # defaults suit in-cluster networks (the workers heartbeat every 0.5 s).
    "router": frozenset(
        {
            "host",
            "workers",
            "queue_max",
            "kv_events_timeout_s",
            "health_interval_s",
            "ticket_ttl_s",
            # Host-tier pricing: the default matches PCIe copy vs recompute (docs/router.md).
            "host_hit_weight",
            # Disaggregated prefill (docs/router.md): the prefill pool is discovered from its Service
            # (prefill_worker_service); the decision's model keeps the router's defaults.
            "prefill_workers",
            "prefill_policy",
            "kv_link",
            "profile",
        }
    ),
    "worker": frozenset(
        {
            "host",
            "hash_seed",
            # Scheduler limits and request abort: TensorRT-LLM's own defaults suit B200 pools; tune
            # through workers.llmApiOptions until they are spec fields.
            "max_batch_size",
            "max_num_tokens",
            "enable_chunked_prefill",
            "request_abort",
            # Sim engine knobs: clusters running the sim take its defaults (echo output, no script).
            "sim_kv_blocks",
            "sim_host_kv_blocks",
            "sim_speedup",
            "sim_dp_ranks",
            "sim_catch_up_s",
            "sim_script",
            # A sim replica spanning nodes is for benchmarks; a sim worker pod is one node (CEL).
            "sim_nodes",
            "sim_interconnect",
            # Disaggregated prefill: a prefill worker holds KV for pulls the sim's default time.
            "sim_kv_hold_s",
        }
    ),
}


def render_configs(spec: AgentServingDeploymentSpec, target: Target) -> dict[Component, BaseModel]:
    """The component configurations of a spec, validated by the config models themselves."""
    ctx = Ctx(spec, target)
    values: dict[Component, dict[str, Any]] = {c: {} for c in COMPONENTS}
    for row in MAPPINGS:
        value = row.value(ctx)
        if value is not None:
            values[row.component][row.key] = value
    return {c: CONFIG_MODELS[c].model_validate(values[c]) for c in COMPONENTS}


def config_files(spec: AgentServingDeploymentSpec, target: Target) -> dict[str, str]:
    """The ConfigMap's data: one YAML per component, plus the LLM API options and inline template."""
    files = {f"{c}.yaml": config_to_yaml(cfg) for c, cfg in render_configs(spec, target).items()}
    if spec.workers.llm_api_options is not None:
        files[LLM_API_OPTIONS_KEY] = yaml.safe_dump(spec.workers.llm_api_options, sort_keys=True)
    if spec.model.chat_template is not None and spec.model.chat_template.inline is not None:
        files[INLINE_TEMPLATE_KEY] = spec.model.chat_template.inline
    planner = planner_config(spec, target)
    if planner is not None:
        files[f"{PLANNER}.yaml"] = config_to_yaml(planner)
    files.update(_prefill_files(spec, target))
    return files


def _prefill_files(spec: AgentServingDeploymentSpec, target: Target) -> dict[str, str]:
    """The prefill pool's worker config (the decode workers' with the pool's settings, role prefill)
    and its LLM API options."""
    view = spec.prefill_view()
    if view is None:
        return {}
    worker = render_configs(view, target)["worker"]
    options = view.workers.llm_api_options
    update: dict[str, Any] = {
        "role": "prefill",
        "extra_llm_api_options": posixpath.join(CONFIG_DIR, PREFILL_LLM_API_OPTIONS_KEY) if options else None,
    }
    files = {
        PREFILL_CONFIG_KEY: config_to_yaml(WorkerConfig.model_validate({**worker.model_dump(), **update}))
    }
    if options:
        files[PREFILL_LLM_API_OPTIONS_KEY] = yaml.safe_dump(options, sort_keys=True)
    return files


def planner_profile(spec: AgentServingDeploymentSpec) -> str:
    """The profile the planner predicts with: a mounted ConfigMap key, the named one, the sim
    workers' own, else the default."""
    scaling = spec.autoscaling
    if scaling is not None and scaling.profile_config_map is not None:
        return posixpath.join(PROFILE_DIR, PROFILE_FILE)
    if scaling is not None and scaling.profile is not None:
        return scaling.profile
    if spec.workers.engine == "sim" and spec.workers.sim is not None:
        return spec.workers.sim.profile
    return DEFAULT_PROFILE


def planner_config(spec: AgentServingDeploymentSpec, target: Target) -> PlannerServiceConfig | None:
    """`agentserve planner`'s configuration for `spec.autoscaling` (None without it)."""
    scaling = spec.autoscaling
    if scaling is None:
        return None
    options = spec.workers.llm_api_options or {}
    chunk = options.get("max_num_tokens")
    if not (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1):
        chunk = WorkerConfig.model_fields["max_num_tokens"].default
    return PlannerServiceConfig.model_validate(
        {
            "port": PORTS["planner"],
            "discovery": "kubernetes",
            "namespace": target.namespace,
            "deployment": target.name,
            "worker_service": target.child("worker"),
            "frontend_service": target.child("frontend"),
            "router_service": target.child("router"),
            "min_workers": scaling.min_workers,
            "max_workers": scaling.max_workers,
            "ttft_target_ms": scaling.ttft_target_ms,
            "itl_target_ms": scaling.itl_target_ms,
            "interval_s": scaling.interval_seconds,
            "scale_down_delay_s": scaling.scale_down_delay_seconds,
            "profile": planner_profile(spec),
            "max_num_tokens": int(chunk),
        }
    )


_FILES_READ: dict[Part, tuple[str, ...]] = {
    "frontend": ("frontend.yaml", INLINE_TEMPLATE_KEY),
    "router": ("router.yaml",),
    "worker": ("worker.yaml", LLM_API_OPTIONS_KEY),
    "planner": ("planner.yaml",),
}


def config_hash(files: dict[str, str], component: Part) -> str:
    """Hash of the files a component reads: a change rolls that component's pods, and only those."""
    digest = hashlib.sha256()
    for key in _FILES_READ[component]:
        if key in files:
            digest.update(key.encode() + b"\0" + files[key].encode() + b"\0")
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------- objects


def selector_labels(target: Target, component: Part) -> dict[str, str]:
    return {L_NAME: "agentserve", L_INSTANCE: target.name, L_COMPONENT: component}


def labels(target: Target, component: Part | None = None) -> dict[str, str]:
    out = {
        L_NAME: "agentserve",
        L_INSTANCE: target.name,
        L_PART_OF: "agentserve",
        L_MANAGED_BY: MANAGED_BY,
        L_VERSION: __version__,
    }
    if component is not None:
        out[L_COMPONENT] = component
    return out


def owned_selector(name: str) -> str:
    """Label selector of every child of the CR `name`."""
    return f"{L_INSTANCE}={name},{L_MANAGED_BY}={MANAGED_BY}"


def worker_selector(name: str, groups: bool = False) -> str:
    """Label selector of the worker pods (the scale subresource's `status.selector`): with workers
    spanning nodes, of the groups' leaders (one pod per worker, as an HPA must count them)."""
    leaders = f",{LWS_WORKER_INDEX}=0" if groups else ""
    return f"{L_NAME}=agentserve,{L_INSTANCE}={name},{L_COMPONENT}=worker{leaders}"


def object_meta(target: Target, name: str, component: Part | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": target.namespace, "labels": labels(target, component)}
    if target.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": target.name,
                "uid": target.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def default_image(component: Part, spec: AgentServingDeploymentSpec) -> str:
    if component == "worker" and spec.workers.engine == "trtllm":
        return f"{IMAGE_REPOSITORY}/worker-trtllm:{__version__}"
    return f"{IMAGE_REPOSITORY}/agentserve:{__version__}"


def _http_probe(path: str, port: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _probes(component: Component, spec: AgentServingDeploymentSpec) -> dict[str, Any]:
    if component == "worker":
        period = 10
        startup = _http_probe(
            # /ready, not /health: /health answers while the weights load, so the startup
            # timeout would enforce nothing.
            "/ready",
            "http",
            period,
            5,
            -(-spec.workers.startup_timeout_seconds // period),
        )
        return {
            "startupProbe": startup,
            "livenessProbe": _http_probe("/health", "http", 10, 10, 3),
            "readinessProbe": _http_probe("/ready", "http", 5, 5, 3),
        }
    return {
        "startupProbe": _http_probe("/health", "http", 2, 2, 150),
        "livenessProbe": _http_probe("/health", "http", 10, 5, 3),
        "readinessProbe": _http_probe("/ready", "http", 5, 3, 2),
    }


def _env(user: list[dict[str, Any]], defaults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Operator defaults, then the user's variables (a user variable replaces a default of its name)."""
    names = {e.get("name") for e in user}
    return [e for e in defaults if e["name"] not in names] + [dict(e) for e in user]


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _component_spec(spec: AgentServingDeploymentSpec, component: Component) -> ComponentSpec:
    return {"frontend": spec.frontend, "router": spec.router, "worker": spec.workers}[component]


def _model_volume(spec: AgentServingDeploymentSpec) -> dict[str, Any] | None:
    source = spec.model.source
    if source is None or source.image is not None:
        return None
    if source.pvc is not None:
        return {
            "name": "model",
            "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
        }
    assert source.host_path is not None
    return {"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}


def _resources(spec: AgentServingDeploymentSpec, component: Component) -> dict[str, Any]:
    cs = _component_spec(spec, component)
    limits: dict[str, Any] = dict(cs.resources.limits) if cs.resources else {}
    requests: dict[str, Any] = dict(cs.resources.requests) if cs.resources else {}
    if component == "worker":
        gpus = spec.resolved_gpus_per_worker()
        gpu = spec.node_pool.gpu_resource
        limits.pop(gpu, None)
        requests.pop(gpu, None)
        if gpus:
            limits[gpu] = gpus
            requests[gpu] = gpus
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _placement(spec: AgentServingDeploymentSpec, component: Component) -> dict[str, Any]:
    cs = _component_spec(spec, component)
    selector = dict(cs.node_selector)
    tolerations = [dict(t) for t in cs.tolerations]
    affinity = cs.affinity
    if component == "worker" and spec.resolved_gpus_per_worker() > 0:
        # The GPU node pool; sim workers need no GPU and go wherever workers.* places them.
        selector = {**spec.node_pool.node_selector, **selector}
        tolerations = [dict(t) for t in spec.node_pool.tolerations] + tolerations
        affinity = affinity if affinity is not None else spec.node_pool.affinity
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = selector
    if tolerations:
        out["tolerations"] = tolerations
    if affinity is not None:
        out["affinity"] = dict(affinity)
    if cs.topology_spread_constraints:
        out["topologySpreadConstraints"] = [dict(t) for t in cs.topology_spread_constraints]
    return out


def _volumes(
    spec: AgentServingDeploymentSpec, target: Target, component: Component
) -> tuple[list[Any], list[Any]]:
    cache: dict[str, Any] = {"name": "cache", "emptyDir": {}}
    if component == "worker":
        worker_cache = spec.workers.cache
        if worker_cache.claim_name is not None:
            cache = {"name": "cache", "persistentVolumeClaim": {"claimName": worker_cache.claim_name}}
        elif worker_cache.size_limit is not None:
            cache = {"name": "cache", "emptyDir": {"sizeLimit": str(worker_cache.size_limit)}}
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": target.config_map}},
        {"name": "tmp", "emptyDir": {}},
        cache,
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    model = _model_volume(spec)
    if model is not None and component in ("frontend", "worker"):
        volumes.append(model)
        mount: dict[str, Any] = {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
        mounts.append(mount)
    if component == "worker":
        volumes.append(
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(spec.workers.shm_size)}}
        )
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    if component == "frontend":
        template = spec.model.chat_template
        if template is not None and template.config_map is not None:
            ref = template.config_map
            volumes.append(
                {
                    "name": "chat-template",
                    "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": "template.jinja"}]},
                }
            )
            mounts.append({"name": "chat-template", "mountPath": TEMPLATE_DIR, "readOnly": True})
        secret = spec.auth.api_keys_secret
        if secret is not None:
            volumes.append(
                {
                    "name": "auth",
                    "secret": {"secretName": secret.name, "items": [{"key": secret.key, "path": "api-keys"}]},
                }
            )
            mounts.append({"name": "auth", "mountPath": AUTH_DIR, "readOnly": True})
        # Every replica mounts the same Secret, so all of them sign and seal with one key. Not optional:
        # a pod must wait for the Secret rather than start with a key of its own.
        secret_name, secret_key = signing_key_source(spec, target)
        volumes.append(
            {
                "name": "signing-key",
                "secret": {
                    "secretName": secret_name,
                    "items": [{"key": secret_key, "path": secret_key}],
                    "defaultMode": SECRET_FILE_MODE,
                },
            }
        )
        mounts.append({"name": "signing-key", "mountPath": SIGNING_DIR, "readOnly": True})
        state = spec.state.url_secret
        if state is not None:
            volumes.append(
                {
                    "name": "state-url",
                    "secret": {
                        "secretName": state.name,
                        "items": [{"key": state.key, "path": state.key}],
                        "defaultMode": SECRET_FILE_MODE,
                    },
                }
            )
            mounts.append({"name": "state-url", "mountPath": STATE_DIR, "readOnly": True})
        sink = spec.observability.trace_sink
        if sink.enabled:
            if sink.claim_name:
                volumes.append({"name": "traces", "persistentVolumeClaim": {"claimName": sink.claim_name}})
            else:
                volumes.append({"name": "traces", "emptyDir": {}})
            # One directory per pod, so replicas never write the same file.
            mounts.append({"name": "traces", "mountPath": TRACE_DIR, "subPathExpr": "$(POD_NAME)"})
    cs = _component_spec(spec, component)
    volumes += [dict(v) for v in cs.volumes]
    mounts += [dict(m) for m in cs.volume_mounts]
    return volumes, mounts


def _container(spec: AgentServingDeploymentSpec, target: Target, component: Component) -> dict[str, Any]:
    cs = _component_spec(spec, component)
    ports = [{"name": "http", "containerPort": PORTS[component], "protocol": "TCP"}]
    if component == "worker":
        ports.append({"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"})
    defaults = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "HOME", "value": CACHE_DIR},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "HF_HOME", "value": posixpath.join(CACHE_DIR, "huggingface")},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if component == "worker":
        # Compile caches on the cache volume (workers.cache); the rest (TensorRT-LLM, FlashInfer JIT,
        # Hugging Face) already lands under HOME / XDG_CACHE_HOME there.
        defaults += [
            {"name": "TORCHINDUCTOR_CACHE_DIR", "value": posixpath.join(CACHE_DIR, "torchinductor")},
            {"name": "TRITON_CACHE_DIR", "value": posixpath.join(CACHE_DIR, "triton")},
        ]
    if spec.model.source is not None:
        defaults.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    _, mounts = _volumes(spec, target, component)
    container: dict[str, Any] = {
        "name": component,
        "image": cs.image or default_image(component, spec),
        "command": ["agentserve", component],
        "args": ["--config", posixpath.join(CONFIG_DIR, f"{component}.yaml")],
        "ports": ports,
        "env": _env(list(cs.env), defaults),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        **_probes(component, spec),
    }
    if cs.image_pull_policy:
        container["imagePullPolicy"] = cs.image_pull_policy
    resources = _resources(spec, component)
    if resources:
        container["resources"] = resources
    return container


def _deployment(
    spec: AgentServingDeploymentSpec, target: Target, component: Component, files: dict[str, str]
) -> dict[str, Any]:
    cs = _component_spec(spec, component)
    volumes, _ = _volumes(spec, target, component)
    pod_labels = {**cs.pod_labels, **labels(target, component)}
    annotations = {**cs.pod_annotations, CONFIG_HASH_ANNOTATION: config_hash(files, component)}
    grace = cs.termination_grace_period_seconds
    pod: dict[str, Any] = {
        "serviceAccountName": target.child("router") if component == "router" else None,
        "automountServiceAccountToken": component == "router",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace if grace is not None else _default_grace(component),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, target, component)],
        "volumes": volumes,
        **_placement(spec, component),
    }
    if pod["serviceAccountName"] is None:
        del pod["serviceAccountName"]
    if cs.priority_class_name:
        pod["priorityClassName"] = cs.priority_class_name
    if cs.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s.name} for s in cs.image_pull_secrets]
    body: dict[str, Any] = {}
    if component == "worker" and spec.workers.update_strategy == "replace":
        # No spare GPUs for a new worker: stop an old one first (capacity dips one worker per step).
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    else:
        # The old pods keep serving until the new one is ready (at 1 replica the model never goes down).
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    if component == "worker":
        # A model load can take hours: only a rollout slower than the startup timeout is stuck.
        body["progressDeadlineSeconds"] = spec.workers.startup_timeout_seconds + 600
    if component == "frontend" and spec.frontend.autoscaling is not None:
        replicas: dict[str, Any] = {}  # the HorizontalPodAutoscaler owns them
    else:
        replicas = {"replicas": cs.replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(target, target.child(component), component),
        "spec": {
            **replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector_labels(target, component)},
            "strategy": strategy,
            **body,
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod},
        },
    }


def _service(spec: AgentServingDeploymentSpec, target: Target, component: Component) -> dict[str, Any]:
    meta = object_meta(target, target.child(component), component)
    body: dict[str, Any] = {"selector": selector_labels(target, component)}
    if component == "frontend":
        service = spec.frontend.service
        if service.annotations:
            meta["annotations"] = dict(service.annotations)
        body["type"] = service.type
        body["ports"] = [{"name": "http", "port": service.port, "targetPort": "http", "protocol": "TCP"}]
    elif component == "router":
        body["type"] = "ClusterIP"
        # Route-API tickets belong to the replica that issued them: every connection of a frontend
        # pod must reach the same router replica for its /finish to land where its /route did.
        body["sessionAffinity"] = "ClientIP"
        body["ports"] = [{"name": "http", "port": PORTS["router"], "targetPort": "http", "protocol": "TCP"}]
    else:
        # Headless: the router discovers worker pods from this Service's EndpointSlices (with workers
        # spanning nodes, the groups' leaders: one endpoint per worker).
        if spans_nodes(spec):
            body["selector"] = {**body["selector"], LWS_WORKER_INDEX: "0"}
        body["clusterIP"] = "None"
        body["publishNotReadyAddresses"] = False
        body["ports"] = [
            {"name": "http", "port": PORTS["worker"], "targetPort": "http", "protocol": "TCP"},
            {"name": "kv-events", "port": KV_EVENTS_PORT, "targetPort": "kv-events", "protocol": "TCP"},
        ]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}


def _pdb(spec: AgentServingDeploymentSpec, target: Target, component: Component) -> dict[str, Any]:
    # A group of a worker spanning nodes is one worker: a voluntary disruption may take a whole
    # group (its pods restart together anyway), not one pod of each of several.
    unavailable = spec.resolved_nodes_per_worker() if component == "worker" else 1
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(target, target.child(component), component),
        "spec": {
            "maxUnavailable": unavailable,
            "selector": {"matchLabels": selector_labels(target, component)},
        },
    }


def _relabelled(obj: Any, target: Target) -> Any:
    """A decode-pool object as the prefill pool's: its name, component label and config file."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if key == L_COMPONENT and value == "worker":
                out[key] = PREFILL
            elif key == "name" and value == target.child("worker"):
                out[key] = target.prefill_workers
            else:
                out[key] = _relabelled(value, target)
        return out
    if isinstance(obj, list):
        return [_relabelled(v, target) for v in obj]
    if obj == posixpath.join(CONFIG_DIR, "worker.yaml"):
        return posixpath.join(CONFIG_DIR, PREFILL_CONFIG_KEY)
    return obj


def _prefill_objects(
    spec: AgentServingDeploymentSpec, target: Target, files: dict[str, str]
) -> list[dict[str, Any]]:
    """The prefill pool (`spec.workers.prefill`): the decode pool's Service, Deployment and PDB built
    from the pool's view of the spec, renamed and relabelled (component `prefill-worker`), reading
    its own config file. Scaled by `workers.prefill.replicas` (the CR's scale subresource is the
    decode pool's)."""
    view = spec.prefill_view()
    if view is None:
        return []
    deployment = _relabelled(_deployment(view, target, "worker", files), target)
    if spec.workers.prefill is not None and spec.workers.prefill.replicas is None:
        del deployment["spec"]["replicas"]  # the pool's own scaler owns them (the Deployment's /scale)
    digest = hashlib.sha256()
    for key in (PREFILL_CONFIG_KEY, PREFILL_LLM_API_OPTIONS_KEY):
        if key in files:
            digest.update(key.encode() + b"\0" + files[key].encode() + b"\0")
    deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = digest.hexdigest()[
        :16
    ]
    return [
        _relabelled(_service(view, target, "worker"), target),
        deployment,
        _relabelled(_pdb(view, target, "worker"), target),
    ]


def _kv_transfer_policy(spec: AgentServingDeploymentSpec, target: Target) -> dict[str, Any]:
    """Decode and prefill workers reach each other on any port: the KV moves over the sim's
    /kv/pull or TensorRT-LLM's cache transceiver (UCX/NIXL pick their ports)."""
    pools = {
        "matchLabels": {L_NAME: "agentserve", L_INSTANCE: target.name},
        "matchExpressions": [{"key": L_COMPONENT, "operator": "In", "values": ["worker", PREFILL]}],
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(target, f"{target.name}-kv-transfer"),
        "spec": {
            "podSelector": pools,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": pools}]}],
        },
    }


def spans_nodes(spec: AgentServingDeploymentSpec) -> bool:
    return spec.resolved_nodes_per_worker() > 1


def _worker_workload(
    spec: AgentServingDeploymentSpec, target: Target, files: dict[str, str]
) -> dict[str, Any]:
    """The worker Deployment, or for workers spanning nodes a LeaderWorkerSet: one group per worker,
    a leader pod (the worker the router sees, readiness on it alone) and followers running the
    other ranks, one pod per node, scheduled, restarted and rolled as a group."""
    deployment = _deployment(spec, target, "worker", files)
    if not spans_nodes(spec):
        return deployment
    from agentserve.operator.multinode import follower_pod, leader_pod

    nodes = spec.resolved_nodes_per_worker()
    template = deployment["spec"]["template"]
    meta = object_meta(target, target.worker_group, "worker")
    if spec.node_pool.topology_key:
        # One group per domain (rack / NVLink domain): the LWS pod webhook adds the affinities.
        meta["annotations"] = {LWS_EXCLUSIVE_TOPOLOGY: spec.node_pool.topology_key}
    surge = 1 if spec.workers.update_strategy == "surge" else 0
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": meta,
        "spec": {
            "replicas": spec.workers.replicas,
            # LeaderCreated, not LeaderReady: the leader is ready only once the ranks on its followers
            # have loaded the model, so followers waiting for a ready leader would never start.
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": surge},
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_pod(target, template),
                "workerTemplate": follower_pod(target, template),
            },
        },
    }


def _state_objects(spec: AgentServingDeploymentSpec, target: Target) -> list[dict[str, Any]]:
    """The managed Valkey: a ClusterIP Service and a one-replica StatefulSet (official image),
    with a PVC when `storage` is set (append-only file), else memory only."""
    managed = spec.state.managed
    if managed is None:
        return []
    name = target.state_service
    selector = {L_NAME: "agentserve", L_INSTANCE: target.name, L_COMPONENT: "state"}
    meta = object_meta(target, name)
    meta["labels"] = {**meta["labels"], L_COMPONENT: "state"}
    persistent = managed.storage is not None
    args = ["--port", str(VALKEY_PORT), "--save", ""]
    args += ["--appendonly", "yes", "--dir", "/data"] if persistent else ["--appendonly", "no"]
    # TTLs bound what is kept; past maxmemory the least recently used entries with a TTL go first.
    args += ["--maxmemory-policy", "volatile-lru"]
    container: dict[str, Any] = {
        "name": "valkey",
        "image": managed.image,
        "args": args,
        "ports": [{"name": "valkey", "containerPort": VALKEY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "valkey"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "valkey"}, "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    if managed.resources is not None:
        container["resources"] = managed.resources.model_dump(exclude_defaults=True)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 999,
            "runAsGroup": 999,
            "fsGroup": 999,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    sts: dict[str, Any] = {
        "serviceName": name,
        "replicas": 1,
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod},
    }
    if persistent:
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": str(managed.storage)}},
        }
        if managed.storage_class_name:
            claim["storageClassName"] = managed.storage_class_name
        sts["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": claim}]
    else:
        pod["volumes"] = [{"name": "data", "emptyDir": {}}]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "valkey", "port": VALKEY_PORT, "targetPort": "valkey", "protocol": "TCP"}],
        },
    }
    return [service, {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": dict(meta), "spec": sts}]


def _rbac(target: Target, part: Part, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceAccount NAME-part, its Role with `rules` and the binding."""
    name = target.child(part)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": object_meta(target, name, part),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(target, name, part),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(target, name, part),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": target.namespace}],
        },
    ]


def _router_rbac(target: Target) -> list[dict[str, Any]]:
    rules = [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    return _rbac(target, "router", rules)


def _planner_objects(
    spec: AgentServingDeploymentSpec, target: Target, files: dict[str, str]
) -> list[dict[str, Any]]:
    """The planner (spec.autoscaling): its least-privilege Role (agentserve.planner.access), one pod
    (one writer of the worker count: Recreate, never two at once) and a Service for its /metrics."""
    scaling = spec.autoscaling
    assert scaling is not None
    name = target.child(PLANNER)
    volumes: list[dict[str, Any]] = [
        {
            "name": "config",
            "configMap": {
                "name": target.config_map,
                "items": [{"key": "planner.yaml", "path": "planner.yaml"}],
            },
        },
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if scaling.profile_config_map is not None:
        ref = scaling.profile_config_map
        volumes.append(
            {
                "name": "profile",
                "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": PROFILE_FILE}]},
            }
        )
        mounts.append({"name": "profile", "mountPath": PROFILE_DIR, "readOnly": True})
    container: dict[str, Any] = {
        "name": PLANNER,
        "image": scaling.image or default_image(PLANNER, spec),
        "command": ["agentserve", PLANNER],
        "args": ["--config", posixpath.join(CONFIG_DIR, "planner.yaml")],
        "ports": [{"name": "http", "containerPort": PORTS["planner"], "protocol": "TCP"}],
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "startupProbe": _http_probe("/health", "http", 2, 2, 150),
        "livenessProbe": _http_probe("/health", "http", 10, 5, 3),
        "readinessProbe": _http_probe("/ready", "http", 5, 3, 2),
    }
    if scaling.image_pull_policy:
        container["imagePullPolicy"] = scaling.image_pull_policy
    if scaling.resources is not None and (scaling.resources.limits or scaling.resources.requests):
        container["resources"] = {
            k: dict(v)
            for k, v in (("limits", scaling.resources.limits), ("requests", scaling.resources.requests))
            if v
        }
    pod: dict[str, Any] = {
        "serviceAccountName": name,
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if scaling.node_selector:
        pod["nodeSelector"] = dict(scaling.node_selector)
    if scaling.tolerations:
        pod["tolerations"] = [dict(t) for t in scaling.tolerations]
    annotations = {CONFIG_HASH_ANNOTATION: config_hash(files, PLANNER)}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(target, name, PLANNER),
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector_labels(target, PLANNER)},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": labels(target, PLANNER), "annotations": annotations},
                "spec": pod,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(target, name, PLANNER),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(target, PLANNER),
            "ports": [{"name": "http", "port": PORTS["planner"], "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [*_rbac(target, PLANNER, role_rules(target.name)), deployment, service]


def _frontend_autoscaler(spec: AgentServingDeploymentSpec, target: Target) -> dict[str, Any]:
    """A HorizontalPodAutoscaler on the frontend Deployment's CPU (spec.frontend.autoscaling)."""
    scaling = spec.frontend.autoscaling
    assert scaling is not None
    name = target.child("frontend")
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(target, name, "frontend"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {
                            "type": "Utilization",
                            "averageUtilization": scaling.target_cpu_utilization_percent,
                        },
                    },
                }
            ],
        },
    }


def _network_policy(spec: AgentServingDeploymentSpec, target: Target) -> dict[str, Any]:
    peers: list[dict[str, Any]] = [
        {"podSelector": {"matchLabels": {L_NAME: "agentserve", L_INSTANCE: target.name}}}
    ]
    peers += [dict(p) for p in spec.network_policy.extra_ingress_from]
    internal = ["router", "worker", *([PREFILL] if spec.workers.prefill is not None else [])]
    ports: list[dict[str, Any]] = [
        {"protocol": "TCP", "port": PORTS["router"]},
        {"protocol": "TCP", "port": PORTS["worker"]},
        {"protocol": "TCP", "port": KV_EVENTS_PORT},
    ]
    if spec.state.managed is not None:  # the Valkey holds every key's state: only our pods reach it
        internal.append("state")
        ports.append({"protocol": "TCP", "port": VALKEY_PORT})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(target, f"{target.name}-internal"),
        "spec": {
            "podSelector": {
                "matchLabels": {L_NAME: "agentserve", L_INSTANCE: target.name},
                "matchExpressions": [{"key": L_COMPONENT, "operator": "In", "values": internal}],
            },
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": peers,
                    "ports": ports,
                }
            ],
        },
    }


# Labels every scraped series of a deployment gets (prometheus-operator relabelings): the dashboard's
# `deployment` variable and the alerts group by them (agentserve.ops reads this table).
SCRAPE_TARGET_LABELS: dict[str, str] = {"deployment": L_INSTANCE, "component": L_COMPONENT}


def _meta_label(label: str) -> str:
    """The service-discovery meta label of a Service label (`app.kubernetes.io/instance` →
    `__meta_kubernetes_service_label_app_kubernetes_io_instance`)."""
    return "__meta_kubernetes_service_label_" + "".join(c if c.isalnum() else "_" for c in label)


def _service_monitor(spec: AgentServingDeploymentSpec, target: Target) -> dict[str, Any]:
    sm = spec.observability.service_monitor
    meta = object_meta(target, target.name)
    meta["labels"] = {**sm.labels, **meta["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {L_NAME: "agentserve", L_INSTANCE: target.name}},
            "namespaceSelector": {"matchNames": [target.namespace]},
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": sm.interval,
                    "relabelings": [
                        {"sourceLabels": [_meta_label(label)], "targetLabel": name, "action": "replace"}
                        for name, label in SCRAPE_TARGET_LABELS.items()
                    ],
                }
            ],
        },
    }


def build(
    spec: AgentServingDeploymentSpec, name: str, namespace: str, uid: str | None = None
) -> list[dict[str, Any]]:
    """Every object the deployment needs, in apply order (dependencies first)."""
    target = Target(name, namespace, uid)
    files = config_files(spec, target)
    objects: list[dict[str, Any]] = [*_router_rbac(target)]
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": object_meta(target, target.config_map),
            "data": files,
        }
    )
    objects += _state_objects(spec, target)
    objects += [_service(spec, target, c) for c in COMPONENTS]
    objects += [_deployment(spec, target, c, files) for c in COMPONENTS if c != "worker"]
    objects.append(_worker_workload(spec, target, files))
    objects += [_pdb(spec, target, c) for c in COMPONENTS]
    objects += _prefill_objects(spec, target, files)
    if spec.autoscaling is not None:
        objects += _planner_objects(spec, target, files)
    if spec.frontend.autoscaling is not None:
        objects.append(_frontend_autoscaler(spec, target))
    if spec.network_policy.enabled:
        objects.append(_network_policy(spec, target))
        if spec.workers.prefill is not None:
            objects.append(_kv_transfer_policy(spec, target))
    if spec.observability.service_monitor.enabled:
        objects.append(_service_monitor(spec, target))
    return objects


# The kinds `build` can produce: the operator lists and prunes exactly these.
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    (LWS_API_VERSION, LWS_KIND),
)
# Kinds a deployment cannot run without when it needs them: if one is not installed, nothing is
# applied (a half-applied deployment would serve nothing and hold resources).
REQUIRED_KINDS: frozenset[tuple[str, str]] = frozenset({(LWS_API_VERSION, LWS_KIND)})
