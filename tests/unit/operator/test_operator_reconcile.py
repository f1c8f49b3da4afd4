"""Reconcile logic with the Kubernetes client at its boundary.

No kube-apiserver can run here, so `FakeCluster` implements exactly the six `Cluster` methods the
operator calls, with the apiserver behaviour they rely on: server-side apply merges our fields into the
stored object and keeps what others (the apiserver, controllers) wrote; create refuses a name that
exists and leaves that object alone; list filters by label selector; delete removes. The real
client (`KubeCluster`) is tested over HTTP in test_operator_kubeclient.py.
"""

from __future__ import annotations

import base64
import copy
import itertools
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agentserve.keyfile import decode_key, fingerprint
from agentserve.operator.build import CHILD_KINDS
from agentserve.operator.cluster import ClusterError, KindNotInstalled
from agentserve.operator.handlers import State, on_child_event, owner_of, run_sync, sync
from agentserve.operator.reconcile import ObjectRef, component_verdict, is_subset, plan, ref

LOG = logging.getLogger("test")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _merge(stored: Any, applied: Any) -> Any:
    if isinstance(stored, dict) and isinstance(applied, dict):
        out = dict(stored)
        for key, value in applied.items():
            out[key] = _merge(stored.get(key), value)
        return out
    return copy.deepcopy(applied)


class FakeCluster:
    def __init__(self, *, kinds: set[tuple[str, str]] | None = None) -> None:
        self.objects: dict[ObjectRef, dict[str, Any]] = {}
        self.kinds = kinds if kinds is not None else {*CHILD_KINDS, ("v1", "Pod"), ("v1", "Secret")}
        self.applied: list[ObjectRef] = []
        self.writes: list[ObjectRef] = []  # applies and creates, in order
        self.created: list[ObjectRef] = []
        self.refused: list[ObjectRef] = []  # creates answered 409 AlreadyExists
        self.deleted: list[ObjectRef] = []
        self.status_patches: list[dict[str, Any]] = []
        self.status_owned: dict[tuple[str, str], set[str]] = {}
        self.removed_conditions: list[str] = []
        self.fail_apply: str | None = None
        self.fail_create: ClusterError | None = None
        self.owners: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.fail_list_owners = 0
        self.rechecked: list[str] = []

    def _check(self, api_version: str, kind: str) -> None:
        if (api_version, kind) not in self.kinds:
            raise KindNotInstalled(f"{kind} ({api_version}) is not served by this cluster", 404)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._check(obj["apiVersion"], obj["kind"])
        if self.fail_apply == obj["kind"]:
            raise ClusterError("422 Unprocessable Entity: admission webhook denied", 422)
        key = ref(obj)
        self.objects[key] = _merge(self.objects.get(key, {}), obj)
        self.applied.append(key)
        self.writes.append(key)
        return self.objects[key]

    def create(self, obj: dict[str, Any]) -> bool:
        self._check(obj["apiVersion"], obj["kind"])
        if self.fail_create is not None:
            raise self.fail_create
        key = ref(obj)
        if key in self.objects:
            self.refused.append(key)
            return False
        self.objects[key] = copy.deepcopy(obj)
        self.created.append(key)
        self.writes.append(key)
        return True

    def delete(self, key: ObjectRef) -> None:
        self._check(key.api_version, key.kind)
        self.objects.pop(key, None)
        self.deleted.append(key)

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._check(api_version, kind)
        wanted = dict(part.split("=", 1) for part in label_selector.split(","))
        return [
            copy.deepcopy(o)
            for r, o in sorted(self.objects.items())
            if (r.api_version, r.kind, r.namespace) == (api_version, kind, namespace)
            and wanted.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def get_owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.owners.get((namespace, name))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Server-side apply's list-map rule for conditions: the types this writer applied before and
        leaves out now go, another writer's stay."""
        self.status_patches.append(status)
        owner = self.owners.get((namespace, name))
        if owner is None:
            return
        mine = {c["type"] for c in status.get("conditions") or []}
        dropped = self.status_owned.get((namespace, name), set()) - mine
        kept = [
            c
            for c in (owner.get("status") or {}).get("conditions") or []
            if c["type"] not in mine and c["type"] not in dropped
        ]
        owner["status"] = _merge(owner.get("status") or {}, status)
        owner["status"]["conditions"] = [*kept, *copy.deepcopy(status.get("conditions") or [])]
        self.status_owned[(namespace, name)] = mine

    def remove_condition(self, namespace: str, name: str, condition_type: str) -> None:
        self.removed_conditions.append(condition_type)
        owner = self.owners.get((namespace, name))
        if owner is not None and "status" in owner:
            conditions = owner["status"].get("conditions") or []
            owner["status"]["conditions"] = [c for c in conditions if c["type"] != condition_type]

    def list_owners(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        if self.fail_list_owners:
            self.fail_list_owners -= 1
            raise ClusterError("connection refused")
        return [
            copy.deepcopy(o)
            for (ns, _), o in sorted(self.owners.items())
            if not namespaces or ns in namespaces
        ]

    def post_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def recheck(self, api_version: str) -> None:
        self.rechecked.append(api_version)

    # what controllers would do
    def deployments_ready(self, *, ready: bool = True) -> None:
        for key, obj in self.objects.items():
            if key.kind == "Deployment":
                replicas = obj["spec"]["replicas"]
                obj["metadata"]["generation"] = 1
                obj["status"] = {
                    "observedGeneration": 1,
                    "replicas": replicas,
                    "updatedReplicas": replicas,
                    "readyReplicas": replicas if ready else 0,
                    "availableReplicas": replicas if ready else 0,
                }

    def add_pod(self, component: str, status: dict[str, Any]) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"coder-{component}-abc",
                "namespace": "ai",
                "labels": {
                    "app.kubernetes.io/name": "agentserve",
                    "app.kubernetes.io/instance": "coder",
                    "app.kubernetes.io/component": component,
                    "app.kubernetes.io/managed-by": "agentserve-operator",
                },
            },
            "status": status,
        }
        self.objects[ref(pod)] = pod


