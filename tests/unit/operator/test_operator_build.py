"""build(): every spec field's effect on the objects, and the spec → component config mapping."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentserve.config import FrontendConfig, ReplayPolicy, RouterConfig, WorkerConfig, load_config
from agentserve.operator.build import (
    COMPONENT_DEFAULTS,
    CONFIG_HASH_ANNOTATION,
    MAPPINGS,
    build,
)
from agentserve.operator.crd import openapi_schema
from agentserve.operator.spec import AgentServingDeploymentSpec
from kubecheck import assert_valid

BASE: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-32B", "source": {"pvc": {"claimName": "models", "path": "qwen3-32b"}}},
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def objects(extra: dict[str, Any] | None = None, uid: str | None = None) -> list[dict[str, Any]]:
    spec = AgentServingDeploymentSpec.model_validate(merge(BASE, extra or {}))
    return build(spec, "coder", "ai", uid)


def get(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} not found once"
    return matches[0]


def pod(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    spec: dict[str, Any] = get(objs, "Deployment", f"coder-{component}")["spec"]["template"]["spec"]
    return spec


def container(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod(objs, component)["containers"]
    return containers[0]


CONFIG_MODELS = {"frontend": FrontendConfig, "router": RouterConfig, "worker": WorkerConfig}


def component_config(objs: list[dict[str, Any]], component: str, tmp_path: Path) -> Any:
    """What the component reads: the ConfigMap's file, loaded as `--config` loads it."""
    data = get(objs, "ConfigMap", "coder-config")["data"]
    path = tmp_path / f"{component}.yaml"
    path.write_text(data[f"{component}.yaml"])
    return load_config(CONFIG_MODELS[component], path)


# --------------------------------------------------------------------------- the mapping table

