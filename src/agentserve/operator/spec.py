"""The `AgentServingDeployment` spec: one pydantic model, the single source of the CRD.

Field names are snake_case in Python and camelCase in YAML (an alias generator), so
`spec.workers.tensorParallelSize` is `spec.workers.tensor_parallel_size` here. `agentserve.operator.crd`
turns these models into the CRD's structural OpenAPI schema; `agentserve.operator.build` turns a
validated spec into Kubernetes objects.

Cross-field rules are written once, as `Rule`s: each carries the CEL expression the kube-apiserver
evaluates (`x-kubernetes-validations`) and the same rule in Python, which pydantic runs when the
operator or `agentserve manifests` validates a spec. Tests evaluate the CEL text on sample objects and
check that both agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

from agentserve.config import ALL_APIS, ApiName, ReplayPolicy, RetentionSettings
from agentserve.families import family_names
from agentserve.operator.llm_args import TRTLLM_RELEASE, unknown_llm_api_options
from agentserve.worker.profiles import DEFAULT_PROFILE, shipped_profiles

GROUP = "agentserve.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AgentServingDeployment"
PLURAL = "agentservingdeployments"
SINGULAR = "agentservingdeployment"
SHORT_NAMES = ("asd",)

B200_PRODUCT = "NVIDIA-B200"
GPU_RESOURCE = "nvidia.com/gpu"


def _named(names: Sequence[str], what: str) -> AfterValidator:
    """A validator refusing a string not in `names` (the CRD has them as an enum too, so the API
    server refuses it first; this is the same check for specs read elsewhere)."""

    def check(name: str) -> str:
        if name not in names:
            raise ValueError(f"unknown {what} {name!r}; known: {', '.join(names)}")
        return name

    return AfterValidator(check)


# A family name or alias from the registry (agentserve.families): an enum in the CRD, so the API
# server refuses an unknown family before the frontend would exit on it at start.
_FAMILY_NAMES = family_names()
FamilyName = Annotated[
    str,
    _named(_FAMILY_NAMES, "model family"),
    WithJsonSchema({"type": "string", "enum": list(_FAMILY_NAMES)}),
]
# The engine profiles that ship in the image (agentserve.worker.profiles).
_PROFILE_NAMES = shipped_profiles()
ProfileName = Annotated[
    str,
    _named(_PROFILE_NAMES, "engine profile"),
    WithJsonSchema({"type": "string", "enum": list(_PROFILE_NAMES)}),
]


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: CEL for the apiserver, Python for pydantic. Both must say the same."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    # Python's error may say more than CEL's fixed message (e.g. which key); None: the message.
    detail: Callable[[Any], str] | None = None


def _add_rules(schema: dict[str, Any], cls: type) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [{"rule": r.cel, "message": r.message} for r in rules]


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=_add_rules,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> _Spec:
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(rule.detail(self) if rule.detail is not None else rule.message)
        return self


# Kubernetes shapes the operator passes through untouched: the apiserver validates them where they land
# (in the Deployment), so the CRD keeps them as free-form objects.
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "pattern": r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[mun])?$"}
    ),
]
# TensorRT-LLM LLM() options: a map, so CEL can check its keys (values stay free-form; bounded for
# CEL's cost estimate).
LLM_API_OPTIONS_MAX_KEYS = 128
LlmApiOptions = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": LLM_API_OPTIONS_MAX_KEYS,
            "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True},
        }
    ),
]
DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_NAME)]


def _one_of(*names: str) -> str:
    return " + ".join(f"(has(self.{n}) ? 1 : 0)" for n in names) + " == 1"


def _count_set(obj: BaseModel, *attrs: str) -> int:
    return sum(getattr(obj, a) is not None for a in attrs)


# ---------------------------------------------------------------------------------------------- model


class PvcSource(_Spec):
    """Weights on a PersistentVolumeClaim (ReadOnlyMany or ReadWriteMany when several pods mount it)."""

    claim_name: ObjectName = Field(description="name of the PersistentVolumeClaim in the same namespace")
    path: str = Field("", max_length=1024, description="model directory inside the claim ('' = its root)")


class HostPathSource(_Spec):
    """Weights in a node-local cache directory (fast cold starts; the directory must exist on the node)."""

    path: str = Field(pattern=r"^/", max_length=1024, description="absolute model directory on the node")


class ImageSource(_Spec):
    """Weights baked into the worker image."""

    path: str = Field(pattern=r"^/", max_length=1024, description="absolute model directory in the image")


class ModelSource(_Spec):
    """Where the model directory (weights, tokenizer.json, chat template) comes from; exactly one."""

    pvc: PvcSource | None = None
    host_path: HostPathSource | None = None
    image: ImageSource | None = None

    rules = (
        Rule(
            _one_of("pvc", "hostPath", "image"),
            "exactly one of pvc, hostPath and image must be set",
            lambda s: _count_set(s, "pvc", "host_path", "image") == 1,
        ),
    )


class ConfigMapKeyRef(_Spec):
    name: ObjectName = Field(description="ConfigMap name")
    key: str = Field(min_length=1, max_length=253, description="key holding the value")


class ChatTemplate(_Spec):
    """A chat template (HF jinja) that overrides the model's own; exactly one of inline and configMap."""

    inline: str | None = Field(None, max_length=262144, description="the template text")
    config_map: ConfigMapKeyRef | None = Field(None, description="a ConfigMap key holding the template")

    rules = (
        Rule(
            _one_of("inline", "configMap"),
            "exactly one of inline and configMap must be set",
            lambda s: _count_set(s, "inline", "config_map") == 1,
        ),
    )