def cr(
    spec: dict[str, Any] | None = None, generation: int = 1, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "agentserve.dev/v1alpha1",
        "kind": "AgentServingDeployment",
        "metadata": {"name": "coder", "namespace": "ai", "uid": "uid-1", "generation": generation},
        "spec": spec
        or {"model": {"name": "Qwen/Qwen3-32B", "source": {"pvc": {"claimName": "models", "path": "qwen3"}}}},
    }
    if status is not None:
        body["status"] = status
    return body


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def kinds_of(keys: list[ObjectRef]) -> list[str]:
    return sorted(k.kind for k in keys)


# ------------------------------------------------------------------------------------ pure parts


def test_is_subset_ignores_server_defaults_and_number_spelling() -> None:
    desired = {"spec": {"replicas": 2, "template": {"limits": {"nvidia.com/gpu": 8}}, "empty": {}}}
    observed = {
        "spec": {
            "replicas": 2,
            "template": {"limits": {"nvidia.com/gpu": "8"}},
            "progressDeadlineSeconds": 600,
        },
        "status": {"replicas": 2},
    }
    assert is_subset(desired, observed)
    assert not is_subset({"spec": {"replicas": 3}}, observed)
    assert not is_subset({"a": [1, 2]}, {"a": [1]})
    assert not is_subset({"a": True}, {"a": "True"})
    assert not is_subset({"a": {"b": 1}}, {})


def test_zero_values_the_apiserver_omits_are_not_drift() -> None:
    # Go's omitempty: a Service's `publishNotReadyAddresses: false` (and other false/0/"" fields)
    # never comes back from the apiserver; re-applying it every sync was a write per sync.
    desired = {"spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "x": {"n": 0, "s": ""}}}
    observed = {"spec": {"clusterIP": "None", "sessionAffinity": "None"}}
    assert is_subset(desired, observed)
    assert not is_subset({"spec": {"publishNotReadyAddresses": True}}, observed)
    assert not is_subset({"spec": {"x": {"n": 1}}}, observed)
    assert not is_subset({"spec": {"clusterIP": False}}, observed)  # present and different


def test_plan_applies_missing_and_drifted_and_deletes_unwanted() -> None:
    a = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a", "namespace": "n"},
        "data": {"k": "v"},
    }
    b = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "n"}, "spec": {"x": 1}}
    stale = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "old", "namespace": "n"}}
    drifted = copy.deepcopy(b)
    drifted["spec"]["x"] = 2
    result = plan([a, b], [a, drifted, stale])
    assert result.apply == [b]
    assert result.delete == [ref(stale)]
    assert plan([a], [a]).empty