# For every spec field in MAPPINGS: a spec fragment setting it, and what each mapped key must read.
FIELD_EXAMPLES: dict[str, tuple[dict[str, Any], dict[tuple[str, str], Any]]] = {
    "model.name": (
        {"model": {"name": "deepseek-ai/DeepSeek-R1"}},
        {("frontend", "model"): "deepseek-ai/DeepSeek-R1", ("worker", "model"): "deepseek-ai/DeepSeek-R1"},
    ),
    "model.family": (
        {"model": {"family": "qwen3-coder"}},
        {("frontend", "family"): "qwen3-coder", ("worker", "family"): "qwen3-coder"},
    ),
    "model.source": (
        {"model": {"source": {"pvc": None, "hostPath": {"path": "/mnt/nvme/qwen3"}}}},
        {("frontend", "model_path"): "/models", ("worker", "model_path"): "/models"},
    ),
    "model.tokenizer": (
        {"model": {"tokenizer": "tok"}},
        {
            ("frontend", "tokenizer"): "/models/qwen3-32b/tok",
            ("worker", "tokenizer"): "/models/qwen3-32b/tok",
        },
    ),
    "model.chatTemplate": (
        {"model": {"chatTemplate": {"inline": "{{ messages }}"}}},
        {("frontend", "chat_template"): "/etc/agentserve/chat-template.jinja"},
    ),
    "model.contextLength": (
        {"model": {"contextLength": 131072}},
        {("frontend", "context_length"): 131072, ("worker", "max_seq_len"): 131072},
    ),
    "agent.reasoningParser": (
        {"agent": {"reasoningParser": "deepseek-r1"}},
        {("frontend", "reasoning_parser"): "deepseek-r1"},
    ),
    "agent.toolCallParser": (
        {"agent": {"toolCallParser": "hermes"}},
        {("frontend", "tool_call_parser"): "hermes"},
    ),
    "agent.replay.policy": (
        {"agent": {"replay": {"policy": "inject"}}},
        {("frontend", "replay_policy"): ReplayPolicy.INJECT},
    ),
    "agent.replay.truncateHistoryThinking": (
        {"agent": {"replay": {"truncateHistoryThinking": True}}},
        {("frontend", "truncate_history_thinking"): True},
    ),
    "agent.reasoningDefault": (
        {"agent": {"reasoningDefault": "on"}},
        {("frontend", "reasoning_default"): "on"},
    ),
    "agent.exactReplay": ({"agent": {"exactReplay": False}}, {("frontend", "exact_replay"): False}),
    "agent.preambleStripping.enabled": (
        {"agent": {"preambleStripping": {"enabled": False}}},
        {("frontend", "strip_anthropic_preamble"): False},
    ),
    "agent.preambleStripping.patterns": (
        {"agent": {"preambleStripping": {"patterns": [{"name": "date", "regex": "Today is .*"}]}}},
        {("frontend", "strip_pattern"): ["date=Today is .*"]},
    ),
    "agent.constrainedDecoding.enabled": (
        {"agent": {"constrainedDecoding": {"enabled": False}}},
        {("frontend", "constrained_decoding"): False},
    ),
    "agent.constrainedDecoding.cacheSize": (
        {"agent": {"constrainedDecoding": {"cacheSize": 64}}},
        {("frontend", "constraint_cache_size"): 64, ("worker", "constraint_cache_size"): 64},
    ),
    "agent.constrainedDecoding.backend": (
        {"agent": {"constrainedDecoding": {"backend": "xgrammar"}}},
        {("worker", "guided_decoding_backend"): "xgrammar"},
    ),
    "agent.streamingToolDispatch.enabled": (
        {"agent": {"streamingToolDispatch": {"enabled": False}}},
        {("frontend", "enable_streaming_tool_dispatch"): False},
    ),
    "agent.apis": ({"agent": {"apis": ["chat", "responses"]}}, {("frontend", "apis"): ["chat", "responses"]}),
    "agent.codexCatalog": ({"agent": {"codexCatalog": False}}, {("frontend", "codex_catalog"): False}),
    "frontend.processes": (
        {"frontend": {"processes": 3}, "state": {"managed": {}}},
        {("frontend", "processes"): 3},
    ),
    "frontend.maxRequestBodyBytes": (
        {"frontend": {"maxRequestBodyBytes": 1048576}},
        {("frontend", "max_body_bytes"): 1048576},
    ),
    "auth.apiKeysSecret": (
        {"auth": {"apiKeysSecret": {"name": "agent-keys"}}},
        {("frontend", "api_keys_file"): "/etc/agentserve/auth/api-keys"},
    ),
    "auth.signingKeySecret": (
        {"auth": {"signingKeySecret": {"name": "shared-signing", "key": "hmac"}}},
        {("frontend", "signing_key_file"): "/etc/agentserve/signing/hmac"},
    ),
    "observability.traceSink": (
        {"observability": {"traceSink": {"enabled": True}}},
        {("frontend", "trace_sink"): "/var/lib/agentserve/traces/trace.jsonl"},
    ),
    "router.policy": ({"router": {"policy": "least-loaded"}}, {("router", "policy"): "least-loaded"}),
    "router.weights.overlap": (
        {"router": {"weights": {"overlap": 2.5}}},
        {("router", "overlap_weight"): 2.5},
    ),
    "router.weights.load": ({"router": {"weights": {"load": 0.5}}}, {("router", "load_weight"): 0.5}),
    "router.temperature": ({"router": {"temperature": 0.3}}, {("router", "temperature"): 0.3}),
    "router.affinityTtlSeconds": (
        {"router": {"affinityTtlSeconds": 60}},
        {("router", "affinity_ttl_s"): 60.0},
    ),
    "router.maxInflightPerWorker": (
        {"router": {"maxInflightPerWorker": 64}},
        {("router", "max_inflight_per_worker"): 64},
    ),
    "workers.engine": ({"workers": {"engine": "sim"}}, {("worker", "engine"): "sim"}),
    "workers.sim.profile": (
        {"workers": {"engine": "sim", "sim": {"profile": "h200-qwen3-30b-a3b-pytorch"}}},
        {("worker", "sim_profile"): "h200-qwen3-30b-a3b-pytorch"},
    ),
    "workers.tensorParallelSize": (
        {"workers": {"tensorParallelSize": 4}},
        {("worker", "tensor_parallel_size"): 4},
    ),
    "workers.pipelineParallelSize": (
        {"workers": {"pipelineParallelSize": 2}},
        {("worker", "pipeline_parallel_size"): 2},
    ),
    "nodePool.gpusPerNode": (
        {"workers": {"tensorParallelSize": 8, "pipelineParallelSize": 2}, "nodePool": {"gpusPerNode": 8}},
        {("worker", "gpus_per_node"): 8},
    ),
    "workers.kvCache.enableBlockReuse": (
        {"router": {"policy": "round-robin"}, "workers": {"kvCache": {"enableBlockReuse": False}}},
        {("worker", "enable_block_reuse"): False},
    ),
    "workers.kvCache.freeGpuMemoryFraction": (
        {"workers": {"kvCache": {"freeGpuMemoryFraction": 0.8}}},
        {("worker", "free_gpu_memory_fraction"): 0.8},
    ),
    "workers.kvCache.tokensPerBlock": (
        {"workers": {"kvCache": {"tokensPerBlock": 64}}},
        {("worker", "block_size"): 64, ("router", "block_size"): 64, ("frontend", "block_size"): 64},
    ),
    "workers.kvCache.retention.mode": (
        {"workers": {"kvCache": {"retention": {"mode": "off"}}}},
        {("frontend", "kv_retention"): "off", ("worker", "kv_retention"): "off"},
    ),
    "workers.kvCache.retention.sessionSeconds": (
        {"workers": {"kvCache": {"retention": {"sessionSeconds": 900}}}},
        {("frontend", "kv_retention_session_seconds"): 900.0},
    ),
    "workers.kvCache.retention.idleSeconds": (
        {"workers": {"kvCache": {"retention": {"idleSeconds": 60}}}},
        {("frontend", "kv_retention_idle_seconds"): 60.0},
    ),
    "workers.kvCache.retention.sessionPriority": (
        {"workers": {"kvCache": {"retention": {"sessionPriority": 70}}}},
        {("frontend", "kv_retention_session_priority"): 70},
    ),
    "workers.kvCache.retention.prefixPriority": (
        {"workers": {"kvCache": {"retention": {"prefixPriority": 100}}}},
        {("frontend", "kv_retention_prefix_priority"): 100},
    ),
    "workers.kvCache.retention.subagentTrees": (
        {"workers": {"kvCache": {"retention": {"subagentTrees": False}}}},
        {("frontend", "subagent_trees"): False},
    ),
    "workers.kvCache.hostCacheBytes": (
        {"workers": {"kvCache": {"hostCacheBytes": 68719476736}}},
        {("worker", "host_cache_size"): 68719476736},
    ),
    "workers.llmApiOptions": (
        {"workers": {"llmApiOptions": {"enable_chunked_prefill": True}}},
        {("worker", "extra_llm_api_options"): "/etc/agentserve/llm-api-options.yaml"},
    ),
    "state.managed": (
        {"state": {"managed": {}}},
        {("frontend", "state_url"): "redis://coder-state.ai.svc:6379/0"},
    ),
    "state.urlSecret": (
        {"state": {"urlSecret": {"name": "redis", "key": "address"}}},
        {("frontend", "state_url_file"): "/etc/agentserve/state/address"},
    ),
    "state.responseTtlSeconds": (
        {"state": {"responseTtlSeconds": 3600}},
        {("frontend", "response_ttl_s"): 3600.0},
    ),
    "state.callMemoryTtlSeconds": (
        {"state": {"callMemoryTtlSeconds": 600}},
        {("frontend", "call_memory_ttl_s"): 600.0},
    ),
    "frontend.terminationGracePeriodSeconds": (
        {"frontend": {"terminationGracePeriodSeconds": 100}},
        {("frontend", "drain_grace_s"): 93.0},
    ),
    "workers.terminationGracePeriodSeconds": (
        {"workers": {"terminationGracePeriodSeconds": 100}},
        {("worker", "drain_grace_s"): 96.0},
    ),
    "workers.prefill": (
        {"model": {"contextLength": 131072}, "workers": {"prefill": {}}},
        {("router", "prefill_worker_service"): "coder-prefill-worker", ("worker", "role"): "decode"},
    ),
    "workers.prefill.thresholdTokens": (
        {"model": {"contextLength": 131072}, "workers": {"prefill": {"thresholdTokens": 4096}}},
        {("router", "prefill_threshold_tokens"): 4096},
    ),
}


