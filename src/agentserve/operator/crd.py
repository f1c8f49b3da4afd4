"""The CRD, generated from `agentserve.operator.spec`: `agentserve crd` prints it.

pydantic emits JSON Schema (draft 2020-12, with `$ref`s and `anyOf` null unions); Kubernetes wants a
*structural* OpenAPI v3 schema: every node typed, no references, `nullable` instead of null unions,
boolean `exclusiveMinimum`, no `additionalProperties` next to `properties`. `structural()` does that
translation; `check_structural()` verifies the result so a new field type cannot slip through.

`crds/agentserve.dev_agentservingdeployments.yaml` and the Helm chart's CRD template are written by
`scripts/generate` from `crd_yaml()` (into crds/ and the chart's crds/); tests fail when they drift.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from agentserve.operator.spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    ROOT_RULES,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    AgentServingDeploymentSpec,
    AgentServingDeploymentStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"{GROUP}_{PLURAL}.yaml"

_DROP = {"title", "additionalProperties", "$defs", "discriminator"}


class SchemaError(ValueError):
    pass


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model (camelCase names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = raw.get("$defs", {})
    return _convert(raw, defs)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) != 1:
            raise SchemaError(f"union of several types cannot be structural: {node['anyOf']}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        merged = _convert({**options[0], **rest}, defs)
        if nullable:
            merged["nullable"] = True
            if merged.get("default", "") is None:
                del merged["default"]
        return merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "minLength" and value == 0:
            continue
        else:
            out[key] = value
    extra = node.get("additionalProperties")
    if (
        isinstance(extra, dict)
        and "properties" not in node
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = _convert(extra, defs)
    if out.get("type") == "object" and "properties" in out and isinstance(out.get("default"), dict):
        # Nested objects default to {}: the apiserver then fills their own fields' defaults.
        out["default"] = {}
    if out.get("type") == "array" and out.get("default") == []:
        del out["default"]
    if out.get("type") == "object" and out.get("default") == {} and "properties" not in out:
        del out["default"]
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"])
    return out


def _enum_type(values: list[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) for v in values):
        return "integer"
    return "string"


def check_structural(node: dict[str, Any], path: str = "") -> None:
    """Raise SchemaError where `node` breaks Kubernetes' structural-schema rules."""
    for key in ("$ref", "anyOf", "oneOf", "allOf", "not", "$defs", "definitions"):
        if key in node:
            raise SchemaError(f"{path or '.'}: {key} is not allowed in a structural schema")
    free = node.get("x-kubernetes-preserve-unknown-fields") is True
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    if "type" not in node and not (free or int_or_string):
        raise SchemaError(f"{path or '.'}: every node needs a type")
    if "properties" in node and "additionalProperties" in node:
        raise SchemaError(f"{path}: properties and additionalProperties are mutually exclusive")
    if node.get("additionalProperties") is False or node.get("additionalProperties") is True:
        raise SchemaError(f"{path}: additionalProperties must be a schema")
    for name, sub in node.get("properties", {}).items():
        check_structural(sub, f"{path}.{name}")
    if "items" in node:
        check_structural(node["items"], f"{path}[]")
    elif node.get("type") == "array":
        raise SchemaError(f"{path}: arrays need items")
    if isinstance(node.get("additionalProperties"), dict):
        check_structural(node["additionalProperties"], f"{path}{{}}")


def openapi_schema() -> dict[str, Any]:
    spec = structural(AgentServingDeploymentSpec)
    status = structural(AgentServingDeploymentStatus)
    status.pop("description", None)
    return {
        "type": "object",
        "description": "AgentServingDeployment serves one model to AI agents: frontend, KV-aware router "
        "and workers.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "versioned schema of this object: agentserve.dev/v1alpha1",
            },
            "kind": {"type": "string", "description": "AgentServingDeployment"},
            # Only `name`/`generateName` may appear under the root's metadata, and nothing else (not even a
            # description: the apiserver refuses the CRD). `name` is declared so the root rule's
            # fieldPath can point at it: its error then names metadata.name instead of `<nil>`.
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec,
            "status": {**status, "description": "observed state, written by the operator"},
        },
        "x-kubernetes-validations": [
            {
                "rule": r.cel,
                "message": r.message,
                "fieldPath": ".metadata.name",
                "reason": "FieldValueInvalid",
            }
            for r in ROOT_RULES
        ],
    }


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Family", "type": "string", "jsonPath": ".status.family"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Workers", "type": "string", "jsonPath": ".status.workersReady"},
    {"name": "Engine", "type": "string", "jsonPath": ".spec.workers.engine", "priority": 1},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
    {
        "name": "Scaling",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Autoscaling")].reason',
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    schema = openapi_schema()
    check_structural(schema)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "agentserve", "app.kubernetes.io/part-of": "agentserve"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["agentserve", "all"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.workers.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


_HEADER = "# Generated from agentserve.operator.spec by scripts/generate; do not edit.\n"


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value.rstrip("\n") or (value.endswith("\n") and len(value) > 1) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_NoAliasDumper.add_representer(str, _str)


def dump_yaml(obj: Any) -> str:
    """YAML in the order written (no anchors: shared sub-objects are repeated)."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=100)


def dump_yaml_stream(objs: list[dict[str, Any]]) -> str:
    return "".join("---\n" + dump_yaml(o) for o in objs)


def crd_yaml() -> str:
    return _HEADER + dump_yaml(crd())


__all__ = [
    "API_VERSION",
    "CRD_FILE",
    "CRD_NAME",
    "check_structural",
    "crd",
    "crd_yaml",
    "dump_yaml",
    "dump_yaml_stream",
]