def test_component_verdicts_explain_themselves() -> None:
    assert component_verdict(None, []).reason == "NotCreated"
    deployment: dict[str, Any] = {
        "metadata": {"name": "d", "generation": 2},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 1, "readyReplicas": 2, "updatedReplicas": 2},
    }
    assert component_verdict(deployment, []).reason == "RolloutPending"
    deployment["status"]["observedGeneration"] = 2
    ok = component_verdict(deployment, [])
    assert ok.ready and ok.message == "2/2 pods ready"
    deployment["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": "too slow",
        }
    ]
    stuck = component_verdict(deployment, [])
    assert (stuck.ready, stuck.reason, stuck.message) == (False, "ProgressDeadlineExceeded", "too slow")
    deployment["spec"]["replicas"] = 0
    assert component_verdict(deployment, []).reason == "ScaledToZero"


# -------------------------------------------------------------------------- sync against a cluster


def test_first_sync_creates_every_child_with_owner_references() -> None:
    cluster = FakeCluster()
    result = sync(cluster, cr(), NOW)
    created = kinds_of(cluster.applied)
    assert created.count("Deployment") == 3 and "ConfigMap" in created and "NetworkPolicy" in created
    for key in cluster.applied:
        owner = cluster.objects[key]["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("AgentServingDeployment", "uid-1", True)
    status = result.status
    assert status["observedGeneration"] == 1
    cond = conditions(status)
    assert cond["Ready"]["status"] == "False" and cond["Ready"]["reason"] == "ComponentsNotReady"
    assert cond["WorkersReady"]["reason"] == "PodsNotReady"
    assert status["endpoint"] == "http://coder-frontend.ai.svc:8000"
    assert status["selector"] == (
        "app.kubernetes.io/name=agentserve,app.kubernetes.io/instance=coder,app.kubernetes.io/component=worker"
    )


def test_ready_when_every_deployment_is_ready_and_second_sync_is_a_no_op() -> None:
    cluster = FakeCluster()
    sync(cluster, cr(), NOW)
    cluster.deployments_ready()
    cluster.applied.clear()
    result = sync(cluster, cr(), NOW)
    assert cluster.applied == [] and cluster.deleted == []
    cond = conditions(result.status)
    assert {c: cond[c]["status"] for c in cond} == {
        "Ready": "True",
        "FrontendReady": "True",
        "RouterReady": "True",
        "WorkersReady": "True",
    }
    assert cond["Ready"]["reason"] == "AllComponentsReady"
    assert result.status["workersReady"] == "1/1"
    assert result.status["workers"] == {
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        "availableReplicas": 1,
    }
    assert result.status["replicas"] == 1


def test_deleted_child_is_recreated_and_hand_edit_is_reverted() -> None:
    cluster = FakeCluster()
    sync(cluster, cr(), NOW)
    cluster.deployments_ready()
    service = ObjectRef("v1", "Service", "ai", "coder-worker")
    del cluster.objects[service]
    config = ObjectRef("v1", "ConfigMap", "ai", "coder-config")
    original = copy.deepcopy(cluster.objects[config]["data"])
    cluster.objects[config]["data"]["router.yaml"] = "policy: random\n"
    worker = ObjectRef("apps/v1", "Deployment", "ai", "coder-worker")
    cluster.objects[worker]["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    cluster.applied.clear()
    sync(cluster, cr(), NOW)
    assert sorted(cluster.applied) == sorted([service, config, worker])
    assert cluster.objects[config]["data"] == original
    assert cluster.objects[worker]["spec"]["template"]["spec"]["containers"][0]["image"] != "evil:latest"
    assert service in cluster.objects


def test_spec_change_reapplies_only_what_changed() -> None:
    cluster = FakeCluster()
    sync(cluster, cr(), NOW)
    cluster.deployments_ready()
    cluster.applied.clear()
    spec = cr()["spec"]
    spec["workers"] = {"replicas": 3}
    sync(cluster, cr(spec, generation=2), NOW)
    assert cluster.applied == [ObjectRef("apps/v1", "Deployment", "ai", "coder-worker")]
    assert cluster.objects[cluster.applied[0]]["spec"]["replicas"] == 3
    cluster.applied.clear()
    spec["router"] = {"policy": "least-loaded"}
    sync(cluster, cr(spec, generation=3), NOW)
    # the router's config changed: its ConfigMap and (config hash) its Deployment roll, nothing else
    assert kinds_of(cluster.applied) == ["ConfigMap", "Deployment"]
    assert ObjectRef("apps/v1", "Deployment", "ai", "coder-router") in cluster.applied


def test_disabled_feature_is_pruned_but_foreign_objects_are_left_alone() -> None:
    cluster = FakeCluster()
    spec = cr()["spec"]
    spec["observability"] = {"serviceMonitor": {"enabled": True}}
    sync(cluster, cr(spec), NOW)
    monitor = ObjectRef("monitoring.coreos.com/v1", "ServiceMonitor", "ai", "coder")
    assert monitor in cluster.objects
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "hand-made",
            "namespace": "ai",
            "labels": dict(cluster.objects[monitor]["metadata"]["labels"]),
        },
    }
    cluster.objects[ref(foreign)] = foreign
    del spec["observability"]
    sync(cluster, cr(spec, generation=2), NOW)
    assert cluster.deleted == [monitor]
    assert ref(foreign) in cluster.objects