def _drop_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nones(v) for k, v in value.items() if v is not None}
    return value


def test_every_mapped_spec_field_has_an_example() -> None:
    mapped = {row.spec for row in MAPPINGS if not row.spec.startswith("(")}
    assert mapped == set(FIELD_EXAMPLES)
    for path, (_, expected) in FIELD_EXAMPLES.items():
        rows = {(row.component, row.key) for row in MAPPINGS if row.spec == path}
        assert rows == set(expected), path


@pytest.mark.parametrize("path", sorted(FIELD_EXAMPLES))
def test_spec_field_lands_in_its_config_key(path: str, tmp_path: Path) -> None:
    fragment, expected = FIELD_EXAMPLES[path]
    spec = _drop_nones(merge(BASE, fragment))
    after = build(AgentServingDeploymentSpec.model_validate(spec), "coder", "ai")
    before = objects()
    for (component, key), value in expected.items():
        got = getattr(component_config(after, component, tmp_path), key)
        assert got == value, f"{path} → {component}.{key}"
        baseline = getattr(component_config(before, component, tmp_path), key)
        assert baseline != value, f"{path}: the example must differ from the default to prove an effect"


def test_wiring_keys_point_at_this_deployment(tmp_path: Path) -> None:
    objs = objects()
    frontend = component_config(objs, "frontend", tmp_path)
    router = component_config(objs, "router", tmp_path)
    worker = component_config(objs, "worker", tmp_path)
    assert frontend.router_url == "http://coder-router:8100"
    assert (router.discovery, router.worker_service, router.namespace) == ("kubernetes", "coder-worker", "ai")
    assert (frontend.port, router.port, worker.port, worker.kv_events_port) == (8000, 8100, 8200, 5557)
    ports = {c: container(objs, c)["ports"][0]["containerPort"] for c in ("frontend", "router", "worker")}
    assert ports == {"frontend": 8000, "router": 8100, "worker": 8200}
    assert container(objs, "worker")["ports"][1] == {
        "name": "kv-events",
        "containerPort": 5557,
        "protocol": "TCP",
    }


def test_every_config_key_is_mapped_or_left_at_the_component_default() -> None:
    for component, model in CONFIG_MODELS.items():
        mapped = {row.key for row in MAPPINGS if row.component == component}
        assert mapped | COMPONENT_DEFAULTS[component] == set(model.model_fields), component  # type: ignore[attr-defined]
        assert not mapped & COMPONENT_DEFAULTS[component]


# Spec fields that shape the pods or objects rather than a config key; each has a test below.
POD_LEVEL = {
    "replicas",
    "image",
    "imagePullPolicy",
    "resources",
    "env",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "imagePullSecrets",
    "volumes",
    "volumeMounts",
    "terminationGracePeriodSeconds",
}
OBJECT_LEVEL = {
    "frontend.service",
    "workers.gpusPerWorker",
    "workers.shmSize",
    "workers.startupTimeoutSeconds",
    "workers.updateStrategy",
    "workers.nodesPerWorker",  # a LeaderWorkerSet of that group size (test_operator_multinode.py)
    "workers.cache",
    "nodePool",
    "observability.serviceMonitor",
    "networkPolicy",
    # The planner's objects and config (test_operator_autoscaling.py) and the frontend's HPA.
    "autoscaling",
    "frontend.autoscaling",
    # Acts when the spec is validated (apiserver CEL, operator), not on any object.
    "workers.llmApiOptionsCheck",
}