class ModelSpec(_Spec):
    """The model served."""

    name: str = Field(
        min_length=1, max_length=253, description="model name served to clients (the `model` they send)"
    )
    family: FamilyName | None = Field(
        None,
        description="model family: output parsers, fallback template, catalog (default: inferred from name)",
    )
    source: ModelSource | None = Field(None, description="where the model directory comes from")
    tokenizer: str | None = Field(
        None,
        max_length=1024,
        description="tokenizer directory or tokenizer.json: absolute, or relative to the model directory "
        "(default: the model directory)",
    )
    chat_template: ChatTemplate | None = Field(None, description="chat template overriding the model's")
    context_length: int | None = Field(None, ge=1, description="context window in tokens (default: model's)")


# ---------------------------------------------------------------------------------------------- agent


class ReplaySpec(_Spec):
    """How past reasoning goes back into the prompt."""

    policy: ReplayPolicy = Field(
        ReplayPolicy.AUTO,
        description="auto: native if the chat template reads reasoning_content, else inject; "
        "native | inject (each segment before its own tool call) | drop",
    )
    truncate_history_thinking: bool = Field(False, description="let templates drop reasoning of older turns")


class StripPattern(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=63, description="pattern name (in traces)")
    regex: str = Field(min_length=1, max_length=1024, description="regular expression of the volatile span")


class PreambleStripping(_Spec):
    """Volatile spans stripped before rendering, hashing and routing (they would poison the KV cache)."""

    enabled: bool = Field(True, description="strip Claude Code's billing header block")
    patterns: list[StripPattern] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="extra named patterns to strip",
    )


class StreamingToolDispatch(_Spec):
    enabled: bool = Field(True, description="dispatch each tool call as soon as its arguments are complete")


class ConstrainedDecodingSpec(_Spec):
    enabled: bool = Field(
        True,
        description="enforce tool_choice, parallel_tool_calls, strict tools, JSON output formats and "
        "thinking budgets with a grammar (false: requests that need one are refused with 400)",
    )
    backend: Literal["llguidance", "xgrammar"] = Field(
        "llguidance",
        description="TensorRT-LLM workers' guided_decoding_backend (xgrammar enforces JSON answers only; "
        "the sim always uses llguidance)",
    )
    cache_size: int = Field(
        256, ge=1, le=65536, description="compiled grammars kept per frontend and per sim worker"
    )


class AgentSpec(_Spec):
    """Agent-facing behaviour of the frontend."""

    reasoning_parser: FamilyName | None = Field(
        None, description="reasoning parser: a family name or alias (default: the model family's)"
    )
    tool_call_parser: FamilyName | None = Field(
        None, description="tool-call parser: a family name or alias (default: the model family's)"
    )
    replay: ReplaySpec = Field(ReplaySpec.model_validate({}), description="reasoning replay policy")
    reasoning_default: Literal["template", "on", "off"] = Field(
        "template",
        description="thinking for requests that name no reasoning effort or thinking switch: template "
        "(the chat template's default), on, off. A requested effort (low..xhigh, Anthropic thinking "
        "enabled/adaptive) always turns it on, none/minimal/disabled off",
    )
    exact_replay: bool = Field(
        True,
        description="put each session's previous turn back into its next prompt as the model produced it "
        "(its own tokens and whitespace) when the client's echo means the same turn",
    )
    preamble_stripping: PreambleStripping = Field(
        PreambleStripping.model_validate({}), description="volatile-span stripping"
    )
    streaming_tool_dispatch: StreamingToolDispatch = Field(
        StreamingToolDispatch.model_validate({}), description="streaming tool dispatch"
    )
    constrained_decoding: ConstrainedDecodingSpec = Field(
        ConstrainedDecodingSpec.model_validate({}), description="constrained decoding (grammars)"
    )
    apis: list[ApiName] = Field(
        default_factory=lambda: list(ALL_APIS),
        min_length=1,
        max_length=3,
        json_schema_extra={"x-kubernetes-list-type": "set", "default": list(ALL_APIS)},
        description="APIs served: anthropic (/v1/messages), chat (/v1/chat/completions), responses",
    )
    codex_catalog: bool = Field(True, description="serve the Codex model catalog (needs the responses API)")

    rules = (
        Rule(
            "(has(self.codexCatalog) && !self.codexCatalog) || !has(self.apis) || 'responses' in self.apis",
            "codexCatalog needs the responses API: add 'responses' to apis or set codexCatalog: false",
            lambda s: not s.codex_catalog or "responses" in s.apis,
        ),
    )


# ---------------------------------------------------------------------------------------------- pods


class ResourceRequirements(_Spec):
    """Container resources (GPUs are set by the operator from workers.gpusPerWorker)."""

    limits: dict[str, Quantity] = Field(default_factory=dict, description="resource limits")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="resource requests")


class LocalObjectReference(_Spec):
    name: ObjectName = Field(description="name of a Secret in the same namespace")


class ComponentSpec(_Spec):
    """What every component's pods take: scale, image, resources, env and pod-level extras."""

    replicas: int = Field(1, ge=0, le=1000, description="number of pods")
    image: str | None = Field(None, max_length=512, description="container image (default: agentserve's)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="pull policy"
    )
    resources: ResourceRequirements | None = Field(None, description="container resources")
    env: list[FreeForm] = Field(default_factory=list, description="extra environment variables (EnvVar)")
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="extra pod annotations")
    pod_labels: dict[str, str] = Field(default_factory=dict, description="extra pod labels")
    node_selector: dict[str, str] = Field(default_factory=dict, description="extra node selector")
    tolerations: list[FreeForm] = Field(default_factory=list, description="extra tolerations")
    affinity: FreeForm | None = Field(
        None, description="pod affinity (replaces nodePool.affinity on workers)"
    )
    topology_spread_constraints: list[FreeForm] = Field(
        default_factory=list, description="spread constraints"
    )
    priority_class_name: str | None = Field(None, max_length=253, description="PriorityClass of the pods")
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list, description="pull secrets")
    volumes: list[FreeForm] = Field(default_factory=list, description="extra pod volumes")
    volume_mounts: list[FreeForm] = Field(default_factory=list, description="extra container volume mounts")
    termination_grace_period_seconds: int | None = Field(
        None, ge=0, description="seconds to drain streams on shutdown (default: 60 workers, 30 others)"
    )