def test_invalid_spec_is_a_condition_not_an_exception() -> None:
    cluster = FakeCluster()
    result = sync(cluster, cr({"model": {"name": "m"}, "workers": {"tensorParallelSize": 128}}), NOW)
    assert cluster.applied == []
    ready = conditions(result.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.workers.tensorParallelSize" in ready["message"]
    assert result.failure is not None


def test_unknown_llm_api_options_stop_the_rollout_with_a_condition() -> None:
    """A typo in llmApiOptions (here below kv_cache_config, which CEL cannot see) is refused before any
    worker pod is created: TensorRT-LLM would only fail it after the image pull and model load began."""
    cluster = FakeCluster()
    options = {"kv_cache_config": {"free_gpu_mem_fraction": 0.8}}
    result = sync(cluster, cr({"model": {"name": "m"}, "workers": {"llmApiOptions": options}}), NOW)
    assert cluster.applied == []
    ready = conditions(result.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "llmApiOptions.kv_cache_config.free_gpu_mem_fraction" in ready["message"]


def test_api_errors_are_a_condition_not_an_exception() -> None:
    cluster = FakeCluster()
    cluster.fail_apply = "Deployment"
    result = sync(cluster, cr(), NOW)
    ready = conditions(result.status)["Ready"]
    assert ready["reason"] == "ReconcileError" and "admission webhook denied" in ready["message"]
    cluster.fail_apply = None
    assert conditions(sync(cluster, cr(), NOW).status)["Ready"]["reason"] == "ComponentsNotReady"


def test_service_monitor_without_its_crd() -> None:
    cluster = FakeCluster(
        kinds={k for k in CHILD_KINDS if k[1] != "ServiceMonitor"} | {("v1", "Pod"), ("v1", "Secret")}
    )
    spec = cr()["spec"]
    spec["observability"] = {"serviceMonitor": {"enabled": True}}
    result = sync(cluster, cr(spec), NOW)
    ready = conditions(result.status)["Ready"]
    assert ready["reason"] == "ReconcileError" and "ServiceMonitor" in ready["message"]
    assert kinds_of(cluster.applied).count("Deployment") == 3  # everything else is in place
    assert conditions(sync(cluster, cr(), NOW).status)["Ready"]["reason"] == "ComponentsNotReady"


@pytest.mark.parametrize(
    ("pod_status", "reason", "text"),
    [
        (
            {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                    }
                ]
            },
            "Unschedulable",
            "Insufficient nvidia.com/gpu",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "worker",
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such tag"}},
                    }
                ]
            },
            "ImagePullBackOff",
            "no such tag",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "worker",
                        "state": {"running": {}},
                        "lastState": {"terminated": {"reason": "OOMKilled"}},
                    }
                ]
            },
            "OOMKilled",
            "OOM",
        ),
    ],
)
def test_worker_condition_carries_the_pods_reason(pod_status: dict[str, Any], reason: str, text: str) -> None:
    cluster = FakeCluster()
    sync(cluster, cr(), NOW)
    cluster.deployments_ready(ready=False)
    cluster.add_pod("worker", pod_status)
    cond = conditions(sync(cluster, cr(), NOW).status)
    assert cond["WorkersReady"]["reason"] == reason
    assert text in cond["WorkersReady"]["message"]
    assert reason in cond["Ready"]["message"] and "workers" in cond["Ready"]["message"]


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    cluster = FakeCluster()
    first = sync(cluster, cr(), NOW).status
    later = sync(cluster, cr(status=first), NOW + timedelta(minutes=5)).status
    assert conditions(later)["Ready"]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    cluster.deployments_ready()
    flipped = sync(cluster, cr(status=later), NOW + timedelta(minutes=10)).status
    assert conditions(flipped)["Ready"]["lastTransitionTime"] == "2026-01-02T03:14:05Z"