def _leaves(node: dict[str, Any], path: str = "") -> list[str]:
    props = node.get("properties")
    if not props:
        return [path]
    return [leaf for name, sub in props.items() for leaf in _leaves(sub, f"{path}.{name}" if path else name)]


def test_every_spec_field_has_an_effect() -> None:
    mapped = {row.spec for row in MAPPINGS}
    for leaf in _leaves(openapi_schema()["properties"]["spec"]):
        covered = any(leaf == m or leaf.startswith(m + ".") for m in mapped | OBJECT_LEVEL) or (
            leaf.split(".")[0] in {"frontend", "router", "workers"} and leaf.split(".")[1] in POD_LEVEL
        )
        assert covered, f"spec.{leaf} has no mapping row and no object-level handling"


# -------------------------------------------------------------------------------- the objects


def test_objects_are_valid_kubernetes() -> None:
    full = {
        "model": {
            "family": "qwen3",
            "tokenizer": "/tok",
            "chatTemplate": {"configMap": {"name": "t", "key": "k"}},
        },
        "state": {"managed": {"storage": "1Gi", "storageClassName": "fast"}},
        "frontend": {
            "replicas": 2,
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
            "service": {"type": "LoadBalancer", "annotations": {"a": "b"}},
            "imagePullSecrets": [{"name": "regcred"}],
        },
        "workers": {
            "tensorParallelSize": 8,
            "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
            "volumes": [{"name": "extra", "emptyDir": {}}],
            "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
            "priorityClassName": "inference",
            "llmApiOptions": {"enable_attention_dp": True},
        },
        "auth": {"apiKeysSecret": {"name": "keys"}},
        "observability": {
            "serviceMonitor": {"enabled": True},
            "traceSink": {"enabled": True, "claimName": "traces"},
        },
    }
    objs = objects(full, uid="0000-1111")
    assert_valid(objs)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap"]
        + ["Service"] * 4  # the frontend's, the router's, the workers', the managed Valkey's
        + ["Deployment"] * 3
        + ["StatefulSet"]
        + ["PodDisruptionBudget"] * 3
        + ["NetworkPolicy", "ServiceMonitor"]
    )


def test_containers_start_agentserve_with_their_config_file() -> None:
    objs = objects()
    data = get(objs, "ConfigMap", "coder-config")["data"]
    for component in ("frontend", "router", "worker"):
        c = container(objs, component)
        assert c["command"] == ["agentserve", component]
        assert c["args"] == ["--config", f"/etc/agentserve/{component}.yaml"]
        assert f"{component}.yaml" in data
        assert {"name": "config", "mountPath": "/etc/agentserve", "readOnly": True} in c["volumeMounts"]


