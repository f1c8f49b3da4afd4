"""`agentserve manifests -f asd.yaml`: the objects the operator would create, as a YAML stream.

A dry run like `helm template`: each `AgentServingDeployment` document is validated the way the
apiserver and the operator validate it (the spec model the CRD is generated from, with its
cross-field rules), and errors name the field in the CR's own camelCase terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from agentserve.operator.build import build
from agentserve.operator.crd import dump_yaml_stream
from agentserve.operator.spec import API_VERSION, KIND, ROOT_RULES, AgentServingDeploymentSpec

_TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec", "status"}


class ManifestError(ValueError):
    """An invalid input document; the message names the document and the field."""


@dataclass(frozen=True)
class Resource:
    name: str
    namespace: str
    spec: AgentServingDeploymentSpec
    uid: str | None = None


def format_validation_error(exc: ValidationError, prefix: str = "spec") -> list[str]:
    """`spec.workers.tensorParallelSize: Input should be ≤ 8` — one line per error, CR field names."""
    lines = []
    for error in exc.errors():
        path = prefix
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}")
    return lines


def parse_spec(spec: Any) -> AgentServingDeploymentSpec:
    """A validated spec, or ManifestError listing every invalid field."""
    if not isinstance(spec, dict):
        raise ManifestError("spec: must be a mapping")
    try:
        return AgentServingDeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        raise ManifestError("\n".join(format_validation_error(exc))) from None


def parse_resource(doc: Any, default_namespace: str = "default") -> Resource:
    if not isinstance(doc, dict):
        raise ManifestError("document: must be a mapping (an AgentServingDeployment)")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise ManifestError(
            f"apiVersion/kind: expected {API_VERSION} {KIND}, got {doc.get('apiVersion')} {doc.get('kind')}"
        )
    unknown = sorted(set(doc) - _TOP_LEVEL)
    if unknown:
        raise ManifestError(f"{unknown[0]}: unknown field (expected {', '.join(sorted(_TOP_LEVEL))})")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ManifestError("metadata.name: required")
    name: str = meta["name"]
    for rule in ROOT_RULES:
        if not rule.check(name):
            raise ManifestError(f"metadata.name: {rule.message}")
    namespace = meta.get("namespace") or default_namespace
    if "spec" not in doc:
        raise ManifestError("spec: required")
    return Resource(name, str(namespace), parse_spec(doc["spec"]), meta.get("uid"))


def load_resources(text: str, default_namespace: str = "default", source: str = "<input>") -> list[Resource]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: not YAML: {exc}") from None
    if not docs:
        raise ManifestError(f"{source}: no AgentServingDeployment found")
    resources = []
    for index, doc in enumerate(docs):
        try:
            resources.append(parse_resource(doc, default_namespace))
        except ManifestError as exc:
            where = f"{source}" if len(docs) == 1 else f"{source} (document {index + 1})"
            raise ManifestError("\n".join(f"{where}: {line}" for line in str(exc).splitlines())) from None
    return resources


def render(text: str, default_namespace: str = "default", source: str = "<input>") -> str:
    """The YAML stream of every object the operator would create for the input's resources."""
    objects: list[dict[str, Any]] = []
    for res in load_resources(text, default_namespace, source):
        objects += build(res.spec, res.name, res.namespace, res.uid)
    return dump_yaml_stream(objects)
