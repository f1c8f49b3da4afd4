"""Reconcile logic, pure: desired vs observed children → actions, and observed children → status.

`plan` decides which desired objects to (re-)apply — missing ones, and ones whose fields we own were
changed by hand (drift) — and which observed children to delete (no longer desired, e.g. a disabled
ServiceMonitor). `signing_secret_to_create` is the one object made differently: the frontends'
signing-key Secret is created where none exists and never applied, so its key outlives every
reconcile, spec change and restart. `compute_status` turns the children's status into the CR's status: counts,
`observedGeneration`, and conditions `Ready`, `FrontendReady`, `RouterReady`, `WorkersReady` whose
reasons and messages come from the Deployments and their pods. No I/O: `handlers` does that.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentserve.keyfile import encode_key, fingerprint
from agentserve.operator.build import (
    COMPONENTS,
    L_COMPONENT,
    L_INSTANCE,
    PREFILL,
    Component,
    Target,
    object_meta,
    resolved_family,
    signing_key_source,
    spans_nodes,
    worker_selector,
)
from agentserve.operator.spec import AUTOSCALING_CONDITION, GROUP, AgentServingDeploymentSpec

CONDITION_OF: dict[Component, str] = {
    "frontend": "FrontendReady",
    "router": "RouterReady",
    "worker": "WorkersReady",
}
STATUS_KEY: dict[Component, str] = {"frontend": "frontend", "router": "router", "worker": "workers"}
# The prefill pool (spec.workers.prefill), when the spec has one: a condition and counts of its own.
PREFILL_CONDITION = "PrefillWorkersReady"
PREFILL_STATUS_KEY = "prefillWorkers"
# The conditions the operator writes (others on the CR are another writer's: the planner's).
OPERATOR_CONDITIONS = frozenset({"Ready", *CONDITION_OF.values(), PREFILL_CONDITION})


@dataclass(frozen=True, order=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def ref(obj: Mapping[str, Any]) -> ObjectRef:
    meta = obj.get("metadata") or {}
    return ObjectRef(
        str(obj["apiVersion"]), str(obj["kind"]), str(meta.get("namespace", "")), str(meta["name"])
    )


def _empty(value: Any) -> bool:
    """A value the apiserver stores as "absent": Go's `omitempty` drops nil, empty strings, lists and
    maps, and zero values — `false` and `0` (e.g. a Service's `publishNotReadyAddresses: false`
    never comes back), so a desired zero value is satisfied by a missing field."""
    if value is None or value is False:
        return True
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, dict):
        return all(_empty(v) for v in value.values())
    return isinstance(value, list | str) and len(value) == 0


def is_subset(desired: Any, observed: Any) -> bool:
    """Whether every field we set is present and equal in what the apiserver holds.

    The apiserver adds defaults (so only our fields are compared), drops empty values, and prints
    quantities and ports as strings or numbers: `8` and `"8"` are the same value here.
    """
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return _empty(desired) and _empty(observed)
        return all(
            is_subset(value, observed.get(key)) if key in observed else _empty(value)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(observed, list):
            return _empty(desired) and _empty(observed)
        return len(desired) == len(observed) and all(
            is_subset(d, o) for d, o in zip(desired, observed, strict=True)
        )
    if isinstance(desired, bool) or isinstance(observed, bool):
        return desired is observed
    numbers = (isinstance(desired, int | float), isinstance(observed, int | float))
    strings = (isinstance(desired, str), isinstance(observed, str))
    if (numbers[0] and strings[1]) or (strings[0] and numbers[1]):
        return str(desired) == str(observed)
    return bool(desired == observed)


@dataclass
class Plan:
    apply: list[dict[str, Any]] = field(default_factory=list)
    delete: list[ObjectRef] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.apply and not self.delete


def plan(desired: Iterable[dict[str, Any]], observed: Iterable[Mapping[str, Any]]) -> Plan:
    """Apply what is missing or drifted; delete observed children that are no longer desired."""
    by_ref = {ref(o): o for o in observed}
    result = Plan()
    wanted = set()
    for obj in desired:
        key = ref(obj)
        wanted.add(key)
        current = by_ref.get(key)
        if current is None or not is_subset(obj, current):
            result.apply.append(obj)
    result.delete = sorted(r for r in by_ref if r not in wanted)
    return result


# ----------------------------------------------------------------------------------- signing key

SIGNING_FINGERPRINT_ANNOTATION = f"{GROUP}/signing-key-fingerprint"


def signing_secret_to_create(
    spec: AgentServingDeploymentSpec, target: Target, new_key: Callable[[], bytes]
) -> dict[str, Any] | None:
    """The Secret with the frontends' signing key, when the operator manages it; None when the spec
    names its own (auth.signingKeySecret).

    The caller creates it only if no Secret of its name exists (a create, which the apiserver refuses
    for an existing name; never an apply), so the first key made is the one every replica and restart
    reads. `new_key` supplies the key (random bytes in the operator), keeping this function pure; it is
    called only when a Secret is wanted. Immutable: nobody edits a key in place, rotation replaces the
    Secret (docs/kubernetes.md). The annotation carries the key's fingerprint (what frontends log and
    `/ready` shows), never the key.
    """
    if spec.auth.signing_key_secret is not None:
        return None
    name, data_key = signing_key_source(spec, target)
    key = new_key()
    meta = object_meta(target, name, "frontend")
    meta["annotations"] = {SIGNING_FINGERPRINT_ANNOTATION: fingerprint(key)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "immutable": True,
        "data": {data_key: base64.b64encode(encode_key(key).encode("ascii")).decode("ascii")},
    }


# ------------------------------------------------------------------------------------------ status


@dataclass(frozen=True)
class Verdict:
    ready: bool
    reason: str
    message: str


_POD_WAITING_REASONS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


def _pod_problem(pods: Iterable[Mapping[str, Any]]) -> Verdict | None:
    """The most telling reason a component's pods are not ready (scheduling, images, crashes)."""
    for pod in pods:
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                name = (pod.get("metadata") or {}).get("name", "?")
                return Verdict(
                    False, cond.get("reason") or "Unschedulable", f"pod {name}: {cond.get('message', '')}"
                )
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _POD_WAITING_REASONS:
                name = (pod.get("metadata") or {}).get("name", "?")
                return Verdict(
                    False, waiting["reason"], f"pod {name}: {waiting.get('message', waiting['reason'])}"
                )
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if last.get("reason") == "OOMKilled":
                name = (pod.get("metadata") or {}).get("name", "?")
                return Verdict(False, "OOMKilled", f"pod {name}: container {cs.get('name')} was OOM-killed")
    return None


