"""The planner on a real control plane: the operator deploys it for a CR with `autoscaling`, and the
planner scales the KWOK-backed workers through the scale subresource.

The planner runs here in the test process with the token of the ServiceAccount the operator created
(so its Role is what is tested), the configuration the operator rendered into the ConfigMap, and the
real EndpointSlices of the worker, frontend and router Services. KWOK pods run no process, so one
thing is a stand-in: the metrics the planner would fetch from the pods (`ScriptedFleet.fetch` answers
each worker's GET /load and each frontend's and router's GET /metrics from a scripted load).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from k8s_e2e import ROOT, Kube, Operator, condition, wait_for

from agentserve.config import PlannerServiceConfig
from agentserve.operator.spec import AUTOSCALING_CONDITION
from agentserve.planner.access import PLANNER_ACCESS, role_rules
from agentserve.planner.fleet import FleetReader, slice_discovery
from agentserve.planner.kube import DELETION_COST, PlannerKube
from agentserve.planner.service import ClusterPlanner
from agentserve.worker.profiles import load_profile

NS = "planning"
NAME = "elastic"
WORKERS = "app.kubernetes.io/instance=elastic,app.kubernetes.io/component=worker"
CR: dict[str, Any] = {
    "apiVersion": "agentserve.dev/v1alpha1",
    "kind": "AgentServingDeployment",
    "metadata": {"name": NAME, "namespace": NS},
    "spec": {
        "model": {"name": "agentserve-sim"},
        "workers": {"engine": "sim", "replicas": 1},
        "autoscaling": {
            "minWorkers": 1,
            "maxWorkers": 3,
            "intervalSeconds": 1,
            "scaleDownDelaySeconds": 2,
        },
        "frontend": {"resources": {"requests": {"cpu": "250m"}}, "autoscaling": {"maxReplicas": 1}},
    },
}
KV_BLOCKS = 1000  # each stand-in worker's KV cache


class ScriptedFleet:
    """The stand-in for the pods' metrics: a fleet-wide KV demand split over the discovered workers,
    and the retained session blocks of one chosen pod (the one a scale-down must keep)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.demand_blocks = 0
        self.valuable: str | None = None  # pod IP holding retained sessions
        self.finished = 0
        self._lock = threading.Lock()
        self._ips: tuple[float, list[str]] = (0.0, [])

    def worker_ips(self) -> list[str]:
        pods = self.kube.items("pods", NS, WORKERS)
        return sorted(p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP"))

    def _cached_ips(self) -> list[str]:
        if time.monotonic() - self._ips[0] > 0.5:
            self._ips = (time.monotonic(), self.worker_ips())
        return self._ips[1]

    async def fetch(self, url: str) -> bytes:
        parts = urlsplit(url)
        if parts.path == "/load":
            return json.dumps(self._load(parts.hostname or "")).encode()
        if parts.port == 8100:  # a router
            return b"# TYPE agentserve_router_queue_depth gauge\nagentserve_router_queue_depth 0\n"
        return b"# TYPE agentserve_frontend_requests counter\nagentserve_frontend_requests_total 0\n"

    def _load(self, ip: str) -> dict[str, Any]:
        with self._lock:
            self.finished += 1
            ips = self._cached_ips() or [ip]
            share = self.demand_blocks // max(len(ips), 1)
            retained = 400 if ip == self.valuable else 0
            return {
                "running": 4 if share else 0,
                "waiting": 0,
                "kv_blocks_used": share,
                "kv_blocks_total": KV_BLOCKS,
                "kv_blocks_retained": retained,
                "requests_finished": self.finished,
                "prompt_tokens": 2000 * self.finished,
                "cached_prompt_tokens": 1800 * self.finished,
                "generated_tokens": 100 * self.finished,
            }


def _replicas(kube: Kube) -> int:
    return int(kube.kubectl("get", "asd", NAME, "-n", NS, "-o", "jsonpath={.spec.workers.replicas}"))


def _running_workers(kube: Kube) -> list[dict[str, Any]]:
    return [p for p in kube.items("pods", NS, WORKERS) if p["metadata"].get("deletionTimestamp") is None]


def test_the_operator_deploys_the_planner_and_it_scales_the_workers(
    operator: Operator, tmp_path: Path
) -> None:
    from kubernetes import config as kube_config

    kube = operator.kube
    kube.ensure_namespace(NS)
    kube.apply_yaml(yaml.safe_dump(CR))
    wait_for(
        lambda: condition(kube.get("asd", NAME, NS), "Ready").get("status") == "True",
        90,
        f"{NAME} Ready",
        interval=0.3,
    )
    # What the operator made for the planner: its least-privilege Role, one pod, a metrics Service.
    role = kube.get("role", f"{NAME}-planner", NS)
    assert role is not None and role["rules"] == role_rules(NAME)
    binding = kube.get("rolebinding", f"{NAME}-planner", NS)
    assert binding is not None and binding["subjects"][0]["name"] == f"{NAME}-planner"
    deployment = wait_for(lambda: kube.get("deployment", f"{NAME}-planner", NS), 30, "the planner Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == f"{NAME}-planner"
    assert pod_spec["containers"][0]["command"] == ["agentserve", "planner"]
    assert kube.get("service", f"{NAME}-planner", NS) is not None
    hpa = kube.get("hpa", f"{NAME}-frontend", NS)
    assert hpa is not None and hpa["spec"]["scaleTargetRef"]["name"] == f"{NAME}-frontend"
    config_map = kube.get("configmap", f"{NAME}-config", NS)
    assert config_map is not None
    config = PlannerServiceConfig.model_validate(yaml.safe_load(config_map["data"]["planner.yaml"]))
    assert (config.deployment, config.min_workers, config.max_workers) == (NAME, 1, 3)

    token_config = kube.token_kubeconfig(NS, f"{NAME}-planner", tmp_path / "planner.kubeconfig")
    planner_kube = PlannerKube(NS, NAME, kube_config.new_client_from_config(config_file=str(token_config)))
    services = {
        "worker": config.worker_service,
        "frontend": config.frontend_service,
        "router": config.router_service,
    }
    fleet = ScriptedFleet(kube)
    reader = FleetReader(slice_discovery(planner_kube.endpoint_slices, services), fetch=fleet.fetch)
    planner = ClusterPlanner(config, load_profile(config.profile).timing, reader, planner_kube)

    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        async def run() -> None:
            while not stop.is_set():
                await planner.step()
                await asyncio.sleep(config.interval_s)

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by the assertions below
            errors.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        # A burst: the KV the fleet holds needs 3 workers (2500 blocks at 90 % of 1000 each).
        fleet.demand_blocks = 2500
        wait_for(lambda: not errors and _replicas(kube) == 3, 60, "the planner to ask for 3 workers")
        wait_for(
            lambda: len([p for p in _running_workers(kube) if (p.get("status") or {}).get("podIP")]) == 3,
            60,
            "3 worker pods with addresses",
        )

        # The operator's counts and the planner's condition are two writers' (server-side apply,
        # each its own fields): wait for both to show, as `kubectl get` eventually does.
        def scaled(obj: dict[str, Any] | None) -> bool:
            return (
                obj is not None
                and obj["status"].get("workersReady") == "3/3"
                and condition(obj, AUTOSCALING_CONDITION).get("reason") == "HoldingSessionKv"
            )

        cr = wait_for(
            lambda: (obj := kube.get("asd", NAME, NS)) and scaled(obj) and obj,
            90,
            "kubectl get asd to show 3/3 workers, held for session KV",
        )
        scaling = condition(cr, AUTOSCALING_CONDITION)
        assert scaling["message"].startswith("3 workers: kv:"), scaling
        printed = wait_for(
            lambda: (
                (out := kube.kubectl("get", "asd", NAME, "-n", NS, "-o", "wide"))
                and "3/3" in out
                and "HoldingSessionKv" in out
                and out
            ),
            30,
            "kubectl get asd -o wide to print 3/3 and the planner's reason",
        )
        assert printed

        # The load goes; one pod holds retained sessions: the planner keeps that one.
        ips = fleet.worker_ips()
        fleet.valuable = ips[1]
        fleet.demand_blocks = 0
        wait_for(lambda: not errors and _replicas(kube) == 1, 60, "the planner to go back to 1 worker")
        survivors = wait_for(
            lambda: (pods := _running_workers(kube)) and len(pods) == 1 and pods, 60, "one worker pod left"
        )
        assert survivors[0]["status"]["podIP"] == fleet.valuable
        assert survivors[0]["metadata"]["annotations"][DELETION_COST] == "2"  # ranked most costly to lose
    finally:
        stop.set()
        thread.join(10)
    assert not errors, errors

    events = [e for e in kube.items("events", NS) if e["involvedObject"].get("name") == NAME]
    reasons = {e["reason"] for e in events if e.get("source", {}).get("component") == "agentserve-planner"}
    assert {"ScaledUp", "ScaledDown"} <= reasons, reasons
    # The Role is exactly what the planner used: every rule exercised, nothing refused.
    granted = {(a.group, a.resource, verb) for a in PLANNER_ACCESS for verb in a.verbs}
    assert planner_kube.calls == granted


def test_an_hpa_can_drive_the_workers_through_the_scale_subresource(operator: Operator) -> None:
    """The documented alternative to the planner (examples/autoscaling/hpa-on-workers.yaml): the HPA
    controller reads the CR's scale subresource. No custom metrics API runs here, so the HPA can get
    the scale but not the metric — which is what its conditions must say."""
    kube = operator.kube
    kube.ensure_namespace("agents")
    text = (ROOT / "examples" / "autoscaling" / "hpa-on-workers.yaml").read_text(encoding="utf-8")
    hpa = yaml.safe_load(text)
    target = hpa["spec"]["scaleTargetRef"]["name"]
    if kube.get("asd", target, "agents") is None:
        kube.apply_yaml((ROOT / "examples" / "sim.yaml").read_text(encoding="utf-8"))
    kube.apply_yaml(text)
    try:
        status = wait_for(
            lambda: (
                (obj := kube.get("hpa", hpa["metadata"]["name"], "agents"))
                and condition(obj, "AbleToScale").get("status") == "True"
                and obj
            ),
            90,
            "the HPA to read the AgentServingDeployment's scale subresource",
            interval=0.5,
        )
        assert condition(status, "AbleToScale")["reason"] == "SucceededGetScale"
        assert condition(status, "ScalingActive")["status"] == "False"  # no custom metrics API here
    finally:
        kube.kubectl("delete", "hpa", hpa["metadata"]["name"], "-n", "agents", check=False)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])