class ServiceSpec(_Spec):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type")
    port: int = Field(8000, ge=1, le=65535, description="Service port")
    annotations: dict[str, str] = Field(default_factory=dict, description="Service annotations")


class FrontendAutoscalingSpec(_Spec):
    """A HorizontalPodAutoscaler on the frontend Deployment's CPU (it then owns frontend replicas)."""

    min_replicas: int = Field(1, ge=1, le=1000, description="fewest frontend pods")
    max_replicas: int = Field(ge=1, le=1000, description="most frontend pods")
    target_cpu_utilization_percent: int = Field(
        70, ge=1, le=100, description="average CPU use, as a share of the pods' CPU request, to hold"
    )

    rules = (
        Rule(
            "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
            "minReplicas must not exceed maxReplicas",
            lambda s: s.min_replicas <= s.max_replicas,
        ),
    )


class FrontendSpec(ComponentSpec):
    """The HTTP frontend (Anthropic Messages, Chat Completions, Responses)."""

    service: ServiceSpec = Field(ServiceSpec.model_validate({}), description="the frontend Service")
    max_request_body_bytes: int | None = Field(None, ge=1024, description="largest request body accepted")
    processes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="frontend processes per pod (one core each); unset: the pod's CPU limit, else its "
        "request, rounded down (at least 1), when the state is shared (state.managed or state.urlSecret), "
        "else 1",
    )
    autoscaling: FrontendAutoscalingSpec | None = Field(
        None,
        description="scale frontend pods on CPU with a HorizontalPodAutoscaler (replaces replicas; needs "
        "resources.requests.cpu)",
    )

    rules = (
        Rule(
            "!has(self.autoscaling) || (has(self.resources) && has(self.resources.requests) && "
            "'cpu' in self.resources.requests)",
            "frontend.autoscaling needs frontend.resources.requests.cpu (CPU utilization is relative to it)",
            lambda s: s.autoscaling is None or (s.resources is not None and "cpu" in s.resources.requests),
        ),
    )


class RouterWeights(_Spec):
    overlap: float = Field(1.0, ge=0, description="weight of prefill blocks not cached on a worker")
    load: float = Field(0.1, ge=0, description="weight of a worker's active decode blocks")


class RouterSpec(ComponentSpec):
    """The KV-aware router."""

    policy: Literal["kv", "round-robin", "random", "least-loaded"] = Field("kv", description="placement")
    weights: RouterWeights = Field(
        RouterWeights.model_validate({}), description="cost weights of the kv policy"
    )
    temperature: float = Field(0.0, ge=0, description="softmax temperature over costs (0: argmin)")
    affinity_ttl_seconds: float = Field(300.0, ge=0, description="session affinity lifetime")
    max_inflight_per_worker: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="requests routed to one worker before new ones wait in the router's priority queue "
        "(default: the engine's max_batch_size, so no request waits unseen in the engine's own queue)",
    )


class KvRetentionSpec(_Spec, RetentionSettings):
    """How long KV blocks outlive their request (docs/worker.md, "KV retention"): the frontend's
    retention settings (`config.RetentionSettings`), field for field, in the CRD's camelCase."""


class KvCacheSpec(_Spec):
    retention: KvRetentionSpec = Field(KvRetentionSpec.model_validate({}), description="KV retention policy")
    host_cache_bytes: int = Field(
        0, ge=0, description="host (CPU) KV tier per worker in bytes (TensorRT-LLM host_cache_size; 0: none)"
    )
    enable_block_reuse: bool = Field(True, description="reuse KV blocks across requests (prefix cache)")
    tokens_per_block: Literal[4, 8, 16, 32, 64, 128] = Field(
        32, description="tokens per KV block; the router and frontend hash with the same size"
    )
    free_gpu_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="share of free GPU memory (after weights) given to the KV cache"
    )


class WorkerCacheSpec(_Spec):
    """Where workers keep what they compile and download (torch.compile/Triton/TensorRT-LLM JIT kernels,
    Hugging Face files): on a claim they outlive a restart, so a restarted worker does not recompile
    for minutes before it is ready again."""

    claim_name: ObjectName | None = Field(
        None,
        description="PersistentVolumeClaim (ReadWriteMany when several workers share it) for the caches; "
        "default: an emptyDir, lost with the pod",
    )
    size_limit: Quantity | None = Field(None, description="sizeLimit of the emptyDir (without claimName)")


class SimSpec(_Spec):
    """The simulated engine (workers.engine: sim)."""

    profile: ProfileName = Field(
        DEFAULT_PROFILE,
        description="engine profile whose timing the sim follows (docs/worker.md, Engine profiles): "
        "h200-qwen3-30b-a3b-pytorch is measured, b200-qwen3-30b-a3b-estimate a datasheet estimate",
    )