def component_verdict(deployment: Mapping[str, Any] | None, pods: list[Mapping[str, Any]]) -> Verdict:
    if deployment is None:
        return Verdict(False, "NotCreated", "the Deployment does not exist yet")
    name = deployment["metadata"]["name"]
    desired = int((deployment.get("spec") or {}).get("replicas", 1))
    status = deployment.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    generation = (deployment.get("metadata") or {}).get("generation")
    if desired == 0:
        return Verdict(False, "ScaledToZero", f"Deployment {name} has 0 replicas")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False":
        return Verdict(
            False, progressing.get("reason") or "ProgressDeadlineExceeded", progressing.get("message", "")
        )
    failure = conditions.get("ReplicaFailure") or {}
    if failure.get("status") == "True":
        return Verdict(False, failure.get("reason") or "ReplicaFailure", failure.get("message", ""))
    if generation is not None and int(status.get("observedGeneration") or 0) < int(generation):
        return Verdict(False, "RolloutPending", f"Deployment {name} has not observed its latest spec yet")
    if ready >= desired and updated >= desired:
        return Verdict(True, "PodsReady", f"{ready}/{desired} pods ready")
    problem = _pod_problem(p for p in pods if not _pod_ready(p))
    if problem is not None:
        return problem
    if updated < desired and int(status.get("replicas") or 0) > updated:  # old pods still around
        return Verdict(False, "RollingUpdate", f"{updated}/{desired} pods updated, {ready}/{desired} ready")
    return Verdict(False, "PodsNotReady", f"{ready}/{desired} pods ready")