def test_the_operators_and_the_planners_status_writes_keep_each_others_conditions(
    operator: Operator,
) -> None:
    """Status is written by server-side apply under two field managers (conditions are a list-map
    keyed by type): an operator write computed from a read taken before the planner's write leaves
    the planner's condition in place, and the operator removes it once the spec drops autoscaling."""
    from kubernetes import config as kube_config

    from agentserve.operator.cluster import KubeCluster
    from agentserve.planner.kube import planner_condition

    kube = operator.kube
    ns, name = "two-writers", "writers"
    kube.ensure_namespace(ns)
    cr = {**CR, "metadata": {"name": name, "namespace": ns}}
    kube.apply_yaml(yaml.safe_dump(cr))

    def ready(obj: dict[str, Any] | None) -> dict[str, Any] | None:
        return obj if condition(obj, "Ready").get("status") == "True" else None

    stale = wait_for(
        lambda: ready(kube.get("asd", name, ns)),
        90,
        f"{name} Ready",
        interval=0.3,
    )
    client = kube_config.new_client_from_config(config_file=str(kube.kubeconfig))
    ours = planner_condition(
        None, ok=True, reason="Steady", message="1 workers: steady", generation=1, now=datetime.now(UTC)
    )
    PlannerKube(ns, name, client).set_condition(stale, ours)
    assert condition(kube.get("asd", name, ns), AUTOSCALING_CONDITION).get("message") == "1 workers: steady"

    # The operator's next write, from the read taken before the planner's (another message, so it
    # is a real write under the operator's field manager).
    status = dict(stale["status"])
    status["conditions"] = [
        {**c, "message": "rewritten from a stale read"} if c["type"] == "Ready" else c
        for c in status["conditions"]
    ]
    KubeCluster(client).patch_status(ns, name, status)
    assert condition(kube.get("asd", name, ns), AUTOSCALING_CONDITION).get("message") == "1 workers: steady"

    kube.merge_patch(name, ns, {"spec": {"autoscaling": None}})
    wait_for(
        lambda: not condition(kube.get("asd", name, ns), AUTOSCALING_CONDITION),
        60,
        "the operator to remove the planner's condition once autoscaling is gone",
        interval=0.3,
    )
    kube.kubectl("delete", "namespace", ns, "--wait=false")
