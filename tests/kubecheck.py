"""Offline validation of Kubernetes objects, shared by the operator and chart tests.

Built-in kinds are validated with `kubernetes-validate` (the API's published JSON schemas, strict:
unknown fields fail like `kubectl apply --validate=strict`). AgentServingDeployments are validated
against our own CRD schema (translated from OpenAPI v3 to JSON Schema draft 4). ServiceMonitor has no
published schema there, so it gets a focused check of the fields prometheus-operator requires.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate

KUBERNETES_VERSION = "1.31.0"


def openapi_to_jsonschema(node: dict[str, Any]) -> dict[str, Any]:
    """Draft-4 JSON Schema with the apiserver's strictness: unknown fields are errors."""
    out = copy.deepcopy(node)
    out.pop("x-kubernetes-validations", None)
    if out.pop("x-kubernetes-int-or-string", False):
        out["type"] = ["integer", "string"]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if "properties" in out:
        out["properties"] = {k: openapi_to_jsonschema(v) for k, v in out["properties"].items()}
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = openapi_to_jsonschema(out["additionalProperties"])
    if "items" in out:
        out["items"] = openapi_to_jsonschema(out["items"])
    return out


@cache
def _crd_validator() -> jsonschema.Draft4Validator:
    from agentserve.operator.crd import crd

    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    converted = openapi_to_jsonschema(schema)
    converted["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft4Validator(converted)


def crd_schema_errors(obj: dict[str, Any]) -> list[str]:
    """Errors of an AgentServingDeployment against the CRD's structural schema (not CEL)."""
    return [
        "/".join(str(p) for p in e.absolute_path) + ": " + e.message
        for e in _crd_validator().iter_errors(obj)
    ]


def _service_monitor_errors(obj: dict[str, Any]) -> list[str]:
    errors = []
    spec = obj.get("spec") or {}
    if not isinstance(spec.get("selector"), dict):
        errors.append("spec.selector: required")
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        errors.append("spec.endpoints: required")
    else:
        for i, endpoint in enumerate(endpoints):
            if not (endpoint.get("port") or endpoint.get("targetPort")):
                errors.append(f"spec.endpoints[{i}]: port or targetPort required")
    if not (obj.get("metadata") or {}).get("name"):
        errors.append("metadata.name: required")
    return errors


def _prometheus_rule_errors(obj: dict[str, Any]) -> list[str]:
    """A PrometheusRule: named groups of rules, each an alert or a record with an expression (the
    expressions themselves are promtool's to check: tests/ops)."""
    errors = []
    groups = (obj.get("spec") or {}).get("groups")
    if not isinstance(groups, list) or not groups:
        return ["spec.groups: required"]
    for i, group in enumerate(groups):
        if not group.get("name"):
            errors.append(f"spec.groups[{i}].name: required")
        for j, rule in enumerate(group.get("rules") or []):
            if bool(rule.get("alert")) == bool(rule.get("record")):
                errors.append(f"spec.groups[{i}].rules[{j}]: exactly one of alert and record")
            if not isinstance(rule.get("expr"), str | int) or rule.get("expr") == "":
                errors.append(f"spec.groups[{i}].rules[{j}].expr: required")
    if not (obj.get("metadata") or {}).get("name"):
        errors.append("metadata.name: required")
    return errors


def _peering_errors(obj: dict[str, Any]) -> list[str]:
    """kopf's peering objects (charts/agentserve/crds/kopf-peering.yaml): a name, nothing but status."""
    errors = []
    if obj.get("kind") not in ("ClusterKopfPeering", "KopfPeering"):
        errors.append(f"kind {obj.get('kind')!r} is not a kopf.dev peering kind")
    extra = set(obj) - {"apiVersion", "kind", "metadata", "status"}
    if extra:
        errors.append(f"unknown fields {sorted(extra)}")
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        errors.append("metadata.name: required")
    if obj.get("kind") == "KopfPeering" and not meta.get("namespace"):
        errors.append("metadata.namespace: required for a KopfPeering")
    return errors


def _leader_worker_set_errors(obj: dict[str, Any], version: str) -> list[str]:
    """A LeaderWorkerSet (sigs.k8s.io/lws v1): the group shape its CRD requires, and both pod templates
    against the published PodTemplate schema (strict), since that is what reaches the kubelet."""
    name = (obj.get("metadata") or {}).get("name")
    lwt = (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}
    errors = []
    if not name:
        errors.append("metadata.name: required")
    if not (isinstance(lwt.get("size"), int) and lwt["size"] >= 1):
        errors.append("spec.leaderWorkerTemplate.size: an integer >= 1 required")
    if lwt.get("restartPolicy") not in (None, "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"):
        errors.append(f"spec.leaderWorkerTemplate.restartPolicy: {lwt.get('restartPolicy')!r}")
    if (obj.get("spec") or {}).get("startupPolicy") not in (None, "LeaderCreated", "LeaderReady"):
        errors.append("spec.startupPolicy: LeaderCreated or LeaderReady")
    for key in ("leaderTemplate", "workerTemplate"):
        if key not in lwt:
            if key == "workerTemplate":
                errors.append("spec.leaderWorkerTemplate.workerTemplate: required")
            continue
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{key}"}}
        template["template"] = lwt[key]
        errors += [f"LeaderWorkerSet/{name} {key}: {e}" for e in validation_errors(template, version)]
    return errors


def validation_errors(obj: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    api_version = str(obj.get("apiVersion", ""))
    if api_version == "leaderworkerset.x-k8s.io/v1":
        return _leader_worker_set_errors(obj, version)
    if api_version == "kopf.dev/v1":
        return _peering_errors(obj)
    if api_version.startswith("agentserve.dev/"):
        return crd_schema_errors(obj)
    if api_version.startswith("monitoring.coreos.com/") and obj.get("kind") == "PrometheusRule":
        return _prometheus_rule_errors(obj)
    if api_version.startswith("monitoring.coreos.com/"):
        return _service_monitor_errors(obj)
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return [f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}: {path}: {exc.message}"]
    return []


def assert_valid(objects: list[dict[str, Any]], version: str = KUBERNETES_VERSION) -> None:
    errors = [e for obj in objects for e in validation_errors(obj, version)]
    assert not errors, "\n".join(errors)
