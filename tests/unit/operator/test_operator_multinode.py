"""Workers spanning nodes: the LeaderWorkerSet group, its pods' MPI launch, the SSH key, and what the
operator does when LeaderWorkerSet is not installed (the cluster behaviour is in
tests/e2e_k8s/test_multinode.py, with the real LWS controller)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_operator_build import get, objects
from test_operator_reconcile import NOW, FakeCluster, conditions, cr, keys

from agentserve.operator.build import CHILD_KINDS, LWS_EXCLUSIVE_TOPOLOGY, LWS_WORKER_INDEX
from agentserve.operator.handlers import sync
from agentserve.operator.multinode import SSH_PORT, group_hosts, mpirun_argv, sshd_config
from agentserve.operator.reconcile import ObjectRef
from agentserve.operator.spec import AgentServingDeploymentSpec
from agentserve.operator.sshkeys import authorized_key, private_key, public_key
from kubecheck import assert_valid

TP16 = {"workers": {"tensorParallelSize": 16, "replicas": 2}, "nodePool": {"topologyKey": "example.com/rack"}}


def _containers(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return dict(container)


def test_a_replica_over_two_nodes_is_a_leaderworkerset_group() -> None:
    objs = objects(TP16, uid="uid-1")
    assert_valid(objs)
    assert not [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "coder-worker"]
    group = get(objs, "LeaderWorkerSet", "coder-lws")
    assert group["metadata"]["annotations"] == {LWS_EXCLUSIVE_TOPOLOGY: "example.com/rack"}
    assert group["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    spec = group["spec"]
    assert spec["replicas"] == 2 and spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 1}
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, follower = _containers(lwt["leaderTemplate"]), _containers(lwt["workerTemplate"])
    assert leader["command"] == ["agentserve", "mpi-launch"]
    assert leader["args"] == ["--config", "/etc/agentserve/worker.yaml"]
    assert leader["readinessProbe"]["httpGet"]["path"] == "/ready"  # the worker the router sees
    assert follower["command"] == ["agentserve", "mpi-follower"]
    assert "startupProbe" not in follower and "livenessProbe" not in follower
    assert follower["readinessProbe"] == {
        "tcpSocket": {"port": SSH_PORT},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        pod = template["spec"]
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B200"
        assert _containers(template)["resources"]["limits"]["nvidia.com/gpu"] == 8  # a whole node each
        secret = next(v for v in pod["volumes"] if v["name"] == "mpi-ssh")
        assert secret["secret"]["secretName"] == "coder-mpi-ssh"
    # The router sees one worker per group: the Service selects leaders.
    service = get(objs, "Service", "coder-worker")
    assert service["spec"]["selector"][LWS_WORKER_INDEX] == "0"
    assert get(objs, "PodDisruptionBudget", "coder-worker")["spec"]["maxUnavailable"] == 2


def test_one_node_stays_a_deployment() -> None:
    objs = objects({"workers": {"tensorParallelSize": 8}})
    assert get(objs, "Deployment", "coder-worker")["spec"]["replicas"] == 1
    assert not [o for o in objs if o["kind"] == "LeaderWorkerSet"]
    assert LWS_WORKER_INDEX not in get(objs, "Service", "coder-worker")["spec"]["selector"]


@pytest.mark.parametrize(
    ("workers", "node_pool", "nodes", "gpus"),
    [
        ({"tensorParallelSize": 16}, {}, 2, 8),
        ({"tensorParallelSize": 8, "pipelineParallelSize": 4}, {}, 4, 8),
        ({"tensorParallelSize": 8, "pipelineParallelSize": 2}, {"gpusPerNode": 4}, 4, 4),
        ({"tensorParallelSize": 4}, {}, 1, 4),
        ({"tensorParallelSize": 16, "nodesPerWorker": 2}, {}, 2, 8),
    ],
)
def test_nodes_and_gpus_per_pod_are_derived(
    workers: dict[str, Any], node_pool: dict[str, Any], nodes: int, gpus: int
) -> None:
    spec = AgentServingDeploymentSpec.model_validate(
        {
            "model": {"name": "m", "source": {"hostPath": {"path": "/m"}}},
            "workers": workers,
            "nodePool": node_pool,
        }
    )
    assert (spec.resolved_nodes_per_worker(), spec.resolved_gpus_per_worker()) == (nodes, gpus)


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        ({"tensorParallelSize": 12}, "set workers.nodesPerWorker"),
        ({"tensorParallelSize": 16, "nodesPerWorker": 3}, "use 2"),
        ({"tensorParallelSize": 16, "nodesPerWorker": 4}, "use 2"),  # could fit on fewer
        ({"tensorParallelSize": 4, "nodesPerWorker": 1, "pipelineParallelSize": 4}, "use 2"),
    ],
)
def test_a_group_that_does_not_fill_its_nodes_is_refused_with_what_to_change(
    workers: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AgentServingDeploymentSpec.model_validate(
            {"model": {"name": "m", "source": {"hostPath": {"path": "/m"}}}, "workers": workers}
        )


def test_the_leaders_mpirun_spans_every_gpu_of_the_group() -> None:
    hosts = group_hosts("coder-lws-1.coder-lws.ai", 3)
    assert hosts == ["coder-lws-1.coder-lws.ai", "coder-lws-1-1.coder-lws.ai", "coder-lws-1-2.coder-lws.ai"]
    argv = mpirun_argv(hosts, 8, ["agentserve", "worker", "--config", "w.yaml"], key_path="/k")
    assert argv[:4] == ["mpirun", "--oversubscribe", "-n", "24"]
    assert argv[argv.index("-H") + 1] == ",".join(f"{h}:8" for h in hosts)
    assert f"-p {SSH_PORT} -i /k" in argv[argv.index("plm_rsh_args") + 1]
    assert "OMPI_MCA_orte_keep_fqdn_hostnames=1" in argv
    assert argv[-5:] == ["trtllm-llmapi-launch", "agentserve", "worker", "--config", "w.yaml"]
    with pytest.raises(ValueError):
        group_hosts("", 2)
    config = sshd_config(SSH_PORT, "/h/key", "/h/authorized_keys", "/h/pid")
    assert f"Port {SSH_PORT}" in config and "PasswordAuthentication no" in config


def test_ed25519_matches_rfc8032_and_openssh() -> None:
    # RFC 8032, 7.1, TEST 1.
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    assert public_key(seed).hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen (OpenSSH) is not installed")
def test_openssh_reads_the_private_key_and_derives_the_same_public_key(tmp_path: Path) -> None:
    seed = os.urandom(32)
    path = tmp_path / "id_ed25519"
    path.write_text(private_key(seed, "agentserve-test", 0x1234ABCD))
    path.chmod(0o600)
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True
    )
    assert derived.stdout.split()[:2] == authorized_key(seed, "x").split()[:2]


MULTINODE_CR = {
    "model": {"name": "m", "source": {"hostPath": {"path": "/m"}}},
    "workers": {"tensorParallelSize": 16},
}


def test_without_leaderworkerset_installed_nothing_is_applied_and_the_condition_says_why() -> None:
    cluster = FakeCluster(kinds={k for k in CHILD_KINDS if k[1] != "LeaderWorkerSet"} | {("v1", "Secret")})
    result = sync(cluster, cr(MULTINODE_CR), NOW, new_key=keys(1, 2))
    assert cluster.writes == [] and cluster.created == []
    ready = conditions(result.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "LeaderWorkerSetNotInstalled"
    assert "sigs.k8s.io/lws" in ready["message"] and "nothing was applied" in ready["message"]
    assert cluster.rechecked == ["leaderworkerset.x-k8s.io/v1"]  # asked again, not after a minute


def test_with_leaderworkerset_the_group_and_its_key_are_made_once() -> None:
    cluster = FakeCluster()
    sync(cluster, cr(MULTINODE_CR), NOW, new_key=keys(1, 2))
    secret_ref = ObjectRef("v1", "Secret", "ai", "coder-mpi-ssh")
    assert secret_ref in cluster.created
    data = cluster.objects[secret_ref]["data"]
    public = base64.b64decode(data["authorized_keys"]).decode()
    assert (
        public.startswith("ssh-ed25519 ") and "PRIVATE KEY" in base64.b64decode(data["id_ed25519"]).decode()
    )
    assert ObjectRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "ai", "coder-lws") in cluster.applied
    sync(cluster, cr(MULTINODE_CR), NOW, new_key=keys(3, 4))  # a second reconcile keeps the first key
    assert base64.b64decode(cluster.objects[secret_ref]["data"]["authorized_keys"]).decode() == public


def test_the_groups_counts_are_the_workers_status() -> None:
    cluster = FakeCluster()
    sync(cluster, cr(MULTINODE_CR), NOW, new_key=keys(1, 2))
    cluster.deployments_ready()
    group = cluster.objects[ObjectRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "ai", "coder-lws")]
    group["metadata"]["generation"] = 1
    group["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        # An LWS says Progressing=False once settled: not a stuck rollout.
        "conditions": [{"type": "Progressing", "status": "False", "reason": "GroupsProgressing"}],
    }
    status = sync(cluster, cr(MULTINODE_CR), NOW, new_key=keys(3, 4)).status
    assert conditions(status)["WorkersReady"]["status"] == "True"
    assert status["workers"]["readyReplicas"] == 1 and status["replicas"] == 1
    assert status["selector"].endswith(f"{LWS_WORKER_INDEX}=0")  # HPA counts leaders: one per group