def test_labels_selectors_and_owner_references() -> None:
    objs = objects(uid="abc-123")
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "agentserve"
        assert labels["app.kubernetes.io/instance"] == "coder"
        assert labels["app.kubernetes.io/managed-by"] == "agentserve-operator"
        assert labels["app.kubernetes.io/part-of"] == "agentserve"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "agentserve.dev/v1alpha1",
            "kind": "AgentServingDeployment",
            "name": "coder",
            "uid": "abc-123",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    for component in ("frontend", "router", "worker"):
        deployment = get(objs, "Deployment", f"coder-{component}")
        selector = deployment["spec"]["selector"]["matchLabels"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        assert selector["app.kubernetes.io/component"] == component
        assert get(objs, "Service", f"coder-{component}")["spec"]["selector"] == selector
        assert get(objs, "PodDisruptionBudget", f"coder-{component}")["spec"] == {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
        }
    assert all("ownerReferences" not in o["metadata"] for o in objects())


def test_user_pod_labels_cannot_break_the_selector() -> None:
    objs = objects({"workers": {"podLabels": {"app.kubernetes.io/component": "x", "team": "ml"}}})
    labels = get(objs, "Deployment", "coder-worker")["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "worker"
    assert labels["team"] == "ml"


def test_security_context_everywhere() -> None:
    objs = objects()
    for component in ("frontend", "router", "worker"):
        p = pod(objs, component)
        assert p["securityContext"]["runAsNonRoot"] is True
        assert p["securityContext"]["runAsUser"] == 1000
        assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = container(objs, component)["securityContext"]
        assert sc == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        }
        mounts = {m["mountPath"] for m in container(objs, component)["volumeMounts"]}
        assert {"/tmp", "/var/cache/agentserve"} <= mounts  # writable places on a read-only root


def test_workers_get_b200_placement_and_others_do_not() -> None:
    objs = objects()
    worker = pod(objs, "worker")
    assert worker["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert worker["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for component in ("frontend", "router"):
        assert "nodeSelector" not in pod(objs, component)
        assert "tolerations" not in pod(objs, component)
    sim = pod(objects({"workers": {"engine": "sim", "nodeSelector": {"pool": "cpu"}}}), "worker")
    assert sim["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in sim


def test_node_pool_is_overridable() -> None:
    objs = objects(
        {
            "nodePool": {
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-b200"},
                "tolerations": [],
                "affinity": {"nodeAffinity": {"x": 1}},
            },
            "workers": {
                "nodeSelector": {"pool": "inference"},
                "tolerations": [{"key": "spot", "operator": "Exists"}],
            },
        }
    )
    worker = pod(objs, "worker")
    assert worker["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-b200", "pool": "inference"}
    assert worker["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert worker["affinity"] == {"nodeAffinity": {"x": 1}}
    empty = pod(objects({"nodePool": {"nodeSelector": {}, "tolerations": []}}), "worker")
    assert "nodeSelector" not in empty and "tolerations" not in empty
    own = pod(objects({"nodePool": {"affinity": {"a": 1}}, "workers": {"affinity": {"b": 2}}}), "worker")
    assert own["affinity"] == {"b": 2}


def test_gpu_resources() -> None:
    tp8 = container(objects({"workers": {"tensorParallelSize": 8}}), "worker")["resources"]
    assert tp8["limits"]["nvidia.com/gpu"] == 8 and tp8["requests"]["nvidia.com/gpu"] == 8
    more = container(objects({"workers": {"tensorParallelSize": 4, "gpusPerWorker": 8}}), "worker")
    assert more["resources"]["limits"]["nvidia.com/gpu"] == 8
    custom = container(
        objects(
            {
                "nodePool": {"gpuResource": "nvidia.com/mig-1g.23gb"},
                "workers": {"resources": {"limits": {"memory": "900Gi", "nvidia.com/mig-1g.23gb": 3}}},
            }
        ),
        "worker",
    )["resources"]
    assert custom["limits"] == {"memory": "900Gi", "nvidia.com/mig-1g.23gb": 1}
    sim = container(objects({"workers": {"engine": "sim"}}), "worker")
    assert "resources" not in sim
    assert "resources" not in container(objects(), "frontend")


def test_shm_volume_on_workers_only() -> None:
    objs = objects({"workers": {"shmSize": "64Gi"}})
    volumes = {v["name"]: v for v in pod(objs, "worker")["volumes"]}
    assert volumes["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
    assert {"name": "shm", "mountPath": "/dev/shm"} in container(objs, "worker")["volumeMounts"]
    for component in ("frontend", "router"):
        assert "shm" not in {v["name"] for v in pod(objs, component)["volumes"]}


def test_probes_and_startup_budget() -> None:
    objs = objects({"workers": {"startupTimeoutSeconds": 3600}})
    worker = container(objs, "worker")
    assert worker["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    startup = worker["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"  # passes only once the model is loaded
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
    assert startup["periodSeconds"] * (startup["failureThreshold"] - 1) < 3600
    default = container(objects(), "worker")["startupProbe"]
    assert default["periodSeconds"] * default["failureThreshold"] >= 7200
    # A load of an hour is not a stuck rollout (the default deadline is 600 s).
    assert get(objs, "Deployment", "coder-worker")["spec"]["progressDeadlineSeconds"] > 3600
    assert "progressDeadlineSeconds" not in get(objs, "Deployment", "coder-frontend")["spec"]
    for component in ("frontend", "router"):
        c = container(objs, component)
        assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"


def _hashes(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {
        c: get(objs, "Deployment", f"coder-{c}")["spec"]["template"]["metadata"]["annotations"][
            CONFIG_HASH_ANNOTATION
        ]
        for c in ("frontend", "router", "worker")
    }


def test_config_hash_rolls_exactly_the_pods_whose_config_changed() -> None:
    base = _hashes(objects())
    assert base == _hashes(objects())
    assert len(set(base.values())) == 3
    router = _hashes(objects({"router": {"temperature": 0.5}}))
    assert router["router"] != base["router"] and router["frontend"] == base["frontend"]
    assert router["worker"] == base["worker"]
    options = _hashes(objects({"workers": {"llmApiOptions": {"max_batch_size": 64}}}))
    assert options["worker"] != base["worker"] and options["frontend"] == base["frontend"]
    block = _hashes(objects({"workers": {"kvCache": {"tokensPerBlock": 64}}}))
    assert all(block[c] != base[c] for c in base)
    template = _hashes(objects({"model": {"chatTemplate": {"inline": "{{ x }}"}}}))
    template2 = _hashes(objects({"model": {"chatTemplate": {"inline": "{{ y }}"}}}))
    assert template["frontend"] != template2["frontend"] and template["worker"] == template2["worker"]
    # Pod-level changes do not touch the hash (the Deployment rolls on its own).
    assert _hashes(objects({"workers": {"replicas": 3}})) == base


def test_worker_service_is_headless_and_router_can_watch_endpointslices() -> None:
    objs = objects()
    service = get(objs, "Service", "coder-worker")["spec"]
    assert service["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in service["ports"]} == {"http": 8200, "kv-events": 5557}
    role = get(objs, "Role", "coder-router")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = get(objs, "RoleBinding", "coder-router")
    assert binding["roleRef"]["name"] == "coder-router"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "coder-router", "namespace": "ai"}]
    router = pod(objs, "router")
    assert router["serviceAccountName"] == "coder-router" and router["automountServiceAccountToken"] is True
    for component in ("frontend", "worker"):
        assert pod(objs, component)["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod(objs, component)


def test_router_service_keeps_a_frontend_on_one_replica() -> None:
    service = get(objects(), "Service", "coder-router")
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["sessionAffinity"] == "ClientIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8100, "targetPort": "http", "protocol": "TCP"}
    ]


def test_frontend_service() -> None:
    service = get(objects(), "Service", "coder-frontend")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    custom = get(
        objects(
            {"frontend": {"service": {"type": "LoadBalancer", "port": 80, "annotations": {"lb": "internal"}}}}
        ),
        "Service",
        "coder-frontend",
    )
    assert custom["spec"]["type"] == "LoadBalancer"
    assert custom["spec"]["ports"][0]["port"] == 80
    assert custom["metadata"]["annotations"] == {"lb": "internal"}


def test_network_policy() -> None:
    policy = get(objects(), "NetworkPolicy", "coder-internal")["spec"]
    assert policy["podSelector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["router", "worker"]}
    ]
    (rule,) = policy["ingress"]
    assert rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": "agentserve", "app.kubernetes.io/instance": "coder"}
            }
        }
    ]
    assert {p["port"] for p in rule["ports"]} == {8100, 8200, 5557}
    prom = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    extra = get(objects({"networkPolicy": {"extraIngressFrom": [prom]}}), "NetworkPolicy", "coder-internal")
    assert extra["spec"]["ingress"][0]["from"][1] == prom
    assert not [o for o in objects({"networkPolicy": {"enabled": False}}) if o["kind"] == "NetworkPolicy"]


def test_service_monitor() -> None:
    assert not [o for o in objects() if o["kind"] == "ServiceMonitor"]
    sm = get(
        objects(
            {
                "observability": {
                    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "p"}}
                }
            }
        ),
        "ServiceMonitor",
        "coder",
    )
    assert sm["metadata"]["labels"]["release"] == "p"
    (endpoint,) = sm["spec"]["endpoints"]
    assert {k: endpoint[k] for k in ("port", "path", "interval")} == {
        "port": "http",
        "path": "/metrics",
        "interval": "15s",
    }
    # Every series carries the deployment and its component (the dashboard's variables, the alerts).
    assert endpoint["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
            "targetLabel": "deployment",
            "action": "replace",
        },
        {
            "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
            "targetLabel": "component",
            "action": "replace",
        },
    ]
    assert sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "coder"