# ------------------------------------------------------------------------------- signing key

SIGNING_SECRET = ObjectRef("v1", "Secret", "ai", "coder-signing-key")


def keys(*seeds: int) -> Any:
    """A `new_key` that hands out distinct, known keys (the operator's are random)."""
    supply = iter([bytes([seed]) * 32 for seed in seeds])
    return lambda: next(supply)


def stored_key(cluster: FakeCluster, key: ObjectRef = SIGNING_SECRET) -> bytes:
    """The key a frontend would read from the Secret's file."""
    (data,) = cluster.objects[key]["data"].values()
    return decode_key(base64.b64decode(data))[0]


def with_spec(**changes: Any) -> dict[str, Any]:
    spec = cr()["spec"]
    spec.update(changes)
    return spec


def test_first_sync_creates_the_signing_key_secret_before_the_frontend() -> None:
    cluster = FakeCluster()
    result = sync(cluster, cr(), NOW, new_key=keys(7))
    assert cluster.created == [SIGNING_SECRET]
    frontend_ref = ObjectRef("apps/v1", "Deployment", "ai", "coder-frontend")
    assert cluster.writes.index(SIGNING_SECRET) < cluster.writes.index(frontend_ref)
    secret = cluster.objects[SIGNING_SECRET]
    assert stored_key(cluster) == bytes([7]) * 32
    assert secret["data"] == {"signing-key": base64.b64encode((bytes([7]) * 32).hex().encode()).decode()}
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("AgentServingDeployment", "uid-1", True)
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == "coder"
    fp = fingerprint(bytes([7]) * 32)
    assert secret["metadata"]["annotations"] == {"agentserve.dev/signing-key-fingerprint": fp}
    assert result.created == [(SIGNING_SECRET, fp)]
    # The frontend mounts exactly that Secret and key.
    frontend = cluster.objects[frontend_ref]
    volumes = {v["name"]: v for v in frontend["spec"]["template"]["spec"]["volumes"]}
    assert volumes["signing-key"]["secret"]["secretName"] == "coder-signing-key"
    assert volumes["signing-key"]["secret"]["items"] == [{"key": "signing-key", "path": "signing-key"}]


def test_the_signing_key_survives_every_later_sync_and_spec_change() -> None:
    cluster = FakeCluster()
    supply = keys(1, 2, 3, 4, 5, 6)
    sync(cluster, cr(), NOW, new_key=supply)
    first = stored_key(cluster)
    cluster.deployments_ready()
    again = sync(cluster, cr(), NOW, new_key=supply)
    assert again.created == [] and cluster.created == [SIGNING_SECRET]
    edited = with_spec(frontend={"replicas": 4}, agent={"apis": ["anthropic", "responses"]})
    sync(cluster, cr(edited, generation=2), NOW, new_key=supply)
    assert stored_key(cluster) == first and cluster.created == [SIGNING_SECRET]
    assert SIGNING_SECRET not in cluster.applied  # never applied, so never overwritten
    # Pointing at a Secret of one's own leaves ours alone (not pruned: it is no child kind), and coming
    # back finds the same key.
    own = with_spec(auth={"signingKeySecret": {"name": "team-key"}})
    sync(cluster, cr(own, generation=3), NOW, new_key=supply)
    assert SIGNING_SECRET in cluster.objects and SIGNING_SECRET not in cluster.deleted
    sync(cluster, cr(generation=4), NOW, new_key=supply)
    assert stored_key(cluster) == first and cluster.created == [SIGNING_SECRET]


def test_an_existing_secret_of_that_name_is_never_overwritten() -> None:
    cluster = FakeCluster()
    mine = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "coder-signing-key", "namespace": "ai"},
        "data": {"signing-key": base64.b64encode(b"made by hand, before the operator!").decode()},
    }
    cluster.objects[SIGNING_SECRET] = copy.deepcopy(mine)
    result = sync(cluster, cr(), NOW, new_key=keys(9))
    assert cluster.objects[SIGNING_SECRET] == mine
    assert cluster.created == [] and cluster.refused == [SIGNING_SECRET] and result.created == []
    assert result.failure is None


