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
        # With mandatory peering kopf starts paused and resumes only when it is the top priority,
        # so a replica is active when it has resumed more often than it paused; the one that
        # started as the lower priority never logs a pause at all.
        try:
            active, standby = wait_for(lambda: _settled_roles(replicas), 60, "one active and one standby")
        except AssertionError:
            print(_peering_lines(replicas), kube.get("clusterkopfpeering", "agentserve"))
            raise
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


def _is_active(replica: Operator) -> bool:
    text = replica.text()
    return text.count(RESUMED) > text.count(PAUSED)


def _roles(replicas: list[Operator]) -> tuple[Operator, Operator] | None:
    """(active, standby) once exactly one replica is active and both have registered."""
    active = [r for r in replicas if _is_active(r)]
    standby = [r for r in replicas if not _is_active(r)]
    if len(active) != 1 or len(standby) != 1:
        return None
    peering = active[0].kube.get("clusterkopfpeering", "agentserve")
    return (active[0], standby[0]) if len((peering or {}).get("status") or {}) == 2 else None


def _settled_roles(replicas: list[Operator], settle: float = 5.0) -> tuple[Operator, Operator] | None:
    """The roles, once they held for `settle` seconds: a replica that registers with a higher
    priority takes over from the one that was active alone a moment later, not at once."""
    first = _roles(replicas)
    if first is None:
        return None
    time.sleep(settle)
    return first if _roles(replicas) == first else None


def _peering_lines(replicas: list[Operator]) -> str:
    """The peering decisions of each replica, for a failure message."""
    words = ("Pausing", "Resuming", "peering", "Peering", "priority")
    return "\n".join(
        f"[ha-{i}] {line}"
        for i, replica in enumerate(replicas)
        for line in replica.text().splitlines()
        if any(word in line for word in words)
    )
