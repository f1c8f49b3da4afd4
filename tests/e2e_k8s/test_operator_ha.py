"""Operator high availability: two replicas peered through the chart's ClusterKopfPeering; one is
active, the other stands by and takes over when the active one is killed."""

from __future__ import annotations

import signal
import time

import yaml
from k8s_e2e import Operator, condition, wait_for

PAUSED = "Pausing operations in favour of"
RESUMED = "Resuming operations after the pause"

CR = {
    "apiVersion": "agentserve.dev/v1alpha1",
    "kind": "AgentServingDeployment",
    "metadata": {"name": "ha", "namespace": "ha"},
    "spec": {"model": {"name": "agentserve-sim"}, "workers": {"engine": "sim", "replicas": 1}},
}


def test_a_standby_replica_takes_over_when_the_active_one_is_killed(operator: Operator) -> None:
    kube = operator.kube
    kube.ensure_namespace("ha")
    operator.stop()  # the suite's standalone operator would ignore peering
    work = operator.log.parent
    replicas = [
        Operator(
            kube,
            operator.kubeconfig,
            work / f"ha-{i}.log",
            args=("--peering=agentserve", "--resync-seconds=5"),
        )
        for i in range(2)
    ]
    try:
        replicas[0].start()
        time.sleep(3)  # the first one registers and is active alone
        replicas[1].start()
        try:
            standby = wait_for(
                lambda: next((r for r in replicas if PAUSED in r.text()), None), 60, "one replica to stand by"
            )
        except AssertionError:
            print(_peering_lines(replicas), kube.get("clusterkopfpeering", "agentserve"))
            raise
        active = next(r for r in replicas if r is not standby)
        assert PAUSED not in active.text()
        peering = kube.get("clusterkopfpeering", "agentserve")
        assert peering is not None and len(peering.get("status") or {}) == 2

        kube.apply_yaml(yaml.safe_dump(CR))
        wait_for(
            lambda: condition(kube.get("asd", "ha", "ha"), "Ready").get("status") == "True",
            90,
            "ha Ready",
            0.3,
        )

        # Count, not presence: a keepalive that comes late on a loaded machine can make the standby
        # resume and pause again before the kill, and that earlier line is not the takeover.
        resumed_before = standby.text().count(RESUMED)
        killed = time.monotonic()
        active.stop(signal.SIGKILL)  # no goodbye: the standby waits out the peer's 15 s lifetime
        try:
            wait_for(
                lambda: standby.text().count(RESUMED) > resumed_before,
                45,
                "the standby to resume",
                interval=0.2,
            )
        except AssertionError:
            print(_peering_lines(replicas))
            raise
        takeover = time.monotonic() - killed
        print(f"standby took over {takeover:.1f} s after the active replica was killed")
        assert takeover <= 30

        generation = kube.get("deployment", "ha-router", "ha")["metadata"]["generation"]
        kube.merge_patch("ha", "ha", {"spec": {"router": {"temperature": 0.5}}})
        wait_for(
            lambda: kube.get("deployment", "ha-router", "ha")["metadata"]["generation"] > generation,
            10,
            "the new active replica to follow a spec change",
            interval=0.1,
        )
    finally:
        for replica in replicas:
            replica.stop()
        kube.kubectl("delete", "asd", "ha", "-n", "ha", "--wait=false", check=False)
        operator.start()


def _peering_lines(replicas: list[Operator]) -> str:
    """The peering decisions of each replica, for a failure message."""
    words = ("Pausing", "Resuming", "peering", "Peering", "priority")
    return "\n".join(
        f"[ha-{i}] {line}"
        for i, replica in enumerate(replicas)
        for line in replica.text().splitlines()
        if any(word in line for word in words)
    )