def test_pod_level_fields() -> None:
    objs = objects(
        {
            "state": {"urlSecret": {"name": "redis"}},
            "frontend": {
                "replicas": 3,
                "image": "registry.example/agentserve:dev",
                "imagePullPolicy": "Always",
                "podAnnotations": {"sidecar": "off"},
                "terminationGracePeriodSeconds": 5,
                "env": [{"name": "PYTHONUNBUFFERED", "value": "0"}, {"name": "X", "value": "1"}],
                "priorityClassName": "high",
                "imagePullSecrets": [{"name": "regcred"}],
            },
            "router": {"resources": {"limits": {"cpu": 2}}},
        }
    )
    deployment = get(objs, "Deployment", "coder-frontend")
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["sidecar"] == "off"
    assert template["spec"]["terminationGracePeriodSeconds"] == 5
    assert template["spec"]["priorityClassName"] == "high"
    assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    c = template["spec"]["containers"][0]
    assert c["image"] == "registry.example/agentserve:dev" and c["imagePullPolicy"] == "Always"
    env = {e["name"]: e for e in c["env"]}
    assert env["PYTHONUNBUFFERED"]["value"] == "0"  # the user's value replaces the default
    assert [e["name"] for e in c["env"]].count("PYTHONUNBUFFERED") == 1
    assert env["X"]["value"] == "1"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container(objs, "router")["resources"] == {"limits": {"cpu": 2}}
    assert pod(objs, "worker")["terminationGracePeriodSeconds"] == 60


def test_default_images_follow_the_engine() -> None:
    from agentserve import __version__

    assert container(objects(), "worker")["image"] == f"ghcr.io/agentserve/worker-trtllm:{__version__}"
    sim = objects({"workers": {"engine": "sim"}})
    assert container(sim, "worker")["image"] == f"ghcr.io/agentserve/agentserve:{__version__}"
    assert container(sim, "frontend")["image"] == f"ghcr.io/agentserve/agentserve:{__version__}"


def test_model_volumes_and_mounts() -> None:
    objs = objects()
    for component in ("frontend", "worker"):
        volumes = {v["name"]: v for v in pod(objs, component)["volumes"]}
        assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in container(objs, component)[
            "volumeMounts"
        ]
    assert "model" not in {v["name"] for v in pod(objs, "router")["volumes"]}
    host = pod(objects({"model": {"source": {"pvc": None, "hostPath": {"path": "/nvme/m"}}}}), "worker")
    assert {v["name"]: v for v in host["volumes"]}["model"]["hostPath"] == {
        "path": "/nvme/m",
        "type": "Directory",
    }
    image = objects({"model": {"source": {"pvc": None, "image": {"path": "/opt/model"}}}})
    assert "model" not in {v["name"] for v in pod(image, "worker")["volumes"]}
    data = yaml.safe_load(get(image, "ConfigMap", "coder-config")["data"]["worker.yaml"])
    assert data["model_path"] == "/opt/model"
    env = {e["name"] for e in container(objs, "worker")["env"]}
    assert "HF_HUB_OFFLINE" in env


