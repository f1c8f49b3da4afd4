"""The spec model and the CRD generated from it: structure, drift, schema and CEL rules."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from pydantic import ValidationError

from agentserve.operator.crd import CRD_FILE, SchemaError, check_structural, crd, crd_yaml
from agentserve.operator.spec import (
    ROOT_RULES,
    AgentServingDeploymentSpec,
    AgentSpec,
    AutoscalingSpec,
    ChatTemplate,
    FrontendAutoscalingSpec,
    FrontendSpec,
    ModelSource,
    Rule,
    StateSpec,
    WorkersSpec,
)
from kubecheck import assert_valid, crd_schema_errors

ROOT = Path(__file__).resolve().parents[3]


def asd(spec: dict[str, Any], name: str = "coder") -> dict[str, Any]:
    return {
        "apiVersion": "agentserve.dev/v1alpha1",
        "kind": "AgentServingDeployment",
        "metadata": {"name": name, "namespace": "ai"},
        "spec": spec,
    }


MINIMAL = {
    "model": {"name": "Qwen/Qwen3-32B", "source": {"pvc": {"claimName": "models", "path": "qwen3-32b"}}}
}


def version() -> dict[str, Any]:
    versions: list[dict[str, Any]] = crd()["spec"]["versions"]
    return versions[0]


# ------------------------------------------------------------------------------------- the CRD


def test_crd_identity_names_and_subresources() -> None:
    obj = crd()
    assert obj["metadata"]["name"] == "agentservingdeployments.agentserve.dev"
    names = obj["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "AgentServingDeployment",
        "agentservingdeployments",
        ["asd"],
    )
    v = version()
    assert v["name"] == "v1alpha1" and v["served"] and v["storage"]
    assert v["subresources"]["status"] == {}
    assert v["subresources"]["scale"] == {
        "specReplicasPath": ".spec.workers.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in v["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.name"
    assert columns["Family"] == ".status.family"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Workers"] == ".status.workersReady"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_scale_paths_exist_in_the_schema() -> None:
    schema = version()["schema"]["openAPIV3Schema"]
    assert (
        schema["properties"]["spec"]["properties"]["workers"]["properties"]["replicas"]["type"] == "integer"
    )
    status = schema["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer"
    assert status["selector"]["type"] == "string"


def test_crd_is_a_valid_apiextensions_object() -> None:
    assert_valid([crd()])


def test_schema_is_structural() -> None:
    schema = version()["schema"]["openAPIV3Schema"]
    check_structural(schema)
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf" not in text and "title:" not in text


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
            "anyOf",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, r"\$ref"),
        ({"type": "object", "properties": {"a": {"description": "untyped"}}}, "needs a type"),
        (
            {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
            "mutually exclusive",
        ),
        ({"type": "array"}, "items"),
    ],
)
def test_structural_check_rejects_non_structural_nodes(node: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        check_structural(node)


def test_descriptions_camel_case_and_free_form_maps() -> None:
    spec = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    workers = spec["properties"]["workers"]
    assert "tensorParallelSize" in workers["properties"]
    assert "tensor_parallel_size" not in workers["properties"]
    assert workers["properties"]["tensorParallelSize"]["description"]
    options = workers["properties"]["llmApiOptions"]  # a map with free-form values (checked by the operator)
    assert options["additionalProperties"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert options["maxProperties"] == 128 and "x-kubernetes-preserve-unknown-fields" not in options
    assert workers["properties"]["env"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert workers["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert workers["properties"]["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert workers["properties"]["shmSize"]["x-kubernetes-int-or-string"] is True
    limits = workers["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"]["x-kubernetes-int-or-string"] is True
    family = spec["properties"]["model"]["properties"]["family"]
    assert family["nullable"] is True and family["type"] == "string"


def test_b200_defaults_are_in_the_schema() -> None:
    pool = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["nodePool"]
    assert pool["default"] == {}
    assert pool["properties"]["nodeSelector"]["default"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert pool["properties"]["tolerations"]["default"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pool["properties"]["gpuResource"]["default"] == "nvidia.com/gpu"


def test_committed_crd_matches_the_model() -> None:
    committed = (ROOT / "crds" / CRD_FILE).read_text(encoding="utf-8")
    assert committed == crd_yaml(), "crds/ drifted from agentserve.operator.spec: run scripts/generate"


def test_committed_chart_crd_template_matches_the_model() -> None:
    committed = (ROOT / "charts" / "agentserve" / "crds" / CRD_FILE).read_text(encoding="utf-8")
    assert committed == crd_yaml(), "the chart's CRD drifted: run scripts/generate"


def test_schema_accepts_valid_and_rejects_invalid_documents() -> None:
    assert crd_schema_errors(asd(MINIMAL)) == []
    bad = asd({**MINIMAL, "workers": {"tensorParallelSize": 16, "engine": "vllm", "replicas": "two"}})
    errors = "\n".join(crd_schema_errors(bad))
    assert "tensorParallelSize" in errors and "engine" in errors and "replicas" in errors
    unknown = asd({**MINIMAL, "workers": {"tensorParalelSize": 2}})
    assert any("tensorParalelSize" in e for e in crd_schema_errors(unknown))
    assert any("spec" in e for e in crd_schema_errors({**asd(MINIMAL), "spec": None}))


# ---------------------------------------------------------------------------------- CEL rules


def _rules_by_path() -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, rule))
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}" if path else name)

    walk(version()["schema"]["openAPIV3Schema"], "")
    return found


def _has_cel_type(schema: dict[str, Any]) -> bool:
    """Whether the apiserver gives a schema a CEL type (k8s.io/apiserver pkg/cel/common/schemas.go
    `SchemaDeclType`): untyped schemas (x-kubernetes-preserve-unknown-fields alone) have none, and a
    map or list of them has none either, so a rule that names such a field does not compile."""
    if schema.get("x-kubernetes-int-or-string"):
        return True
    kind = schema.get("type")
    if kind == "array":
        return "items" in schema and _has_cel_type(schema["items"])
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return _has_cel_type(schema["additionalProperties"])
    return kind is not None


def test_every_field_a_rule_names_has_a_cel_type() -> None:
    """celpy evaluates any rule; the real apiserver refuses the whole CRD when a rule names a field
    without a CEL type ("undefined field"). This caught a rule over llmApiOptions once."""
    schemas: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        schemas[path] = node
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}" if path else name)

    walk(version()["schema"]["openAPIV3Schema"], "")
    for path, rule in _rules_by_path():
        for field in re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)", rule["rule"]):
            sub = schemas[path].get("properties", {}).get(field)
            if sub is None:
                continue  # a metadata field at the root, always declared
            assert _has_cel_type(sub), f"rule at {path} names {field}, which has no CEL type: {rule['rule']}"


def _cel(rule: str, value: Any) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(rule))
    return bool(program.evaluate({"self": celpy.json_to_cel(value)}))


def _at(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in [p for p in path.split(".") if p]:
        node = node.get(part) if isinstance(node, dict) else None
    return node


# (rule owner, the object's spec, expected) — the same rule in CEL and in Python must agree.
_CPU = {"resources": {"requests": {"cpu": "2"}}}

CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("spec", MINIMAL, True),
    ("spec", {"model": {"name": "m"}}, False),
    ("spec", {"model": {"name": "m"}, "workers": {"engine": "sim"}}, True),
    ("spec", {**MINIMAL, "workers": {"kvCache": {"enableBlockReuse": False}}}, False),
    (
        "spec",
        {
            **MINIMAL,
            "router": {"policy": "least-loaded"},
            "workers": {"kvCache": {"enableBlockReuse": False}},
        },
        True,
    ),
    (
        "spec",
        {**MINIMAL, "router": {"policy": "kv"}, "workers": {"kvCache": {"enableBlockReuse": True}}},
        True,
    ),
    ("spec.model.source", {"model": {"name": "m", "source": {}}, "workers": {"engine": "sim"}}, False),
    (
        "spec.model.source",
        {"model": {"name": "m", "source": {"pvc": {"claimName": "a"}, "image": {"path": "/m"}}}},
        False,
    ),
    ("spec.model.source", {"model": {"name": "m", "source": {"hostPath": {"path": "/m"}}}}, True),
    (
        "spec.model.chatTemplate",
        {**MINIMAL, "model": {**MINIMAL["model"], "chatTemplate": {"inline": "x"}}},
        True,
    ),
    ("spec.model.chatTemplate", {**MINIMAL, "model": {**MINIMAL["model"], "chatTemplate": {}}}, False),
    (
        "spec.model.chatTemplate",
        {
            **MINIMAL,
            "model": {
                **MINIMAL["model"],
                "chatTemplate": {"inline": "x", "configMap": {"name": "t", "key": "k"}},
            },
        },
        False,
    ),
    ("spec.agent", {**MINIMAL, "agent": {"apis": ["anthropic"]}}, False),
    ("spec.agent", {**MINIMAL, "agent": {"apis": ["anthropic"], "codexCatalog": False}}, True),
    ("spec.agent", {**MINIMAL, "agent": {"apis": ["responses"]}}, True),
    ("spec.workers", {"model": {"name": "m"}, "workers": {"engine": "sim", "tensorParallelSize": 2}}, False),
    ("spec.workers", {"model": {"name": "m"}, "workers": {"engine": "sim", "gpusPerWorker": 1}}, False),
    ("spec.workers", {"model": {"name": "m"}, "workers": {"engine": "sim", "gpusPerWorker": 0}}, True),
    ("spec.workers", {**MINIMAL, "workers": {"tensorParallelSize": 8, "gpusPerWorker": 4}}, False),
    ("spec.workers", {**MINIMAL, "workers": {"tensorParallelSize": 4, "gpusPerWorker": 8}}, True),
    ("spec.workers", {**MINIMAL, "workers": {"tensorParallelSize": 8}}, True),
    ("spec.workers", {**MINIMAL, "workers": {"sim": {"profile": "h200-qwen3-30b-a3b-pytorch"}}}, False),
    (
        "spec.workers",
        {
            "model": {"name": "m"},
            "workers": {"engine": "sim", "sim": {"profile": "h200-qwen3-30b-a3b-pytorch"}},
        },
        True,
    ),
    ("spec", {**MINIMAL, "frontend": {"replicas": 2}}, False),
    ("spec", {**MINIMAL, "frontend": {"replicas": 1}}, True),
    ("spec", {**MINIMAL, "frontend": {"replicas": 3}, "state": {"managed": {}}}, True),
    ("spec", {**MINIMAL, "frontend": {"replicas": 3}, "state": {"urlSecret": {"name": "r"}}}, True),
    ("spec", {**MINIMAL, "frontend": {"replicas": 3}, "state": {"responseTtlSeconds": 60}}, False),
    ("spec.state", {**MINIMAL, "state": {"managed": {}, "urlSecret": {"name": "r"}}}, False),
    ("spec.state", {**MINIMAL, "state": {"managed": {"storage": "1Gi"}}}, True),
    ("spec.autoscaling", {**MINIMAL, "autoscaling": {"maxWorkers": 4}}, True),
    ("spec.autoscaling", {**MINIMAL, "autoscaling": {"minWorkers": 4, "maxWorkers": 4}}, True),
    ("spec.autoscaling", {**MINIMAL, "autoscaling": {"minWorkers": 5, "maxWorkers": 4}}, False),
    (
        "spec.autoscaling",
        {
            **MINIMAL,
            "autoscaling": {
                "maxWorkers": 4,
                "profile": "h200-qwen3-30b-a3b-pytorch",
                "profileConfigMap": {"name": "p", "key": "profile.yaml"},
            },
        },
        False,
    ),
    (
        "spec.autoscaling",
        {**MINIMAL, "autoscaling": {"maxWorkers": 4, "profileConfigMap": {"name": "p", "key": "y"}}},
        True,
    ),
    ("spec.frontend.autoscaling", {**MINIMAL, "frontend": {**_CPU, "autoscaling": {"maxReplicas": 1}}}, True),
    (
        "spec.frontend.autoscaling",
        {**MINIMAL, "frontend": {**_CPU, "autoscaling": {"minReplicas": 2, "maxReplicas": 1}}},
        False,
    ),
    ("spec.frontend", {**MINIMAL, "frontend": {**_CPU, "autoscaling": {"maxReplicas": 1}}}, True),
    ("spec.frontend", {**MINIMAL, "frontend": {"autoscaling": {"maxReplicas": 1}}}, False),
    (
        "spec.frontend",
        {
            **MINIMAL,
            "frontend": {"resources": {"requests": {"memory": "1Gi"}}, "autoscaling": {"maxReplicas": 1}},
        },
        False,
    ),
    ("spec", {**MINIMAL, "frontend": {**_CPU, "autoscaling": {"maxReplicas": 4}}}, False),
    (
        "spec",
        {**MINIMAL, "frontend": {**_CPU, "autoscaling": {"maxReplicas": 4}}, "state": {"managed": {}}},
        True,
    ),
]

_CLASS_OF: dict[str, type] = {
    "spec": AgentServingDeploymentSpec,
    "spec.autoscaling": AutoscalingSpec,
    "spec.frontend": FrontendSpec,
    "spec.frontend.autoscaling": FrontendAutoscalingSpec,
    "spec.model.source": ModelSource,
    "spec.model.chatTemplate": ChatTemplate,
    "spec.agent": AgentSpec,
    "spec.workers": WorkersSpec,
    "spec.state": StateSpec,
}


def test_every_cel_rule_has_cases() -> None:
    owners = {path for path, _ in _rules_by_path()} - {""}
    assert owners == set(_CLASS_OF)
    assert owners <= {owner for owner, _, _ in CASES}


@pytest.mark.parametrize(("owner", "spec", "expected"), CASES)
def test_cel_rules_and_python_rules_agree(owner: str, spec: dict[str, Any], expected: bool) -> None:
    obj = asd(spec)
    value = _at(obj, owner)
    rules = [r for path, r in _rules_by_path() if path == owner]
    assert rules
    cel_ok = all(_cel(r["rule"], value) for r in rules)
    assert cel_ok is expected
    # The apiserver evaluates CEL after defaulting: the verdict must not change with defaults filled in.
    try:
        defaulted = AgentServingDeploymentSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)
        python_ok = True
    except ValidationError:
        python_ok = False
    assert python_ok is expected
    if expected:
        value = _at({"spec": defaulted}, owner)
        assert all(_cel(r["rule"], value) for r in rules)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("coder", True), ("a", True), ("x" * 45, True), ("x" * 46, False), ("9lives", False), ("A", False)],
)
def test_root_rule_on_the_name(name: str, ok: bool) -> None:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (cel_rule,) = root["x-kubernetes-validations"]
    assert _cel(cel_rule["rule"], {"metadata": {"name": name}}) is ok
    # The error names the field (not `<nil>`), and the field exists in the schema as fieldPath needs.
    assert cel_rule["fieldPath"] == ".metadata.name"
    assert root["properties"]["metadata"] == {"type": "object", "properties": {"name": {"type": "string"}}}
    rule: Rule = ROOT_RULES[0]
    assert rule.check(name) is ok


# ------------------------------------------------------------------------------- the spec model


def test_spec_defaults_target_b200_and_trtllm() -> None:
    spec = AgentServingDeploymentSpec.model_validate(copy.deepcopy(MINIMAL))
    assert spec.workers.engine == "trtllm"
    assert spec.node_pool.node_selector == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert spec.node_pool.tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert spec.workers.kv_cache.tokens_per_block == 32
    assert spec.agent.apis == ["anthropic", "chat", "responses"]
    assert spec.resolved_gpus_per_worker() == 1


def test_snake_case_in_python_camel_case_in_yaml() -> None:
    spec = AgentServingDeploymentSpec.model_validate(
        {**MINIMAL, "workers": {"tensorParallelSize": 4, "kvCache": {"tokensPerBlock": 64}}}
    )
    assert spec.workers.tensor_parallel_size == 4
    dumped = spec.model_dump(mode="json")
    assert dumped["workers"]["tensorParallelSize"] == 4
    assert dumped["workers"]["kvCache"]["tokensPerBlock"] == 64


def test_llm_api_options_cannot_shadow_spec_fields() -> None:
    with pytest.raises(ValidationError, match="tensorParallelSize"):
        AgentServingDeploymentSpec.model_validate(
            {**MINIMAL, "workers": {"llmApiOptions": {"tensor_parallel_size": 2}}}
        )
    with pytest.raises(ValidationError, match="tokensPerBlock"):
        AgentServingDeploymentSpec.model_validate(
            {**MINIMAL, "workers": {"llmApiOptions": {"kv_cache_config": {"tokens_per_block": 64}}}}
        )
    ok = AgentServingDeploymentSpec.model_validate(
        {**MINIMAL, "workers": {"llmApiOptions": {"kv_cache_config": {"dtype": "fp8"}}}}
    )
    assert ok.workers.llm_api_options == {"kv_cache_config": {"dtype": "fp8"}}


def test_llm_api_options_are_refused_by_name_before_any_pod_starts() -> None:
    """Unknown keys fail at apply time (CEL for the top level; Python, i.e. the operator's InvalidSpec
    condition and `agentserve manifests`, also below kv_cache_config), not after the worker pulled its
    image and built LLM() hours later."""
    with pytest.raises(ValidationError, match=r"llmApiOptions\.enable_atention_dp: not an LLM\(\) argument"):
        AgentServingDeploymentSpec.model_validate(
            {**MINIMAL, "workers": {"llmApiOptions": {"enable_atention_dp": 1}}}
        )
    nested = {"kv_cache_config": {"dtype": "fp8", "free_gpu_mem_fraction": 0.8}}
    with pytest.raises(ValidationError, match=r"llmApiOptions\.kv_cache_config\.free_gpu_mem_fraction"):
        AgentServingDeploymentSpec.model_validate({**MINIMAL, "workers": {"llmApiOptions": nested}})
    off = {**MINIMAL, "workers": {"llmApiOptions": nested, "llmApiOptionsCheck": "off"}}
    assert AgentServingDeploymentSpec.model_validate(off).workers.llm_api_options == nested


def test_the_worker_and_the_examples_only_use_pinned_llm_args() -> None:
    """Every LLM() argument the TensorRT-LLM worker sets itself, and every option in examples/, is in
    the pinned list: the check never refuses what this project ships."""
    from agentserve.config import WorkerConfig
    from agentserve.operator.llm_args import KV_CACHE_CONFIG_FIELDS, LLM_ARGS_FIELDS, unknown_llm_api_options
    from agentserve.worker.engines.trtllm_mapping import llm_kwargs

    kwargs = llm_kwargs(WorkerConfig(engine="trtllm", model_path="/m", max_seq_len=4096, host_cache_size=1))
    assert set(kwargs) <= set(LLM_ARGS_FIELDS)
    assert set(kwargs["kv_cache_config"]) <= set(KV_CACHE_CONFIG_FIELDS)
    examples = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))
    seen = 0
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            options = ((doc or {}).get("spec") or {}).get("workers", {}).get("llmApiOptions")
            if options:
                seen += 1
                assert unknown_llm_api_options(options) == [], path.name
    assert seen >= 3


def test_generated_doc_sections_are_current() -> None:
    from agentserve.operator.docs import update

    text = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    assert update(text) == text, "docs/kubernetes.md is stale: run scripts/generate"


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if path.startswith(".metadata"):  # the apiserver forbids anything but name/generateName there
            return
        if path and "description" not in node:
            missing.append(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")
        items = node.get("items")
        if isinstance(items, dict):  # an array's items are described by the array itself
            for key, child in (items.get("properties") or {}).items():
                walk(child, f"{path}[].{key}")

    walk(version()["schema"]["openAPIV3Schema"], "")
    assert missing == []


def test_family_and_parser_fields_are_enums_of_the_registry() -> None:
    from agentserve.families import FAMILIES, family_names

    props = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    family = props["model"]["properties"]["family"]
    assert family["enum"] == list(family_names())
    assert {f.name for f in FAMILIES} <= set(family["enum"])
    assert {"qwen3_coder", "qwen3-coder", "hermes", "harmony"} <= set(family["enum"])
    for field in ("reasoningParser", "toolCallParser"):
        assert props["agent"]["properties"][field]["enum"] == family["enum"]
    with pytest.raises(ValidationError, match="unknown model family 'nope'"):
        AgentServingDeploymentSpec.model_validate(
            {"model": {"name": "m", "family": "nope"}, "workers": {"engine": "sim"}}
        )