class PrefillWorkersSpec(_Spec):
    """The prefill pool (disaggregated prefill, docs/router.md): workers with role prefill beside
    `workers`, which become the decode pool. The router prefills a request here only when its
    uncached prompt exceeds the threshold and that costs less than prefilling on its decode worker;
    the KV then moves to the decode worker. What is not set here is the decode pool's (image,
    engine, model, KV cache, node pool)."""

    replicas: int | None = Field(
        1,
        ge=0,
        le=1000,
        description="prefill worker pods (workers.replicas: decode pods); null: the operator leaves them to "
        "whoever scales the NAME-prefill-worker Deployment (kubectl scale, an HPA, a KEDA ScaledObject)",
    )
    resources: ResourceRequirements | None = Field(
        None, description="container resources (default: workers.resources)"
    )
    gpus_per_worker: int | None = Field(
        None, ge=0, le=8, description="GPUs per prefill pod (default: tensor × pipeline parallel size)"
    )
    tensor_parallel_size: int | None = Field(
        None, ge=1, le=16, description="tensor parallel size (default: workers.tensorParallelSize)"
    )
    pipeline_parallel_size: int | None = Field(
        None, ge=1, le=16, description="pipeline parallel size (default: workers.pipelineParallelSize)"
    )
    llm_api_options: LlmApiOptions | None = Field(
        None,
        description="TensorRT-LLM LLM API options of the prefill pool, merged over workers.llmApiOptions",
    )
    threshold_tokens: int | None = Field(
        None,
        ge=0,
        description="uncached prompt tokens above which the prefill pool prefills (default: derived from "
        "the engine profile's timing model)",
    )


class WorkersSpec(ComponentSpec):
    """The inference workers."""

    engine: Literal["trtllm", "sim"] = Field(
        "trtllm", description="trtllm: TensorRT-LLM on GPUs; sim: simulated engine, no GPU"
    )
    gpus_per_worker: int | None = Field(
        None,
        ge=0,
        le=8,
        description="GPUs per worker pod (default: tensorParallelSize × pipelineParallelSize on one node, "
        "nodePool.gpusPerNode when a worker spans nodes; sim: 0)",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="tensor parallel size")
    pipeline_parallel_size: int = Field(
        1, ge=1, le=16, description="pipeline parallel size (a replica's GPUs: tensor × pipeline)"
    )
    nodes_per_worker: int | None = Field(
        None,
        ge=1,
        le=16,
        description="nodes one model replica spans (default: tensor × pipeline ÷ nodePool.gpusPerNode, "
        "rounded up); above 1 the replica is a LeaderWorkerSet group of that many pods, one per node",
    )
    kv_cache: KvCacheSpec = Field(KvCacheSpec.model_validate({}), description="KV cache")
    llm_api_options: LlmApiOptions | None = Field(
        None,
        description="extra TensorRT-LLM LLM API options (TorchLlmArgs fields, snake_case); keys are checked "
        f"against TensorRT-LLM {TRTLLM_RELEASE}'s fields unless llmApiOptionsCheck is off",
    )
    llm_api_options_check: Literal["pinned", "off"] = Field(
        "pinned",
        description=f"pinned: refuse llmApiOptions keys TensorRT-LLM {TRTLLM_RELEASE} (the worker image's "
        "release) does not have, when the spec is applied; off: for another worker image",
    )
    shm_size: Quantity = Field("16Gi", description="size of the /dev/shm memory volume")
    startup_timeout_seconds: int = Field(
        7200,
        ge=60,
        le=86400,
        description="time allowed until the model is loaded (/ready: weights, graphs, autotune); also "
        "the rollout's progress deadline",
    )
    cache: WorkerCacheSpec = Field(
        WorkerCacheSpec.model_validate({}), description="compile and download caches of the workers"
    )
    # No default object: the apiserver would default it into every CR and the rule below would
    # refuse every trtllm CR.
    sim: SimSpec | None = Field(None, description="the simulated engine (engine: sim only)")
    prefill: PrefillWorkersSpec | None = Field(
        None,
        description="a prefill pool beside these workers, which then decode: disaggregated prefill decided "
        "per request by the router (unset: every worker prefills and decodes)",
    )
    update_strategy: Literal["surge", "replace"] = Field(
        "surge",
        description="surge: a new worker loads beside the old ones, which keep serving (needs the GPUs of "
        "one more worker); replace: an old worker stops first (no spare GPUs; capacity dips per step)",
    )

    rules = (
        Rule(
            "!has(self.engine) || self.engine != 'sim' || "
            "((!has(self.tensorParallelSize) || self.tensorParallelSize == 1) && "
            "(!has(self.gpusPerWorker) || self.gpusPerWorker == 0))",
            "the sim engine uses no GPU: leave tensorParallelSize at 1 and gpusPerWorker unset or 0",
            lambda s: s.engine != "sim" or (s.tensor_parallel_size == 1 and not s.gpus_per_worker),
        ),
        Rule(
            "!has(self.engine) || self.engine != 'sim' || "
            "((!has(self.pipelineParallelSize) || self.pipelineParallelSize == 1) && "
            "(!has(self.nodesPerWorker) || self.nodesPerWorker == 1))",
            "the sim engine runs in one pod: leave pipelineParallelSize and nodesPerWorker at 1",
            lambda s: s.engine != "sim" or (s.pipeline_parallel_size == 1 and (s.nodes_per_worker or 1) == 1),
        ),
        Rule(
            "(has(self.engine) && self.engine == 'sim') || !has(self.sim)",
            "workers.sim configures the simulated engine: set engine: sim, or remove sim",
            lambda s: s.engine == "sim" or s.sim is None,
        ),
        Rule(
            "(has(self.engine) && self.engine == 'sim') || !has(self.gpusPerWorker) || "
            "(has(self.nodesPerWorker) && self.nodesPerWorker > 1) || "
            "self.gpusPerWorker >= (has(self.tensorParallelSize) ? self.tensorParallelSize : 1) * "
            "(has(self.pipelineParallelSize) ? self.pipelineParallelSize : 1)",
            "gpusPerWorker must be at least tensorParallelSize × pipelineParallelSize (or set nodesPerWorker "
            "to spread the replica over nodes)",
            lambda s: (
                s.engine == "sim"
                or s.gpus_per_worker is None
                or (s.nodes_per_worker or 1) > 1
                or s.gpus_per_worker >= s.tensor_parallel_size * s.pipeline_parallel_size
            ),
        ),
    )

    @model_validator(mode="after")
    def _prefill_pool_fits(self) -> WorkersSpec:
        # Not in CEL: llmApiOptions has no CEL type (see below); the operator refuses these with
        # Ready=False InvalidSpec before anything is applied.
        prefill = self.prefill
        if prefill is None:
            return self
        if self.engine == "sim" and (
            (prefill.tensor_parallel_size or 1) > 1
            or (prefill.pipeline_parallel_size or 1) > 1
            or prefill.gpus_per_worker
        ):
            raise ValueError("the sim engine uses no GPU: leave workers.prefill's parallelism and GPUs unset")
        options = prefill.llm_api_options or {}
        if options and self.llm_api_options_check == "pinned":
            unknown = unknown_llm_api_options(options)
            if unknown:
                raise ValueError("workers.prefill." + _unknown_option_message(unknown))
        return self

    @model_validator(mode="after")
    def _options_do_not_shadow_fields(self) -> WorkersSpec:
        # Not expressible in CEL: a map whose values have no schema type has no CEL type, so the
        # apiserver refuses any rule that names llmApiOptions ("undefined field"; apiserver
        # pkg/cel/common/schemas.go SchemaDeclType). The operator checks it: Ready=False InvalidSpec,
        # nothing applied, before any worker pod starts loading.
        options = self.llm_api_options or {}
        if self.llm_api_options_check == "pinned":
            unknown = unknown_llm_api_options(options)
            if unknown:
                raise ValueError(_unknown_option_message(unknown))
        for key, field in _SHADOWED_OPTIONS.items():
            if key in options:
                raise ValueError(f"llmApiOptions.{key} is set by workers.{field}; set it there instead")
        for key, field in _SHADOWED_KV_OPTIONS.items():
            if key in (options.get("kv_cache_config") or {}):
                raise ValueError(f"llmApiOptions.kv_cache_config.{key} is set by workers.kvCache.{field}")
        return self


