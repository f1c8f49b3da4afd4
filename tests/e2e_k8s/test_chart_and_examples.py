"""The chart, the CRD and the examples on a real API server and scheduler (KWOK B200 + CPU pools)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from typing import Any

import pytest
import yaml
from k8s_e2e import OPERATOR_NS, RELEASE, ROOT, Kube, Operator, condition, load_example, wait_for

EXAMPLES = ("sim.yaml", "qwen3-coder-b200.yaml", "gpt-oss-120b-b200.yaml", "deepseek-r1-8xb200.yaml")

MODELS_PV = """
apiVersion: v1
kind: PersistentVolume
metadata:
  name: models-agents
spec:
  capacity: {storage: 10Ti}
  accessModes: [ReadOnlyMany]
  storageClassName: manual
  hostPath: {path: /mnt/models}
  claimRef: {namespace: agents, name: models}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: models
  namespace: agents
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: manual
  resources: {requests: {storage: 10Ti}}
"""


# The prometheus-operator's ServiceMonitor kind, registered with a minimal schema (the operator only
# creates ServiceMonitors; nothing here reads them). The qwen3-coder example asks for one.
SERVICE_MONITOR_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names:
    kind: ServiceMonitor
    listKind: ServiceMonitorList
    plural: servicemonitors
    singular: servicemonitor
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def test_helm_installed_the_chart_over_a_crd_applied_from_the_repository(chart: Kube) -> None:
    # The chart fixture applied crds/ with kubectl first (a user following docs/kubernetes.md), then ran
    # `helm install`: the chart's crds/ is skipped for an existing CRD instead of failing ownership.
    status = chart.helm("status", RELEASE, "-n", OPERATOR_NS, "-o", "json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["info"]["status"] == "deployed"
    sa = chart.get("serviceaccount", "agentserve", OPERATOR_NS)
    assert sa is not None


def test_the_apiserver_serves_the_documented_fields_to_kubectl_explain(chart: Kube) -> None:
    # The apiserver publishes a new CRD's OpenAPI a few seconds after it is established.
    def explain(path: str) -> str:
        result = chart.kubectl_result("explain", path)
        return result.stdout if result.returncode == 0 else ""

    out = wait_for(lambda: explain("asd.spec.workers"), 60, "kubectl explain to know the CRD", interval=1)
    assert "tensorParallelSize" in out and "kvCache" in out
    assert "model family" in explain("asd.spec.model.family")
    assert "CamelCase" in explain("asd.status.conditions.reason")


def _cr(name: str, namespace: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "agentserve.dev/v1alpha1",
            "kind": "AgentServingDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


SIM = {"model": {"name": "agentserve-sim"}, "workers": {"engine": "sim"}}
TRT = {"model": {"name": "m", "source": {"pvc": {"claimName": "models"}}}}


def _with(base: dict[str, Any], **patch: Any) -> dict[str, Any]:
    spec = copy.deepcopy(base)
    for path, value in patch.items():
        node = spec
        keys = path.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return spec


TWO_SOURCES = _with(TRT, model__source={"pvc": {"claimName": "m"}, "hostPath": {"path": "/m"}})
BOTH_TEMPLATES = _with(SIM, model__chatTemplate={"inline": "x", "configMap": {"name": "c", "key": "k"}})
REJECTED = [
    ("9lives", SIM, "metadata.name"),
    ("x" * 46, SIM, "metadata.name"),
    ("two-sources", TWO_SOURCES, "exactly one of pvc, hostPath and image"),
    ("no-source", {"model": {"name": "m"}, "workers": {"engine": "trtllm"}}, "needs model.source"),
    ("sim-tp", _with(SIM, workers__tensorParallelSize=2), "the sim engine uses no GPU"),
    (
        "trt-sim-profile",
        _with(TRT, workers__sim={"profile": "b200-qwen3-30b-a3b-estimate"}),
        "set engine: sim",
    ),
    ("bad-profile", _with(SIM, workers__sim={"profile": "h100-guess"}), 'Unsupported value: "h100-guess"'),
    (
        "gpus-lt-tp",
        _with(TRT, workers={"tensorParallelSize": 8, "gpusPerWorker": 4}),
        "gpusPerWorker must be at least tensorParallelSize",
    ),
    (
        "codex-no-responses",
        _with(SIM, agent={"apis": ["chat"], "codexCatalog": True}),
        "codexCatalog needs the responses API",
    ),
    (
        "kv-no-reuse",
        _with(TRT, workers={"kvCache": {"enableBlockReuse": False}}),
        "router.policy kv needs workers.kvCache.enableBlockReuse",
    ),
    ("template-both", BOTH_TEMPLATES, "exactly one of inline and configMap"),
    ("bad-family", _with(SIM, model__family="llama-9"), 'Unsupported value: "llama-9"'),
    ("bad-parser", _with(SIM, agent={"toolCallParser": "nope"}), 'Unsupported value: "nope"'),
]


@pytest.mark.parametrize(("name", "spec", "message"), REJECTED, ids=[r[0][:20] for r in REJECTED])
def test_the_apiserver_rejects_invalid_specs_with_the_rule_message(
    chart: Kube, name: str, spec: dict[str, Any], message: str
) -> None:
    result = chart.kubectl_result("apply", "--server-side", "-f", "-", input=_cr(name, "default", spec))
    assert result.returncode != 0, f"{name} was accepted"
    assert message in result.stderr, result.stderr
    # Every error names its field: the root rule's used to read `<nil>: Invalid value: "object"`.
    nameless = [
        line
        for line in result.stderr.splitlines()
        if "<nil>" in line and "rules were not checked" not in line
    ]
    assert nameless == [], result.stderr


def _pods(kube: Kube, namespace: str, instance: str, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component={component}"
    return kube.items("pods", namespace, selector)


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


@pytest.fixture(scope="module")
def examples(operator: Operator) -> dict[str, dict[str, Any]]:
    kube = operator.kube
    kube.ensure_namespace("agents")
    kube.apply_yaml(MODELS_PV)
    applied = {}
    for name in EXAMPLES:
        text = (ROOT / "examples" / name).read_text(encoding="utf-8")
        kube.apply_yaml(text)
        applied[name] = load_example(name)
    # Installed after the operator first looked the kind up and found it missing: it must notice
    # without a restart (a missing optional kind is asked again after a minute, not on every sync).
    kube.apply_yaml(SERVICE_MONITOR_CRD)
    return applied


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_is_scheduled_onto_its_pools_and_becomes_ready(
    operator: Operator, examples: dict[str, dict[str, Any]], example: str
) -> None:
    kube = operator.kube
    body = examples[example]
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    cr = wait_for(
        lambda: (
            (obj := kube.get("asd", name, namespace))
            and condition(obj, "Ready").get("status") == "True"
            and obj
        ),
        120,
        f"{example} Ready (conditions: {condition(kube.get('asd', name, namespace), 'WorkersReady')})",
        interval=0.5,
    )
    gpu_engine = body["spec"].get("workers", {}).get("engine", "trtllm") != "sim"
    for component in ("frontend", "router", "worker"):
        pods = _pods(kube, namespace, name, component)
        assert pods and all(_ready(p) for p in pods), f"{component} pods of {name}"
        nodes = {p["spec"]["nodeName"] for p in pods}
        if component == "worker" and gpu_engine:
            assert all(n.startswith("b200-") for n in nodes), nodes  # the real scheduler placed them
            for pod in pods:
                (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
                assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        else:
            assert all(n.startswith("cpu-") for n in nodes), nodes  # B200 nodes are tainted for GPU pods
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert condition(cr, "WorkersReady")["status"] == "True"
    if body["spec"].get("observability", {}).get("serviceMonitor", {}).get("enabled"):
        assert kube.get("servicemonitor", name, namespace) is not None


def test_gpu_requests_beyond_the_pool_leave_pods_pending_and_the_condition_says_why(
    operator: Operator, examples: dict[str, dict[str, Any]]
) -> None:
    # 9 workers of 8 GPUs: more whole B200 nodes than the pool has (8), and the examples hold some.
    kube = operator.kube
    spec = {
        "model": {"name": "huge", "source": {"hostPath": {"path": "/models/huge"}}},
        "workers": {"tensorParallelSize": 8, "gpusPerWorker": 8, "replicas": 9},
    }
    kube.apply_yaml(_cr("huge", "agents", spec))
    try:
        cr = wait_for(
            lambda: (
                (obj := kube.get("asd", "huge", "agents"))
                and condition(obj, "WorkersReady").get("reason") == "Unschedulable"
                and obj
            ),
            60,
            "WorkersReady=False Unschedulable",
            interval=0.5,
        )
        workers = condition(cr, "WorkersReady")
        assert workers["status"] == "False" and "Insufficient nvidia.com/gpu" in workers["message"]
        assert condition(cr, "Ready")["status"] == "False"
        pods = _pods(kube, "agents", "huge", "worker")
        assert any(p["status"]["phase"] == "Pending" for p in pods)
        scheduled = [p for p in pods if p["spec"].get("nodeName")]
        assert all(p["spec"]["nodeName"].startswith("b200-") for p in scheduled)
    finally:
        kube.kubectl("delete", "asd", "huge", "-n", "agents", "--wait=false")


def test_kubectl_scale_uses_the_scale_subresource(
    operator: Operator, examples: dict[str, dict[str, Any]]
) -> None:
    kube = operator.kube
    kube.kubectl("scale", "asd/sim", "-n", "agents", "--replicas=3")
    wait_for(
        lambda: len([p for p in _pods(kube, "agents", "sim", "worker") if _ready(p)]) == 3,
        60,
        "3 ready sim workers",
    )
    cr = wait_for(
        lambda: (o := kube.get("asd", "sim", "agents")) and o["status"].get("workersReady") == "3/3" and o,
        30,
        "status.workersReady 3/3",
    )
    assert cr["status"]["replicas"] == 3
    scale = json.loads(
        kube.kubectl(
            "get",
            "--raw",
            "/apis/agentserve.dev/v1alpha1/namespaces/agents/agentservingdeployments/sim/scale",
        )
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    kube.kubectl("scale", "asd/sim", "-n", "agents", "--replicas=2")
    wait_for(lambda: len(_pods(kube, "agents", "sim", "worker")) == 2, 60, "2 sim workers")


def _readme_kubernetes_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- e2e:readme-kubernetes -->", 1)[1].split("<!-- end:readme-kubernetes -->", 1)[0]
    return block.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_readme_kubernetes_commands_run_as_shown(
    operator: Operator, examples: dict[str, dict[str, Any]]
) -> None:
    """The README's "On Kubernetes" block, line for line in one bash, against this control plane (the
    chart fixture installed the same release: `helm upgrade --install` upgrades it)."""
    kube = operator.kube
    script = _readme_kubernetes_block()
    assert "helm upgrade --install agentserve charts/agentserve" in script
    env = {**kube.env, "PATH": f"{ROOT / '.tools' / 'bin'}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "http://sim-frontend.agents.svc:8000\n" in result.stdout
    # The tuned field reached the frontend's config (the operator re-rendered the ConfigMap).
    wait_for(
        lambda: "kv_retention_session_seconds: 1800" in (
            (kube.get("configmap", "sim-config", "agents") or {}).get("data", {}).get("frontend.yaml", "")
        ),
        60,
        "the frontend config to carry the new retention",
    )  # fmt: skip
    status = json.loads(kube.helm("status", RELEASE, "-n", OPERATOR_NS, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] >= 2