def group_as_deployment(group: Mapping[str, Any]) -> dict[str, Any]:
    """A LeaderWorkerSet's counts in a Deployment's shape (a group is one replica), for the worker
    verdict. Its conditions are not carried: an LWS says Progressing=False once it has settled, where
    a Deployment means its rollout is stuck."""
    meta = group.get("metadata") or {}
    status = group.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {k: meta[k] for k in ("name", "labels", "generation") if k in meta},
        "spec": {"replicas": int((group.get("spec") or {}).get("replicas", 1))},
        "status": {
            "replicas": int(status.get("replicas") or 0),
            "readyReplicas": ready,
            "updatedReplicas": int(status.get("updatedReplicas") or 0),
            "availableReplicas": ready,
            "observedGeneration": int(status.get("observedGeneration") or 0),
        },
    }


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _counts(deployment: Mapping[str, Any] | None) -> dict[str, int]:
    if deployment is None:
        return {"replicas": 0, "readyReplicas": 0, "updatedReplicas": 0, "availableReplicas": 0}
    status = deployment.get("status") or {}
    return {
        "replicas": int((deployment.get("spec") or {}).get("replicas", 1)),
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "updatedReplicas": int(status.get("updatedReplicas") or 0),
        "availableReplicas": int(status.get("availableReplicas") or 0),
    }


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    kind: str,
    verdict: Verdict,
    generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
    now: datetime,
) -> dict[str, Any]:
    status = "True" if verdict.ready else "False"
    before = previous.get(kind) or {}
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    cond: dict[str, Any] = {
        "type": kind,
        "status": status,
        "reason": verdict.reason,
        "message": verdict.message[:32768],
        "lastTransitionTime": since or _timestamp(now),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


@dataclass(frozen=True)
class Failure:
    """Why the last reconcile could not finish: InvalidSpec or ReconcileError."""

    reason: str
    message: str


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def compute_status(
    *,
    target: Target,
    generation: int | None,
    spec: AgentServingDeploymentSpec | None,
    deployments: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    previous: Mapping[str, Any] | None,
    failure: Failure | None,
    now: datetime,
) -> dict[str, Any]:
    """The CR's status from its children (and the failure of this reconcile, if any)."""
    deployments, pods = list(deployments), list(pods)  # each read more than once
    by_component: dict[str, Mapping[str, Any]] = {}
    for deployment in deployments:
        component = ((deployment.get("metadata") or {}).get("labels") or {}).get(L_COMPONENT)
        name = deployment["metadata"]["name"]
        # Workers spanning nodes are a LeaderWorkerSet (`group_as_deployment`) of another name.
        if component in COMPONENTS and (name == target.child(component) or name == target.worker_group):
            by_component[component] = deployment
    pods_of: dict[str, list[Mapping[str, Any]]] = {c: [] for c in COMPONENTS}
    for pod in pods:
        pod_labels = (pod.get("metadata") or {}).get("labels") or {}
        if pod_labels.get(L_INSTANCE) == target.name and pod_labels.get(L_COMPONENT) in pods_of:
            pods_of[pod_labels[L_COMPONENT]].append(pod)

    old = {c.get("type", ""): c for c in (previous or {}).get("conditions") or []}
    verdicts = {STATUS_KEY[c]: component_verdict(by_component.get(c), pods_of[c]) for c in COMPONENTS}
    prefill: Mapping[str, Any] | None = None
    if spec is not None and spec.workers.prefill is not None:
        prefill = next((d for d in deployments if d["metadata"]["name"] == target.prefill_workers), None)
        prefill_pods = [
            p
            for p in pods
            if _labels(p).get(L_INSTANCE) == target.name and _labels(p).get(L_COMPONENT) == PREFILL
        ]
        verdicts[PREFILL_STATUS_KEY] = component_verdict(prefill, prefill_pods)
    if failure is not None:
        overall = Verdict(False, failure.reason, failure.message)
    elif all(v.ready for v in verdicts.values()):
        overall = Verdict(True, "AllComponentsReady", f"{', '.join(verdicts)} are ready")
    else:
        waiting = [f"{key}: {v.reason}: {v.message}" for key, v in verdicts.items() if not v.ready]
        overall = Verdict(False, "ComponentsNotReady", "; ".join(waiting))
    conditions = [_condition("Ready", overall, generation, old, now)]
    conditions += [
        _condition(CONDITION_OF[c], verdicts[STATUS_KEY[c]], generation, old, now) for c in COMPONENTS
    ]
    if PREFILL_STATUS_KEY in verdicts:
        conditions.append(_condition(PREFILL_CONDITION, verdicts[PREFILL_STATUS_KEY], generation, old, now))
    # The planner's `Autoscaling` is its own: status is written by server-side apply, so the list
    # written here leaves it alone (`stale_conditions` says when it must go).

    status: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
    for c in COMPONENTS:
        status[STATUS_KEY[c]] = _counts(by_component.get(c))
    if PREFILL_STATUS_KEY in verdicts:
        status[PREFILL_STATUS_KEY] = _counts(prefill)
    workers = status["workers"]
    worker_deployment = by_component.get("worker") or {}
    status["replicas"] = int((worker_deployment.get("status") or {}).get("replicas") or 0)
    status["selector"] = worker_selector(target.name, groups=spec is not None and spans_nodes(spec))
    status["workersReady"] = f"{workers['readyReplicas']}/{workers['replicas']}"
    status["endpoint"] = target.frontend_url
    if spec is not None:
        status["family"] = resolved_family(spec) or "unknown"
    if generation is None:
        del status["observedGeneration"]
    return status


def stale_conditions(
    spec: AgentServingDeploymentSpec | None, previous: Mapping[str, Any] | None
) -> list[str]:
    """Conditions another writer set that no longer apply, to remove: the planner's once the spec
    asks for no autoscaling (its Deployment goes, so it cannot clear its own)."""
    present = {c.get("type") for c in (previous or {}).get("conditions") or []}
    if spec is not None and spec.autoscaling is None and AUTOSCALING_CONDITION in present:
        return [AUTOSCALING_CONDITION]
    return []