def _unknown_option_message(unknown: list[str]) -> str:
    return (
        f"llmApiOptions.{', llmApiOptions.'.join(unknown)}: not an LLM() argument of TensorRT-LLM "
        f"{TRTLLM_RELEASE} (TorchLlmArgs / KvCacheConfig fields; llmApiOptionsCheck: off for another "
        "worker image)"
    )


_SHADOWED_OPTIONS = {
    "tensor_parallel_size": "tensorParallelSize",
    "pipeline_parallel_size": "pipelineParallelSize",
    "gpus_per_node": "nodePool.gpusPerNode",
}
_SHADOWED_KV_OPTIONS = {
    "enable_block_reuse": "enableBlockReuse",
    "tokens_per_block": "tokensPerBlock",
    "free_gpu_memory_fraction": "freeGpuMemoryFraction",
}


AUTOSCALING_CONDITION = "Autoscaling"  # the planner's condition on the CR (docs/planner.md)


class AutoscalingSpec(_Spec):
    """The planner: scales the workers between minWorkers and maxWorkers to hold the TTFT and ITL
    targets, never below what the KV retained for agent sessions needs (docs/planner.md). It writes
    workers.replicas through the scale subresource."""

    min_workers: int = Field(1, ge=1, le=1000, description="fewest workers")
    max_workers: int = Field(ge=1, le=1000, description="most workers")
    ttft_target_ms: float = Field(2000.0, gt=0, description="p90 time-to-first-token target (ms)")
    itl_target_ms: float = Field(100.0, gt=0, description="p90 inter-token latency target (ms)")
    interval_seconds: float = Field(15.0, ge=1, le=3600, description="seconds between decisions")
    scale_down_delay_seconds: float = Field(
        300.0,
        ge=0,
        le=86400,
        description="seconds every decision must ask for fewer workers before one is removed",
    )
    profile: ProfileName | None = Field(
        None,
        description="engine profile the planner predicts with (default: workers.sim.profile for the sim, "
        "else the default profile); see docs/worker.md, Engine profiles",
    )
    profile_config_map: ConfigMapKeyRef | None = Field(
        None,
        description="a ConfigMap key holding a profile YAML (agentserve profile / scripts/gpu-smoke "
        "profile write one) instead of a shipped profile",
    )
    image: str | None = Field(None, max_length=512, description="planner image (default: agentserve's)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="pull policy"
    )
    resources: ResourceRequirements | None = Field(None, description="the planner container's resources")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="node selector of the planner pod"
    )
    tolerations: list[FreeForm] = Field(default_factory=list, description="tolerations of the planner pod")

    rules = (
        Rule(
            "!has(self.minWorkers) || self.minWorkers <= self.maxWorkers",
            "minWorkers must not exceed maxWorkers",
            lambda s: s.min_workers <= s.max_workers,
        ),
        Rule(
            "!(has(self.profile) && has(self.profileConfigMap))",
            "set profile (a shipped profile) or profileConfigMap (your own), not both",
            lambda s: s.profile is None or s.profile_config_map is None,
        ),
    )


