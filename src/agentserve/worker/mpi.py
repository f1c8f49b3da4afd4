"""The two processes of a worker spanning nodes (docs/kubernetes.md, "Workers spanning nodes").

`agentserve mpi-launch` on a group's leader waits until every follower's sshd answers, then replaces
itself with `mpirun … trtllm-llmapi-launch agentserve worker --config FILE` (rank 0 serves the API,
the other ranks serve rank 0). `agentserve mpi-follower` on each follower runs sshd, non-root, on the
deployment's key. The argv and the sshd configuration are built by `agentserve.operator.multinode`
(pure, unit-tested); this module only copies keys, waits and execs.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path

from agentserve.config import ConfigError, WorkerConfig, load_config
from agentserve.operator.multinode import (
    AUTHORIZED_KEYS,
    GROUP_SIZE,
    KEY_FILE,
    LEADER_ADDRESS,
    MPI_DIR,
    SSH_PORT,
    group_hosts,
    mpirun_argv,
    sshd_config,
)

FOLLOWER_WAIT_S = 900.0  # followers' images pull and start in parallel with the leader's


def _private_copy(source: Path, target: Path) -> Path:
    """ssh refuses keys others can read; a Secret volume file is group-readable under fsGroup."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copyfile(source, target)
    target.chmod(0o600)
    return target


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def launch(config_path: str, *, wait_s: float = FOLLOWER_WAIT_S) -> int:
    try:
        config = load_config(WorkerConfig, Path(config_path))
        hosts = group_hosts(os.environ.get(LEADER_ADDRESS, ""), int(os.environ.get(GROUP_SIZE, "0")))
    except (ConfigError, ValueError) as exc:
        print(f"agentserve mpi-launch: {exc}", file=sys.stderr)
        return 2
    home = Path(os.environ.get("HOME", "/tmp"))
    key = _private_copy(Path(MPI_DIR) / KEY_FILE, home / ".ssh" / KEY_FILE)
    deadline = time.monotonic() + wait_s
    waiting = list(hosts[1:])
    while waiting:
        waiting = [h for h in waiting if not _reachable(h, SSH_PORT)]
        if waiting and time.monotonic() > deadline:
            print(
                f"agentserve mpi-launch: followers not reachable after {wait_s:.0f} s: {waiting}",
                file=sys.stderr,
            )
            return 1
        if waiting:
            print(
                f"agentserve mpi-launch: waiting for {len(waiting)} follower(s): {waiting[0]} …", flush=True
            )
            time.sleep(2)
    gpus = config.gpus_per_node or config.tensor_parallel_size * config.pipeline_parallel_size // len(hosts)
    argv = mpirun_argv(hosts, gpus, ["agentserve", "worker", "--config", config_path], key_path=str(key))
    print("agentserve mpi-launch: " + " ".join(argv), flush=True)
    os.execvp(argv[0], argv)
    return 1  # not reached


def follower(port: int = SSH_PORT) -> int:
    run = Path(os.environ.get("HOME", "/tmp")) / ".mpi"
    host_key = _private_copy(Path(MPI_DIR) / KEY_FILE, run / "host_key")
    authorized = _private_copy(Path(MPI_DIR) / AUTHORIZED_KEYS, run / AUTHORIZED_KEYS)
    config = run / "sshd_config"
    config.write_text(
        sshd_config(port, str(host_key), str(authorized), str(run / "sshd.pid")), encoding="utf-8"
    )
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    argv = [sshd, "-D", "-e", "-f", str(config)]
    print("agentserve mpi-follower: " + " ".join(argv), flush=True)
    os.execv(sshd, argv)
    return 1  # not reached