def test_frontend_secret_trace_and_template_volumes() -> None:
    objs = objects(
        {
            "auth": {"apiKeysSecret": {"name": "keys", "key": "tokens"}},
            "observability": {"traceSink": {"enabled": True, "claimName": "traces"}},
            "model": {"chatTemplate": {"configMap": {"name": "tmpl", "key": "chat.jinja"}}},
        }
    )
    volumes = {v["name"]: v for v in pod(objs, "frontend")["volumes"]}
    assert volumes["auth"]["secret"] == {
        "secretName": "keys",
        "items": [{"key": "tokens", "path": "api-keys"}],
    }
    assert volumes["traces"]["persistentVolumeClaim"] == {"claimName": "traces"}
    assert volumes["chat-template"]["configMap"]["items"] == [{"key": "chat.jinja", "path": "template.jinja"}]
    mounts = {m["name"]: m for m in container(objs, "frontend")["volumeMounts"]}
    assert mounts["traces"]["subPathExpr"] == "$(POD_NAME)"
    data = yaml.safe_load(get(objs, "ConfigMap", "coder-config")["data"]["frontend.yaml"])
    assert data["chat_template"] == "/etc/agentserve/chat-template/template.jinja"


def _signing_volume(objs: list[dict[str, Any]]) -> dict[str, Any]:
    volumes = [v for v in pod(objs, "frontend")["volumes"] if v["name"] == "signing-key"]
    assert len(volumes) == 1
    return volumes[0]


def test_frontends_mount_the_operators_signing_key_secret_by_default(tmp_path: Path) -> None:
    objs = objects({"frontend": {"replicas": 4}, "state": {"managed": {}}})
    assert _signing_volume(objs) == {
        "name": "signing-key",
        "secret": {
            "secretName": "coder-signing-key",
            "items": [{"key": "signing-key", "path": "signing-key"}],
            "defaultMode": 0o440,
        },
    }
    assert {"name": "signing-key", "mountPath": "/etc/agentserve/signing", "readOnly": True} in container(
        objs, "frontend"
    )["volumeMounts"]
    assert (
        component_config(objs, "frontend", tmp_path).signing_key_file == "/etc/agentserve/signing/signing-key"
    )
    # The Secret is only referenced: build() never makes one (the operator creates it, with random bytes).
    assert not [o for o in objs if o["kind"] == "Secret"]
    for component in ("router", "worker"):
        assert "signing-key" not in {v["name"] for v in pod(objs, component)["volumes"]}
        assert "signing_key_file" not in get(objs, "ConfigMap", "coder-config")["data"][f"{component}.yaml"]


def test_a_signing_key_secret_in_the_spec_replaces_the_operators(tmp_path: Path) -> None:
    objs = objects({"auth": {"signingKeySecret": {"name": "team-signing", "key": "v2"}}})
    assert _signing_volume(objs)["secret"] == {
        "secretName": "team-signing",
        "items": [{"key": "v2", "path": "v2"}],
        "defaultMode": 0o440,
    }
    assert component_config(objs, "frontend", tmp_path).signing_key_file == "/etc/agentserve/signing/v2"
    assert "coder-signing-key" not in yaml.safe_dump(objs)  # the managed Secret is not referenced
    default_key = objects({"auth": {"signingKeySecret": {"name": "team-signing"}}})
    assert _signing_volume(default_key)["secret"]["items"] == [{"key": "signing-key", "path": "signing-key"}]


def test_switching_the_signing_key_rolls_the_frontend_only() -> None:
    base = objects()
    switched = objects({"auth": {"signingKeySecret": {"name": "team-signing", "key": "v2"}}})
    assert _hashes(switched)["frontend"] != _hashes(base)["frontend"]  # frontend.yaml names another file
    assert {c: _hashes(switched)[c] for c in ("router", "worker")} == {
        c: _hashes(base)[c] for c in ("router", "worker")
    }
    renamed = objects({"auth": {"signingKeySecret": {"name": "team-signing"}}})
    # Same file name, another Secret: the pod template changes, so the Deployment rolls on its own.
    assert (
        get(renamed, "Deployment", "coder-frontend")["spec"]["template"]
        != get(base, "Deployment", "coder-frontend")["spec"]["template"]
    )


@pytest.mark.parametrize("key", ["..data", ".hidden", "a/b", ""])
def test_signing_key_names_that_cannot_be_a_file_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="signingKeySecret"):
        AgentServingDeploymentSpec.model_validate(
            merge(BASE, {"auth": {"signingKeySecret": {"name": "s", "key": key}}})
        )