def test_a_signing_key_secret_in_the_spec_means_the_operator_creates_none() -> None:
    cluster = FakeCluster()
    called: list[int] = []

    def new_key() -> bytes:
        called.append(1)
        return bytes(32)

    spec = with_spec(auth={"signingKeySecret": {"name": "team-key", "key": "hmac"}})
    result = sync(cluster, cr(spec), NOW, new_key=new_key)
    assert result.failure is None and result.created == []
    assert cluster.created == [] and cluster.refused == [] and called == []  # no key made at all
    assert not [k for k in cluster.objects if k.kind == "Secret"]
    frontend = cluster.objects[ObjectRef("apps/v1", "Deployment", "ai", "coder-frontend")]
    volumes = {v["name"]: v for v in frontend["spec"]["template"]["spec"]["volumes"]}
    assert volumes["signing-key"]["secret"]["secretName"] == "team-key"


def test_a_signing_key_secret_deleted_by_hand_comes_back_with_a_new_key() -> None:
    # Documented (docs/kubernetes.md, rotation): the operator cannot read the old key, so the new
    # Secret holds a new one; running frontends keep theirs until they are rolled.
    cluster = FakeCluster()
    supply = keys(1, 2)
    sync(cluster, cr(), NOW, new_key=supply)
    del cluster.objects[SIGNING_SECRET]
    result = sync(cluster, cr(), NOW, new_key=supply)
    assert cluster.created == [SIGNING_SECRET, SIGNING_SECRET]
    assert stored_key(cluster) == bytes([2]) * 32
    assert result.created == [(SIGNING_SECRET, fingerprint(bytes([2]) * 32))]


def test_a_refused_signing_key_create_is_a_condition_naming_the_secret() -> None:
    cluster = FakeCluster()
    cluster.fail_create = ClusterError('403 Forbidden: secrets is forbidden: cannot create "secrets"', 403)
    result = sync(cluster, cr(), NOW, new_key=keys(1))
    ready = conditions(result.status)["Ready"]
    assert ready["reason"] == "ReconcileError"
    assert "Secret/coder-signing-key (the frontends' signing key): 403 Forbidden" in ready["message"]
    assert not [k for k in cluster.applied if k.kind == "Deployment"]  # no pod waits on a missing Secret
    cluster.fail_create = None
    assert sync(cluster, cr(), NOW, new_key=keys(2)).failure is None


def test_no_key_reaches_status_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster()
    state = State(cluster)
    caplog.set_level(logging.INFO)
    first = run_sync(state, cr(), "spec", LOG)  # the operator's own random key
    key = stored_key(cluster)
    logged = caplog.text
    assert (
        f"created Secret/coder-signing-key with a new signing key (fingerprint {fingerprint(key)})" in logged
    )
    assert 'agentserve_operator_applied_total{kind="Secret"} 1' in state.metrics.render()
    status = repr([first.status, run_sync(state, cr(), "timer", LOG).status])
    for form in (key.hex(), base64.b64encode(key).decode(), base64.b64encode(key.hex().encode()).decode()):
        assert form not in caplog.text and form not in status


def test_a_frontend_reads_the_key_the_operator_wrote(tmp_path: Path) -> None:
    from agentserve.config import FrontendConfig
    from agentserve.frontend.up import load_signer

    cluster = FakeCluster()
    sync(cluster, cr(), NOW, new_key=keys(42))
    secret = cluster.objects[SIGNING_SECRET]
    path = tmp_path / "signing-key"  # what kubelet writes for the volume's item
    path.write_bytes(base64.b64decode(secret["data"]["signing-key"]))
    signer = load_signer(FrontendConfig.model_validate({"signing_key_file": str(path)}), {})
    assert signer.fingerprint == secret["metadata"]["annotations"]["agentserve.dev/signing-key-fingerprint"]
    assert signer.fingerprint == fingerprint(bytes([42]) * 32)


def test_the_operator_makes_a_fresh_random_key_per_deployment() -> None:
    cluster = FakeCluster()
    for name, uid in (("coder", "uid-1"), ("chat", "uid-2")):
        body = cr()
        body["metadata"].update(name=name, uid=uid)
        run_sync(State(cluster), body, "spec", LOG)
    secrets = [k for k in cluster.objects if k.kind == "Secret"]
    assert sorted(k.name for k in secrets) == ["chat-signing-key", "coder-signing-key"]
    made = [stored_key(cluster, k) for k in secrets]
    assert all(len(k) == 32 for k in made) and made[0] != made[1]
    assert len(set(itertools.chain.from_iterable(made))) > 16  # random bytes, not a constant


# ------------------------------------------------------------------------------- handler glue


