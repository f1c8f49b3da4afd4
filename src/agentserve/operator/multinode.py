"""Workers spanning nodes: the pod templates of a LeaderWorkerSet group and the MPI launch (pure).

A model replica larger than one node (`workers.nodesPerWorker` > 1) is one LeaderWorkerSet group of
that many pods, one per node. TensorRT-LLM runs a multi-node LLM as one MPI job whose rank 0 owns the
API: its documented launch is `trtllm-llmapi-launch <command>` under an MPI launcher, where rank 0 runs
the command (here `agentserve worker`, which builds `LLM(...)` on the MPI world) and every other rank
serves it (`tensorrt_llm/llmapi/trtllm-llmapi-launch`, 1.2 line). Without Slurm the launcher is
`mpirun` over SSH, as NVIDIA Dynamo deploys TensorRT-LLM on LeaderWorkerSet (followers run a non-root
`sshd -D` on port 2222; the leader runs `mpirun --oversubscribe -n <nodes × GPUs> -H <hosts> --mca
pml ob1 --mca plm_rsh_args "-p 2222 …" -x <env>` with `OMPI_MCA_orte_keep_fqdn_hostnames=1`).

- the **leader** pod runs `agentserve mpi-launch`: it reads the group from the environment LWS
  injects (`LWS_LEADER_ADDRESS` `<lws>-<group>.<lws>.<ns>`, `LWS_GROUP_SIZE`), waits until every
  follower's sshd answers, then replaces itself with that `mpirun`; it keeps the worker's probes,
  ports and Service (the router sees one worker per group);
- a **follower** pod runs `agentserve mpi-follower` (sshd on 2222 with the deployment's key) and has no
  HTTP probes: it serves no API, and a rank that dies fails the MPI job, which fails the leader's
  probes, and LWS recreates the whole group (`RecreateGroupOnPodRestart`);
- the key pair is one Secret per deployment (`ssh_secret_to_create`), created once like the signing
  key, mounted read-only in both.
"""

from __future__ import annotations

import base64
import copy
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentserve.operator.build import CONFIG_DIR, Target, object_meta
from agentserve.operator.sshkeys import authorized_key, private_key

SSH_PORT = 2222
MPI_DIR = "/etc/agentserve/mpi"
KEY_FILE = "id_ed25519"
AUTHORIZED_KEYS = "authorized_keys"
LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
GROUP_SIZE = "LWS_GROUP_SIZE"
# Forwarded to every rank (mpirun -x): where the caches and the model live, as on the leader.
FORWARDED_ENV = (
    "HOME",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "PYTHONUNBUFFERED",
    "PATH",
    "LD_LIBRARY_PATH",
)


def ssh_secret_name(target: Target) -> str:
    return f"{target.name}-mpi-ssh"


def ssh_secret_to_create(target: Target, new_seed: Callable[[], bytes], check: int = 0) -> dict[str, Any]:
    """The key pair the leader's mpirun and the followers' sshd share (created once, never changed)."""
    seed = new_seed()
    comment = f"agentserve-{target.namespace}-{target.name}"
    data = {
        KEY_FILE: private_key(seed, comment, check),
        f"{KEY_FILE}.pub": authorized_key(seed, comment),
        AUTHORIZED_KEYS: authorized_key(seed, comment),
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(target, ssh_secret_name(target), "worker"),
        "type": "Opaque",
        "immutable": True,
        "data": {k: base64.b64encode(v.encode("ascii")).decode("ascii") for k, v in data.items()},
    }


def _group_pod(
    target: Target, template: Mapping[str, Any], command: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of the worker pod template running `command`, with the deployment's SSH key mounted read-only;
    the template and its container."""
    group_pod = copy.deepcopy(dict(template))
    pod = group_pod["spec"]
    pod["volumes"].append(
        {"name": "mpi-ssh", "secret": {"secretName": ssh_secret_name(target), "defaultMode": 0o400}}
    )
    for container in pod["containers"]:
        container["volumeMounts"].append({"name": "mpi-ssh", "mountPath": MPI_DIR, "readOnly": True})
    container = pod["containers"][0]
    container["command"], container["args"] = command[:2], command[2:]
    return group_pod, container


def leader_pod(target: Target, template: Mapping[str, Any]) -> dict[str, Any]:
    """The group leader: the worker pod, launched as rank 0 of the group's MPI job."""
    leader, _ = _group_pod(
        target, template, ["agentserve", "mpi-launch", "--config", posixpath.join(CONFIG_DIR, "worker.yaml")]
    )
    return leader


def follower_pod(target: Target, template: Mapping[str, Any]) -> dict[str, Any]:
    """A follower: the other ranks of the group, started by the leader's mpirun over SSH."""
    follower, container = _group_pod(
        target, template, ["agentserve", "mpi-follower", "--port", str(SSH_PORT)]
    )
    container["ports"] = [{"name": "mpi-ssh", "containerPort": SSH_PORT, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        container.pop(probe, None)
    # Ready once sshd listens: the leader's mpirun reaches it from then on.
    container["readinessProbe"] = {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 5, "failureThreshold": 3}
    return follower


# ------------------------------------------------------------------------------------- the launch


def group_hosts(leader_address: str, group_size: int) -> list[str]:
    """Every pod of the group by DNS name: the leader `<lws>-<g>.<lws>.<ns>`, then its followers
    `<lws>-<g>-<i>.<lws>.<ns>` (LWS names follower pods `<leader pod>-<i>` in the shared subdomain)."""
    pod, dot, domain = leader_address.partition(".")
    if not dot or group_size < 1:
        raise ValueError(f"{LEADER_ADDRESS}={leader_address!r} / {GROUP_SIZE}={group_size}: not an LWS group")
    return [leader_address] + [f"{pod}-{i}.{domain}" for i in range(1, group_size)]


def mpirun_argv(
    hosts: Sequence[str],
    gpus_per_node: int,
    command: Sequence[str],
    *,
    key_path: str,
    env_names: Sequence[str] = FORWARDED_ENV,
) -> list[str]:
    """The leader's mpirun: one rank per GPU of every host, over SSH on SSH_PORT, rank 0 on the leader
    running `command` through trtllm-llmapi-launch."""
    rsh = f"-p {SSH_PORT} -i {key_path} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    argv = [
        "mpirun",
        "--oversubscribe",
        "-n", str(len(hosts) * gpus_per_node),
        "-H", ",".join(f"{h}:{gpus_per_node}" for h in hosts),
        "--mca", "pml", "ob1",
        "--mca", "plm_rsh_args", rsh,
        "-x", "OMPI_MCA_orte_keep_fqdn_hostnames=1",
    ]  # fmt: skip
    for name in env_names:
        argv += ["-x", name]
    return [*argv, "trtllm-llmapi-launch", *command]


def sshd_config(port: int, host_key: str, authorized_keys: str, pid_file: str) -> str:
    """A non-root sshd for the group's ranks: key authentication only, this deployment's key."""
    return "\n".join(
        [
            f"Port {port}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {authorized_keys}",
            f"PidFile {pid_file}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "StrictModes no",  # the key files are on an emptyDir of the pod's own user
            "UsePAM no",
            "PermitUserEnvironment yes",
            "AcceptEnv *",
            "",
        ]
    )
