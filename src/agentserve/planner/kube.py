"""The cluster planner's Kubernetes edge: the few API calls it makes, each one in its Role.

Every call names the (group, resource, verb) it needs; `PlannerKube` refuses one that
`agentserve.planner.access.PLANNER_ACCESS` does not grant (the Role the operator creates is built
from the same table) and records the ones it made (`calls`), so tests can hold the Role to exactly
what is used. Requests go through the operator's `KubeCluster` plumbing (the official client's
`ApiClient`, one error type); the client is blocking, so the async planner calls it on a thread.

The pure part — the `Autoscaling` condition and the Event of a decision — is here too, next to the
calls that write them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from agentserve.operator.build import Target
from agentserve.operator.cluster import ClusterError, KubeCluster
from agentserve.operator.events import Note, event_object
from agentserve.operator.spec import AUTOSCALING_CONDITION, GROUP, KIND, PLURAL, VERSION
from agentserve.planner.access import allowed
from agentserve.planner.decide import Decision

FIELD_MANAGER = "agentserve-planner"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

# The first word of a decision's reason → the condition's CamelCase reason.
CONDITION_REASONS: dict[str, str] = {
    "min": "AtMinimum",
    "kv": "HoldingSessionKv",
    "targets": "MeetingTargets",
    "max": "TargetsUnmetAtMaximum",
    "queue": "RequestsQueued",
    "hold": "ScaleDownDelay",
    "down": "ScaledDown",
}


class PlannerKube:
    """The planner's calls on one AgentServingDeployment and its namespace."""

    def __init__(self, namespace: str, deployment: str, api_client: Any = None) -> None:
        self.namespace = namespace
        self.deployment = deployment
        self.cluster = KubeCluster(api_client, field_manager=FIELD_MANAGER)
        self.calls: set[tuple[str, str, str]] = set()

    def _call(self, verb: str, group: str, resource: str, method: str, path: str, **kwargs: Any) -> Any:
        if not allowed(group, resource, verb):
            raise ClusterError(f"the planner's Role grants no {verb} on {group or 'core'}/{resource}", 403)
        self.calls.add((group, resource, verb))
        return self.cluster.request(method, path, **kwargs)

    @property
    def _owner_path(self) -> str:
        ns, name = quote(self.namespace, safe=""), quote(self.deployment, safe="")
        return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}"

    def owner(self) -> dict[str, Any]:
        """The AgentServingDeployment (its spec.workers.replicas and status.conditions)."""
        return dict(self._call("get", GROUP, PLURAL, "GET", self._owner_path))

    def scale(self, replicas: int) -> None:
        """Write the worker count through the scale subresource (spec.workers.replicas)."""
        self._call(
            "patch",
            GROUP,
            f"{PLURAL}/scale",
            "PATCH",
            self._owner_path + "/scale",
            body={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
        )

    def set_condition(self, owner: Mapping[str, Any], condition: dict[str, Any]) -> None:
        """Server-side apply the planner's condition under its own field manager: conditions are a
        list-map keyed by type, so the operator's (applied under its manager) are left alone and a
        status the operator writes from an older read does not drop this one."""
        self._call(
            "patch",
            GROUP,
            f"{PLURAL}/status",
            "PATCH",
            self._owner_path + "/status",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body={
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "metadata": {"name": self.deployment, "namespace": self.namespace},
                "status": {"conditions": [condition]},
            },
            content_type="application/apply-patch+yaml",
        )

    def endpoint_slices(self, service: str) -> list[dict[str, Any]]:
        """The EndpointSlices of a Service in the namespace."""
        path = f"/apis/discovery.k8s.io/v1/namespaces/{quote(self.namespace, safe='')}/endpointslices"
        out = self._call(
            "list",
            "discovery.k8s.io",
            "endpointslices",
            "GET",
            path,
            query=[("labelSelector", f"{SERVICE_NAME_LABEL}={service}")],
        )
        return list((out or {}).get("items") or [])

    def set_deletion_cost(self, pod: str, cost: int) -> None:
        """Annotate a worker pod so the ReplicaSet removes the cheapest first on a scale-down."""
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods/{quote(pod, safe='')}"
        self._call(
            "patch",
            "",
            "pods",
            "PATCH",
            path,
            body={"metadata": {"annotations": {DELETION_COST: str(cost)}}},
            content_type="application/merge-patch+json",
        )

    def post_event(self, note: Note, uid: str | None, now: datetime) -> None:
        event = event_object(Target(self.deployment, self.namespace, uid), note, now)
        event["source"]["component"] = FIELD_MANAGER
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/events"
        self._call("create", "", "events", "POST", path, body=event, content_type="application/json")


# ------------------------------------------------------------------------------------------- pure


def conditions_of(owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in ((owner.get("status") or {}).get("conditions") or [])]


def desired_replicas(owner: Mapping[str, Any]) -> int:
    """spec.workers.replicas (the CRD's default when unset)."""
    workers = (owner.get("spec") or {}).get("workers") or {}
    return int(workers.get("replicas", 1))


def condition_reason(decision_reason: str) -> str:
    return CONDITION_REASONS.get(decision_reason.split(":", 1)[0], "Planned")


def decision_message(decision: Decision) -> str:
    p = decision.predicted
    observed = ""
    if decision.observed_ttft_s is not None or decision.observed_itl_s is not None:
        ttft = f"{decision.observed_ttft_s * 1e3:.0f} ms" if decision.observed_ttft_s is not None else "-"
        itl = f"{decision.observed_itl_s * 1e3:.0f} ms" if decision.observed_itl_s is not None else "-"
        observed = f"; observed TTFT {ttft}, ITL {itl}"
    return (
        f"{decision.desired} workers: {decision.reason} (predicted TTFT {p.ttft_s * 1e3:.0f} ms, "
        f"ITL {p.itl_s * 1e3:.0f} ms{observed}; KV floor {decision.kv_floor})"
    )


def planner_condition(
    previous: Mapping[str, Any] | None,
    *,
    ok: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> dict[str, Any]:
    """The `Autoscaling` condition; its transition time moves only when its status does."""
    status = "True" if ok else "False"
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        stamp = str(previous["lastTransitionTime"])
    condition: dict[str, Any] = {
        "type": AUTOSCALING_CONDITION,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": stamp,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def same_condition(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Whether `b` says what `a` says: status, reason, generation and the worker count (the message's
    head). The predictions in the rest of the message move every interval; writing the CR for each
    would churn every watcher of it."""
    if a is None:
        return False
    keys = ("status", "reason", "observedGeneration")
    head = str(a.get("message", "")).split(":", 1)[0], str(b.get("message", "")).split(":", 1)[0]
    return all(a.get(k) == b.get(k) for k in keys) and head[0] == head[1]


def scale_note(before: int, decision: Decision) -> Note:
    """The Event of a change of the worker count."""
    word = "ScaledUp" if decision.desired > before else "ScaledDown"
    if decision.reason.startswith("max"):
        return Note("Warning", word, f"{before} -> {decision_message(decision)}")
    return Note("Normal", word, f"{before} -> {decision_message(decision)}")