def test_child_events_put_back_a_deleted_child_and_refresh_status() -> None:
    cluster = FakeCluster()
    state = State(cluster)
    body = cr()
    cluster.owners[("ai", "coder")] = body
    run_sync(state, body, "spec", LOG)
    deployment_ref = ObjectRef("apps/v1", "Deployment", "ai", "coder-worker")
    gone = cluster.objects.pop(deployment_ref)
    assert owner_of(gone) == "coder"
    result = on_child_event(state, "DELETED", gone, LOG)
    assert result is not None
    assert deployment_ref in cluster.objects
    assert cluster.status_patches[-1] == result.status
    # a burst of MODIFIED events right after a sync is debounced; DELETED never is
    assert on_child_event(state, "MODIFIED", cluster.objects[deployment_ref], LOG) is None
    assert on_child_event(state, None, cluster.objects[deployment_ref], LOG) is None
    del cluster.owners[("ai", "coder")]
    assert on_child_event(state, "DELETED", gone, LOG) is None  # owner gone: garbage collection's job


def test_run_sync_turns_an_operator_bug_into_a_condition() -> None:
    class Broken(FakeCluster):
        def list(
            self, api_version: str, kind: str, namespace: str, label_selector: str
        ) -> list[dict[str, Any]]:
            raise RuntimeError("boom")

    state = State(Broken())
    result = run_sync(state, cr(), "timer", LOG)
    ready = conditions(result.status)["Ready"]
    assert ready["reason"] == "ReconcileError" and "boom" in ready["message"]
    assert (
        'agentserve_operator_syncs_total{trigger="timer",result="ReconcileError"} 1' in state.metrics.render()
    )


def test_handlers_are_registered_with_kopf_without_a_timer_or_finalizer() -> None:
    import kopf

    from agentserve.operator import handlers

    registry = kopf.get_default_registry()
    ids = {h.id for h in registry._changing.get_all_handlers()}
    assert {"reconcile"} <= ids
    # No kopf timer or daemon: kopf puts a finalizer on every CR they watch (issue 19, defect 1).
    assert list(registry._spawning.get_all_handlers()) == []
    assert not any(h.requires_finalizer for h in registry._changing.get_all_handlers())
    watched = {h.id for h in registry._watching.get_all_handlers()}
    assert {"child-deployments", "child-services", "child-configmaps"} <= watched
    assert handlers.RESYNC_SECONDS <= 60


def test_kopf_handler_applies_status_only_when_it_changed() -> None:
    import kopf

    from agentserve.operator import handlers

    cluster = FakeCluster()
    memo = kopf.Memo()
    memo.agentserve = State(cluster)
    cluster.owners[("ai", "coder")] = cr()
    handlers.reconcile(body=kopf.Body(cr()), memo=memo, logger=LOG)
    assert [c["type"] for c in cluster.status_patches[-1]["conditions"]] == [
        "Ready",
        "FrontendReady",
        "RouterReady",
        "WorkersReady",
    ]
    assert kinds_of(cluster.applied).count("Deployment") == 3
    at_rest = {**cr(), "status": copy.deepcopy(cluster.status_patches[-1])}
    handlers.reconcile(body=kopf.Body(at_rest), memo=memo, logger=LOG)
    assert len(cluster.status_patches) == 1


def test_a_status_write_from_an_old_read_keeps_the_planners_condition_until_autoscaling_goes() -> None:
    import kopf

    from agentserve.operator import handlers

    cluster = FakeCluster()
    memo = kopf.Memo()
    memo.agentserve = State(cluster)
    scaled = cr()
    scaled["spec"]["autoscaling"] = {"maxWorkers": 3}
    cluster.owners[("ai", "coder")] = copy.deepcopy(scaled)
    handlers.reconcile(body=kopf.Body(copy.deepcopy(scaled)), memo=memo, logger=LOG)
    read = copy.deepcopy(cluster.owners[("ai", "coder")])  # the operator's read ...
    planner = {"type": "Autoscaling", "status": "True", "reason": "MeetingTargets", "message": "2 workers"}
    cluster.owners[("ai", "coder")]["status"]["conditions"].append(planner)  # ... then the planner's write
    read["status"]["observedGeneration"] = 0  # the read is behind: the operator writes again
    handlers.reconcile(body=kopf.Body(read), memo=memo, logger=LOG)
    assert len(cluster.status_patches) == 2
    assert planner in cluster.owners[("ai", "coder")]["status"]["conditions"]
    static = copy.deepcopy(cluster.owners[("ai", "coder")])
    static["spec"].pop("autoscaling")
    handlers.reconcile(body=kopf.Body(static), memo=memo, logger=LOG)
    assert cluster.removed_conditions == ["Autoscaling"]
    assert planner not in cluster.owners[("ai", "coder")]["status"]["conditions"]