class NodePool(_Spec):
    """Where GPU worker pods run: B200 nodes by default. Frontend, router and sim workers stay off them."""

    node_selector: dict[str, str] = Field(
        {"nvidia.com/gpu.product": B200_PRODUCT},
        description="node selector of worker pods (set {} to drop the B200 default)",
    )
    tolerations: list[FreeForm] = Field(
        [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        description="tolerations of worker pods (set [] to drop the GPU taint toleration)",
    )
    affinity: FreeForm | None = Field(None, description="affinity of worker pods")
    gpu_resource: str = Field(
        GPU_RESOURCE, max_length=253, pattern=LABEL_KEY, description="extended resource name of a GPU"
    )
    gpus_per_node: int = Field(8, ge=1, le=16, description="GPUs of one node of the pool (HGX B200: 8)")
    topology_key: str | None = Field(
        None,
        max_length=253,
        pattern=LABEL_KEY,
        description="node label of the domain a multi-node worker's group must fill alone (its rack or "
        "NVLink domain; LeaderWorkerSet exclusive-topology); unset: groups are placed node by node",
    )


# ------------------------------------------------------------------------------ auth, observability


class SecretKeyRef(_Spec):
    name: ObjectName = Field(description="Secret name")
    key: str = Field("api-keys", min_length=1, max_length=253, description="key: one API key per line")


# A Secret data key, which also names the mounted file: no leading dot (kubelet's own entries do).
SECRET_DATA_KEY = r"^[-_A-Za-z0-9][-._A-Za-z0-9]*$"
MANAGED_SIGNING_KEY = "signing-key"


class SigningKeySecretRef(_Spec):
    name: ObjectName = Field(description="Secret name")
    key: str = Field(
        MANAGED_SIGNING_KEY,
        max_length=253,
        pattern=SECRET_DATA_KEY,
        description="key holding the signing key: hex, base64 or raw bytes, at least 16 bytes decoded",
    )


class AuthSpec(_Spec):
    """Client authentication at the frontend (none when unset) and the frontend's signing key."""

    api_keys_secret: SecretKeyRef | None = Field(None, description="Secret with the accepted API keys")
    signing_key_secret: SigningKeySecretRef | None = Field(
        None,
        description="Secret with the key every frontend replica signs thinking and seals reasoning with "
        "(default: NAME-signing-key, created once by the operator with a random key and never changed)",
    )


class StateUrlSecretRef(_Spec):
    name: ObjectName = Field(description="Secret name")
    key: str = Field(
        "url",
        pattern=SECRET_DATA_KEY,
        max_length=253,
        description="key holding redis://[:password@]host:port/db",
    )


class ManagedStateSpec(_Spec):
    """A Valkey StatefulSet (one replica) the operator runs for the frontends' shared state."""

    image: str = Field("valkey/valkey:8.1-alpine", max_length=512, description="the official valkey image")
    storage: Quantity | None = Field(
        None, description="PersistentVolumeClaim size (unset: no PVC; state lives in memory, lost on restart)"
    )
    storage_class_name: str | None = Field(None, max_length=253, description="StorageClass of the PVC")
    resources: ResourceRequirements | None = Field(None, description="container resources")


class StateSpec(_Spec):
    """Where frontend replicas share stored responses and remembered turns (docs/state.md).
    Neither set: each frontend keeps its own, which is only right with one frontend replica."""

    url_secret: StateUrlSecretRef | None = Field(
        None, description="an external Redis or Valkey: a Secret key holding its URL"
    )
    managed: ManagedStateSpec | None = Field(None, description="a Valkey StatefulSet the operator creates")
    response_ttl_seconds: int = Field(
        30 * 86400, ge=1, description="how long a stored response (store: true) is kept"
    )
    call_memory_ttl_seconds: int = Field(6 * 3600, ge=1, description="how long a remembered turn is kept")

    rules = (
        Rule(
            "!(has(self.urlSecret) && has(self.managed))",
            "state: set urlSecret (external) or managed, not both",
            lambda s: s.url_secret is None or s.managed is None,
        ),
    )

    @property
    def shared(self) -> bool:
        return self.url_secret is not None or self.managed is not None


class ServiceMonitorSpec(_Spec):
    enabled: bool = Field(False, description="create a prometheus-operator ServiceMonitor")
    interval: str = Field("30s", pattern=r"^[0-9]+(ms|s|m|h)$", description="scrape interval")
    labels: dict[str, str] = Field(
        default_factory=dict, description="extra labels (for the Prometheus serviceMonitorSelector)"
    )


class TraceSinkSpec(_Spec):
    enabled: bool = Field(False, description="write JSONL request traces on the frontend")
    claim_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_NAME,
        description="PersistentVolumeClaim for traces (default: emptyDir)",
    )


class ObservabilitySpec(_Spec):
    service_monitor: ServiceMonitorSpec = Field(
        ServiceMonitorSpec.model_validate({}), description="Prometheus scraping"
    )
    trace_sink: TraceSinkSpec = Field(TraceSinkSpec.model_validate({}), description="request traces")


class NetworkPolicySpec(_Spec):
    """Router and worker pods accept traffic only from this deployment's pods (and extraIngressFrom)."""

    enabled: bool = Field(True, description="create the NetworkPolicy")
    extra_ingress_from: list[FreeForm] = Field(
        default_factory=list, description="more NetworkPolicyPeers allowed in (e.g. Prometheus)"
    )


# ---------------------------------------------------------------------------------------------- spec


# A replica's GPUs and the nodes it spans, in CEL (defaults written out: CEL sees unset fields).
_GPUS_CEL = (
    "((has(self.workers) && has(self.workers.tensorParallelSize) ? self.workers.tensorParallelSize : 1) * "
    "(has(self.workers) && has(self.workers.pipelineParallelSize) ? self.workers.pipelineParallelSize : 1))"
)
_GPN_CEL = "(has(self.nodePool) && has(self.nodePool.gpusPerNode) ? self.nodePool.gpusPerNode : 8)"


