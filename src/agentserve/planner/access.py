"""What the cluster planner may do on the Kubernetes API: one table, read by both sides.

The operator turns `PLANNER_ACCESS` into the planner's Role (`role_rules`), and the planner's client
(`agentserve.planner.kube`) refuses any call the table does not list and records the ones it makes,
so the Role is exactly what the planner uses: a new call without a rule fails in every test, and the
e2e suite checks that every rule was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Access:
    group: str  # API group ("" is core)
    resource: str  # plural, with /subresource
    verbs: tuple[str, ...]
    # True: only the planner's own AgentServingDeployment (resourceNames); list/create cannot be
    # narrowed by name (the apiserver authorizes them before an object exists).
    own_object_only: bool = False
    why: str = ""


PLANNER_ACCESS: tuple[Access, ...] = (
    Access(
        "agentserve.dev",
        "agentservingdeployments",
        ("get",),
        own_object_only=True,
        why="the replicas it last asked for and its condition",
    ),
    Access(
        "agentserve.dev",
        "agentservingdeployments/scale",
        ("patch",),
        own_object_only=True,
        why="the worker count, through the scale subresource (as an HPA would)",
    ),
    Access(
        "agentserve.dev",
        "agentservingdeployments/status",
        ("patch",),
        own_object_only=True,
        why="the Autoscaling condition",
    ),
    Access(
        "discovery.k8s.io",
        "endpointslices",
        ("list",),
        why="the ready worker, frontend and router pods whose metrics it reads",
    ),
    Access(
        "",
        "pods",
        ("patch",),
        why="controller.kubernetes.io/pod-deletion-cost on workers, so a scale-down removes the "
        "one whose retained sessions are cheapest to lose",
    ),
    Access("", "events", ("create",), why="an Event for every change of the worker count"),
)


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(a.group == group and a.resource == resource and verb in a.verbs for a in PLANNER_ACCESS)


def role_rules(deployment: str) -> list[dict[str, Any]]:
    """The planner Role's rules for the AgentServingDeployment named `deployment`."""
    rules: list[dict[str, Any]] = []
    for access in PLANNER_ACCESS:
        rule: dict[str, Any] = {
            "apiGroups": [access.group],
            "resources": [access.resource],
            "verbs": list(access.verbs),
        }
        if access.own_object_only:
            rule["resourceNames"] = [deployment]
        rules.append(rule)
    return rules