def test_rollout_strategies() -> None:
    objs = objects()
    worker = get(objs, "Deployment", "coder-worker")["spec"]["strategy"]
    # The old workers serve until the new one is loaded: at 1 replica the model never goes down.
    assert worker["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    replace = objects({"workers": {"updateStrategy": "replace"}})
    strategy = get(replace, "Deployment", "coder-worker")["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}  # no spare GPUs
    frontend = get(objs, "Deployment", "coder-frontend")["spec"]["strategy"]
    assert frontend["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_router_inflight_limit_defaults_to_the_engine_batch() -> None:
    """More in flight than the engine's batch would queue requests inside TensorRT-LLM, where the
    router cannot reorder them and a cancel of a queued request gets no response."""
    from agentserve.operator.build import inflight_limit
    from agentserve.operator.spec import AgentServingDeploymentSpec

    def spec(extra: dict[str, Any]) -> AgentServingDeploymentSpec:
        return AgentServingDeploymentSpec.model_validate(merge(BASE, extra))

    assert inflight_limit(spec({"workers": {"llmApiOptions": {"max_batch_size": 128}}})) == 128
    assert inflight_limit(spec({})) == 256  # the worker's max_batch_size default
    assert inflight_limit(spec({"router": {"maxInflightPerWorker": 32}})) == 32
    # Attention DP: each of the tensor-parallel ranks runs its own batch.
    adp = {"tensorParallelSize": 4, "gpusPerWorker": 4, "llmApiOptions": {"enable_attention_dp": True}}
    assert (
        inflight_limit(
            spec({"workers": {**adp, "llmApiOptions": {"enable_attention_dp": True, "max_batch_size": 64}}})
        )
        == 256
    )
    assert inflight_limit(spec({"workers": adp})) == 4 * 256


def test_worker_caches_on_a_claim_survive_restarts() -> None:
    objs = objects({"workers": {"cache": {"claimName": "jit-cache"}}})
    volumes = {v["name"]: v for v in pod(objs, "worker")["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "jit-cache"}}
    env = {e["name"]: e.get("value") for e in container(objs, "worker")["env"]}
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(env["XDG_CACHE_HOME"])
    assert env["TRITON_CACHE_DIR"].startswith(env["XDG_CACHE_HOME"])
    assert {v["name"]: v for v in pod(objs, "frontend")["volumes"]}["cache"] == {
        "name": "cache",
        "emptyDir": {},
    }
    sized = objects({"workers": {"cache": {"sizeLimit": "50Gi"}}})
    cache = {v["name"]: v for v in pod(sized, "worker")["volumes"]}["cache"]
    assert cache == {"name": "cache", "emptyDir": {"sizeLimit": "50Gi"}}


def test_frontend_replicas_need_shared_state() -> None:
    with pytest.raises(ValueError, match="needs shared state"):
        objects({"frontend": {"replicas": 2}})
    with pytest.raises(ValueError, match="not both"):
        objects({"state": {"managed": {}, "urlSecret": {"name": "redis"}}})
    objects({"frontend": {"replicas": 1}})  # one replica: its own state is everyone's


def test_managed_state_is_a_valkey_statefulset_the_frontends_use(tmp_path: Path) -> None:
    objs = objects({"frontend": {"replicas": 2}, "state": {"managed": {"storage": "5Gi"}}})
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
    (svc,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "coder-state"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("valkey/valkey:")
    assert "--appendonly" in container["args"] and "yes" in container["args"]
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "5Gi"
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["port"] == 6379
    assert component_config(objs, "frontend", tmp_path).state_url == "redis://coder-state.ai.svc:6379/0"
    memory_only = objects({"state": {"managed": {}}})
    (sts,) = [o for o in memory_only if o["kind"] == "StatefulSet"]
    assert "volumeClaimTemplates" not in sts["spec"]
    assert not [o for o in objects() if o["kind"] == "StatefulSet"]


def test_an_external_state_url_comes_from_a_mounted_secret(tmp_path: Path) -> None:
    objs = objects({"frontend": {"replicas": 2}, "state": {"urlSecret": {"name": "redis", "key": "url"}}})
    frontend = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "coder-frontend"
    )
    pod = frontend["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "state-url"]
    assert volume["secret"]["secretName"] == "redis"
    config = component_config(objs, "frontend", tmp_path)
    assert config.state_url is None and config.state_url_file == "/etc/agentserve/state/url"
    assert not [o for o in objs if o["kind"] == "StatefulSet"]


def test_drain_fits_in_the_termination_grace_period(tmp_path: Path) -> None:
    objs = objects()
    for component, deployment in (("frontend", "coder-frontend"), ("worker", "coder-worker")):
        pod = next(o for o in objs if o["metadata"]["name"] == deployment and o["kind"] == "Deployment")
        period = pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        config = component_config(objs, component, tmp_path)
        assert 0 < config.drain_delay_s + config.drain_grace_s < period
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"} == {
        "coder-frontend",
        "coder-router",
        "coder-worker",
    }


@pytest.mark.parametrize(
    ("frontend", "shared", "expected"),
    [
        ({}, True, 1),  # no CPU given: one process
        ({"resources": {"limits": {"cpu": "4"}}}, True, 4),
        ({"resources": {"limits": {"cpu": "2500m"}, "requests": {"cpu": "1"}}}, True, 2),  # whole cores
        ({"resources": {"requests": {"cpu": 3}}}, True, 3),  # no limit: the request
        ({"resources": {"requests": {"cpu": "500m"}}}, True, 1),  # less than a core: still one
        ({"resources": {"limits": {"cpu": "8"}}}, False, 1),  # no shared state: one
        ({"processes": 2, "resources": {"limits": {"cpu": "8"}}}, True, 2),  # explicit wins
    ],
)
def test_frontend_processes_follow_the_pods_cpu(
    frontend: dict[str, Any], shared: bool, expected: int, tmp_path: Path
) -> None:
    fragment: dict[str, Any] = {"frontend": frontend}
    if shared:
        fragment["state"] = {"managed": {}}
    spec = AgentServingDeploymentSpec.model_validate(_drop_nones(merge(BASE, fragment)))
    assert component_config(build(spec, "coder", "ai"), "frontend", tmp_path).processes == expected


def test_frontend_processes_without_shared_state_are_refused() -> None:
    with pytest.raises(ValueError, match=r"frontend.processes > 1 needs shared state"):
        AgentServingDeploymentSpec.model_validate(merge(BASE, {"frontend": {"processes": 2}}))