def _nodes_fit(gpus: int, nodes: int, per_node: int) -> bool:
    """`nodes` nodes of `per_node` GPUs hold a replica of `gpus` GPUs evenly, and no fewer would."""
    if nodes == 1:
        return gpus <= per_node
    return gpus % nodes == 0 and gpus // nodes <= per_node and gpus > (nodes - 1) * per_node


def _kv_policy_without_reuse(spec: AgentServingDeploymentSpec) -> bool:
    return spec.router.policy == "kv" and not spec.workers.kv_cache.enable_block_reuse


class AgentServingDeploymentSpec(_Spec):
    """An agent serving deployment: frontend, KV-aware router and workers for one model."""

    model: ModelSpec = Field(description="the model served")
    agent: AgentSpec = Field(
        AgentSpec.model_validate({}), description="parsers, replay, preamble stripping, dispatch, APIs"
    )
    frontend: FrontendSpec = Field(FrontendSpec.model_validate({}), description="the frontend pods")
    router: RouterSpec = Field(RouterSpec.model_validate({}), description="the router pods")
    workers: WorkersSpec = Field(WorkersSpec.model_validate({}), description="the worker pods")
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="the planner: scales workers.replicas to hold TTFT/ITL targets (unset: fixed replicas)",
    )
    node_pool: NodePool = Field(
        NodePool.model_validate({}), description="where worker pods run (B200 by default)"
    )
    auth: AuthSpec = Field(
        AuthSpec.model_validate({}), description="client authentication and the frontend's signing key"
    )
    observability: ObservabilitySpec = Field(
        ObservabilitySpec.model_validate({}), description="metrics and traces"
    )
    network_policy: NetworkPolicySpec = Field(
        NetworkPolicySpec.model_validate({}), description="network isolation"
    )
    state: StateSpec = Field(
        StateSpec.model_validate({}), description="the frontends' shared state store (Redis / Valkey)"
    )

    rules = (
        Rule(
            "(has(self.workers) && has(self.workers.engine) && self.workers.engine == 'sim') || "
            "has(self.model.source)",
            "the trtllm engine needs model.source (pvc, hostPath or image)",
            lambda s: s.workers.engine == "sim" or s.model.source is not None,
        ),
        Rule(
            "!((!has(self.router) || !has(self.router.policy) || self.router.policy == 'kv') && "
            "has(self.workers) && has(self.workers.kvCache) && has(self.workers.kvCache.enableBlockReuse) && "
            "!self.workers.kvCache.enableBlockReuse)",
            "router.policy kv needs workers.kvCache.enableBlockReuse (no reuse, no KV events to route on)",
            lambda s: not _kv_policy_without_reuse(s),
        ),
        Rule(
            "!has(self.frontend) || !has(self.frontend.replicas) || self.frontend.replicas <= 1 || "
            "(has(self.state) && (has(self.state.urlSecret) || has(self.state.managed)))",
            "frontend.replicas > 1 needs shared state (state.managed or state.urlSecret): otherwise a "
            "previous_response_id or a restored turn is found only on the replica that made it",
            lambda s: s.frontend.replicas <= 1 or s.state.shared,
        ),
        Rule(
            "!has(self.frontend) || !has(self.frontend.processes) || self.frontend.processes <= 1 || "
            "(has(self.state) && (has(self.state.urlSecret) || has(self.state.managed)))",
            "frontend.processes > 1 needs shared state (state.managed or state.urlSecret): each process "
            "would otherwise keep its own stored responses and remembered turns",
            lambda s: (s.frontend.processes or 1) <= 1 or s.state.shared,
        ),
        Rule(
            "!(has(self.workers) && has(self.workers.nodesPerWorker)) || "
            f"(self.workers.nodesPerWorker == 1 ? {_GPUS_CEL} <= {_GPN_CEL} : "
            f"({_GPUS_CEL} % self.workers.nodesPerWorker == 0 && "
            f"{_GPUS_CEL} / self.workers.nodesPerWorker <= {_GPN_CEL} && "
            f"{_GPUS_CEL} > (self.workers.nodesPerWorker - 1) * {_GPN_CEL}))",
            "workers.nodesPerWorker must be the nodes tensorParallelSize × pipelineParallelSize GPUs fill "
            "evenly: ceil(GPUs ÷ nodePool.gpusPerNode), with the GPUs divisible by it",
            lambda s: (
                s.workers.nodes_per_worker is None
                or _nodes_fit(
                    s.workers.tensor_parallel_size * s.workers.pipeline_parallel_size,
                    s.workers.nodes_per_worker,
                    s.node_pool.gpus_per_node,
                )
            ),
            detail=lambda s: (
                f"workers.nodesPerWorker {s.workers.nodes_per_worker} does not fit "
                f"{s.workers.tensor_parallel_size * s.workers.pipeline_parallel_size} GPUs on nodes of "
                f"{s.node_pool.gpus_per_node}: use {s.derived_nodes_per_worker()} (with GPUs divisible by it)"
            ),
        ),
        Rule(
            "(has(self.workers) && has(self.workers.nodesPerWorker)) || "
            f"{_GPUS_CEL} <= {_GPN_CEL} || {_GPUS_CEL} % {_GPN_CEL} == 0",
            "tensorParallelSize × pipelineParallelSize exceeds one node and is not a multiple of "
            "nodePool.gpusPerNode: set workers.nodesPerWorker",
            lambda s: (
                s.workers.nodes_per_worker is not None
                or (gpus := s.workers.tensor_parallel_size * s.workers.pipeline_parallel_size)
                <= s.node_pool.gpus_per_node
                or gpus % s.node_pool.gpus_per_node == 0
            ),
        ),
        Rule(
            "!has(self.frontend) || !has(self.frontend.autoscaling) || "
            "self.frontend.autoscaling.maxReplicas <= 1 || "
            "(has(self.state) && (has(self.state.urlSecret) || has(self.state.managed)))",
            "frontend.autoscaling.maxReplicas > 1 needs shared state (state.managed or state.urlSecret): a "
            "previous_response_id or a restored turn is otherwise found only on the replica that made it",
            lambda s: (
                s.frontend.autoscaling is None or s.frontend.autoscaling.max_replicas <= 1 or s.state.shared
            ),
        ),
    )

    @model_validator(mode="after")
    def _prefill_pool_is_servable(self) -> AgentServingDeploymentSpec:
        view = self.prefill_view()
        if view is None or view.workers.engine == "sim":
            return self
        if view.replica_gpus() > self.node_pool.gpus_per_node:
            raise ValueError(
                f"a prefill worker runs on one node: workers.prefill's tensor × pipeline parallel size "
                f"({view.replica_gpus()}) exceeds nodePool.gpusPerNode ({self.node_pool.gpus_per_node})"
            )
        if self.model.context_length is None:
            raise ValueError(
                "workers.prefill needs model.contextLength: the KV transfer buffer holds the longest prompt"
            )
        return self

    def prefill_view(self) -> AgentServingDeploymentSpec | None:
        """This spec as its prefill pool sees it: `workers` with the pool's replicas, resources,
        parallelism and LLM API options (the rest is the decode pool's), no prefill pool of its own,
        no planner. None without `workers.prefill`."""
        prefill = self.workers.prefill
        if prefill is None:
            return None
        w = self.workers
        options = {**(w.llm_api_options or {}), **(prefill.llm_api_options or {})}
        workers = w.model_copy(
            update={
                "replicas": prefill.replicas if prefill.replicas is not None else 1,
                "resources": prefill.resources if prefill.resources is not None else w.resources,
                "gpus_per_worker": prefill.gpus_per_worker,
                "tensor_parallel_size": prefill.tensor_parallel_size or w.tensor_parallel_size,
                "pipeline_parallel_size": prefill.pipeline_parallel_size or w.pipeline_parallel_size,
                "nodes_per_worker": None,
                "llm_api_options": options or None,
                "prefill": None,
            }
        )
        return self.model_copy(update={"workers": workers, "autoscaling": None})

    def replica_gpus(self) -> int:
        """GPUs of one model replica: tensor × pipeline parallel size."""
        return self.workers.tensor_parallel_size * self.workers.pipeline_parallel_size

    def derived_nodes_per_worker(self) -> int:
        return max(1, -(-self.replica_gpus() // self.node_pool.gpus_per_node))

    def resolved_nodes_per_worker(self) -> int:
        """Nodes (pods) one replica spans: the spec's, else derived from its GPUs and the pool's nodes."""
        if self.workers.engine == "sim":
            return 1
        if self.workers.nodes_per_worker is not None:
            return self.workers.nodes_per_worker
        return self.derived_nodes_per_worker()

    def resolved_gpus_per_worker(self) -> int:
        """GPUs per worker pod (for a multi-node replica: per pod of its group)."""
        if self.workers.engine == "sim":
            return 0
        if self.workers.gpus_per_worker is not None:
            return self.workers.gpus_per_worker
        return self.replica_gpus() // self.resolved_nodes_per_worker()


# Rules on the whole object (metadata is visible to CEL only at the root).
NAME_MAX = 45
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
ROOT_RULES: tuple[Rule, ...] = (
    Rule(
        f"self.metadata.name.size() <= {NAME_MAX} && "
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        f"metadata.name must be a DNS label of at most {NAME_MAX} characters starting with a letter "
        "(children are named NAME-frontend, NAME-router, NAME-worker)",
        lambda name: len(name) <= NAME_MAX and _NAME_RE.fullmatch(name) is not None,
    ),
)

# ---------------------------------------------------------------------------------------------- status


class Condition(_Spec):
    type: str = Field(
        max_length=316,
        description="Ready, FrontendReady, RouterReady, WorkersReady or Autoscaling (the planner)",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown")
    reason: str = Field(max_length=1024, description="CamelCase cause, e.g. Unschedulable, InvalidSpec")
    message: str = Field("", max_length=32768, description="what a person should know, with the pod or field")
    last_transition_time: str = Field(description="RFC 3339 time of the last status change")
    observed_generation: int | None = Field(
        None, ge=0, description="generation the condition was computed for"
    )


class ComponentStatus(_Spec):
    replicas: int = Field(0, description="desired pods")
    ready_replicas: int = Field(0, description="pods ready")
    updated_replicas: int = Field(0, description="pods on the current template")
    available_replicas: int = Field(0, description="pods available")


class AgentServingDeploymentStatus(_Spec):
    observed_generation: int | None = Field(None, description="generation the status describes")
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, FrontendReady, RouterReady, WorkersReady (and PrefillWorkersReady with a prefill "
        "pool, Autoscaling with a planner)",
    )
    family: str | None = Field(None, description="model family in effect")
    endpoint: str | None = Field(None, description="in-cluster URL of the frontend")
    frontend: ComponentStatus | None = Field(None, description="pod counts of the frontend Deployment")
    router: ComponentStatus | None = Field(None, description="pod counts of the router Deployment")
    workers: ComponentStatus | None = Field(None, description="pod counts of the worker Deployment")
    prefill_workers: ComponentStatus | None = Field(
        None, description="pod counts of the prefill pool's Deployment (spec.workers.prefill)"
    )
    replicas: int | None = Field(None, description="worker pods (scale subresource)")
    selector: str | None = Field(None, description="label selector of worker pods (scale subresource)")
    workers_ready: str | None = Field(None, description="ready/desired worker pods")