def test_resync_loop_survives_an_outage_and_repairs_drift_afterwards() -> None:
    from agentserve.operator.handlers import Resync

    cluster = FakeCluster()
    body = cr()
    cluster.owners[("ai", "coder")] = body
    state = State(cluster)
    resync = Resync(state, [], LOG, interval=0.05)
    assert resync.run_once() == 1
    assert kinds_of(cluster.applied).count("Deployment") == 3
    assert len(cluster.status_patches) == 1
    # At rest: nothing applied, no status write, no event.
    writes, events = len(cluster.writes), len(cluster.events)
    assert resync.run_once() == 1
    assert (
        len(cluster.writes) == writes and len(cluster.status_patches) == 1 and len(cluster.events) == events
    )
    # An outage: listing fails for many rounds; the loop keeps going and repairs drift afterwards.
    cluster.fail_list_owners = 5
    frontend = next(r for r in cluster.objects if r.kind == "Deployment" and r.name.endswith("frontend"))
    del cluster.objects[frontend]
    resync.start()
    try:
        deadline = time.monotonic() + 10
        while frontend not in cluster.objects and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        resync.stop()
    assert frontend in cluster.objects
    assert resync.rounds >= 6


def test_events_are_posted_for_outcomes_and_a_repeated_failure_once() -> None:
    from agentserve.operator.handlers import Resync

    cluster = FakeCluster()
    cluster.owners[("ai", "coder")] = cr()
    resync = Resync(State(cluster), [], LOG)
    resync.run_once()
    reasons = [e["reason"] for e in cluster.events]
    assert reasons[:2] == ["Created", "Applied"]  # the signing key, then the children
    applied = cluster.events[1]
    assert applied["involvedObject"]["kind"] == "AgentServingDeployment"
    assert applied["involvedObject"]["namespace"] == applied["metadata"]["namespace"] == "ai"
    assert "Deployment/coder-frontend" in applied["message"] and applied["type"] == "Normal"
    cluster.events.clear()
    cluster.fail_apply = "Deployment"
    frontend = next(r for r in cluster.objects if r.kind == "Deployment" and r.name.endswith("frontend"))
    del cluster.objects[frontend]
    for _ in range(3):
        resync.run_once()
    failures = [e for e in cluster.events if e["reason"] == "ReconcileError"]
    assert len(failures) == 1 and failures[0]["type"] == "Warning"
    assert "admission webhook denied" in failures[0]["message"]


def test_ensure_crd_applies_this_versions_crd_and_survives_a_refusal() -> None:
    from agentserve.operator.crd import crd
    from agentserve.operator.handlers import ensure_crd

    cluster = FakeCluster(kinds={*CHILD_KINDS, ("apiextensions.k8s.io/v1", "CustomResourceDefinition")})
    assert ensure_crd(cluster, LOG) is True
    (applied,) = [o for o in cluster.objects.values() if o["kind"] == "CustomResourceDefinition"]
    assert applied == crd()
    cluster.fail_apply = "CustomResourceDefinition"
    assert ensure_crd(cluster, LOG) is False  # logged; the operator keeps running


def test_status_at_rest_beside_the_planners_condition_is_not_written_again() -> None:
    from agentserve.operator.handlers import status_changed

    ready = {"type": "Ready", "status": "True", "reason": "AllComponentsReady"}
    prefill = {"type": "PrefillWorkersReady", "status": "True"}
    planner = {"type": "Autoscaling", "status": "True", "reason": "MeetingTargets"}
    ours = {"observedGeneration": 2, "conditions": [ready]}
    stored = {"status": {"observedGeneration": 2, "conditions": [planner, ready]}}
    assert not status_changed(stored, ours)  # the planner's condition beside ours: nothing to write
    moved = {"observedGeneration": 2, "conditions": [{**ready, "status": "False"}]}
    assert status_changed(stored, moved)
    assert status_changed({"status": {**stored["status"], "observedGeneration": 1}}, ours)
    # One of ours the CR still shows and we no longer write (the prefill pool was removed): a write,
    # which server-side apply turns into its removal.
    with_prefill = {"status": {"observedGeneration": 2, "conditions": [planner, ready, prefill]}}
    assert status_changed(with_prefill, ours)
