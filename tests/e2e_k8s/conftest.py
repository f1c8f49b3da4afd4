"""Fixtures of the e2e suite on a real control plane; helpers and the story in k8s_e2e.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_e2e import (
    CHART,
    OPERATOR_NS,
    OPERATOR_SA,
    RELEASE,
    ROOT,
    Kube,
    Operator,
    k8s_local,
    missing_prerequisite,
    skip_or_fail,
    wait_for,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    reason = missing_prerequisite()
    if reason:
        skip_or_fail(reason)
    run = tmp_path_factory.mktemp("k8s-run")
    cluster = k8s_local.Cluster(run=run)
    try:
        cluster.up(b200_nodes=8, cpu_nodes=3)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path), "HOME": str(run)}
        yield Kube(cluster, cluster.kubeconfig_path, env)
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def chart(kube: Kube) -> Kube:
    """The chart installed with the real helm (RBAC, ServiceAccount; its crds/), after the CRD was
    applied from the repository's crds/ the way docs/kubernetes.md shows without the chart."""
    kube.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    result = kube.helm(
        "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
        "--set", "test.enabled=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    wait_for(
        lambda: kube.get("crd", "agentservingdeployments.agentserve.dev"),
        30,
        "the CRD",
    )
    wait_for(
        lambda: "Established" in kube.kubectl(
            "get", "crd", "agentservingdeployments.agentserve.dev",
            "-o", "jsonpath={.status.conditions[?(@.status=='True')].type}",
        ),
        30,
        "the CRD to be established",
    )  # fmt: skip
    return kube


@pytest.fixture(scope="session")
def operator(chart: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    work = tmp_path_factory.mktemp("operator")
    config = chart.token_kubeconfig(OPERATOR_NS, OPERATOR_SA, work / "kubeconfig")
    op = Operator(chart, config, work / "operator.log", args=("--manage-crd", "--resync-seconds=5"))
    op.start()
    try:
        yield op
    finally:
        op.stop()
        forbidden = [line for line in op.text().splitlines() if "403" in line or "Forbidden" in line]
        if forbidden:
            print("operator log lines with Forbidden:\n" + "\n".join(forbidden[:20]))
