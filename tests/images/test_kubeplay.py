"""kubeplay's translation of the operator's manifests for podman (no podman needed): what it keeps,
what it stands in for, and the inconsistencies it refuses."""

from __future__ import annotations

import copy
import subprocess
import sys

import kubeplay
import pytest
import yaml
from podman_harness import ROOT


@pytest.fixture(scope="module")
def docs() -> list[kubeplay.Doc]:
    out = subprocess.run(
        [sys.executable, "-m", "agentserve", "manifests", "-f", str(ROOT / "examples" / "sim.yaml")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return kubeplay.load(out)


def _deployment(docs: list[kubeplay.Doc], component: str) -> kubeplay.Doc:
    (found,) = [d for d in kubeplay.by_kind(docs, "Deployment") if kubeplay.component(d) == component]
    return found


def test_pod_document_keeps_the_pod_template_but_image_ports_and_namespace_env(
    docs: list[kubeplay.Doc],
) -> None:
    original = _deployment(docs, "frontend")
    kept = copy.deepcopy(original)
    dirs = {"sim-config": "/run/cfg", "sim-signing-key": "/run/key"}
    played = kubeplay.pod_document(
        original, image="localhost/x:dev", replica=1, host_aliases={"10.0.0.2": ["r"]}, volume_dirs=dirs
    )
    assert original == kept  # pure
    assert (
        played["metadata"]["name"] == f"{original['metadata']['name']}-1" and played["spec"]["replicas"] == 1
    )
    (container,) = played["spec"]["template"]["spec"]["containers"]
    (before,) = original["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/x:dev" and container["imagePullPolicy"] == "Never"
    assert "ports" not in container
    for key in ("command", "args", "volumeMounts", "securityContext", "livenessProbe", "readinessProbe"):
        assert container[key] == before[key]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"] == {"name": "POD_NAMESPACE", "value": original["metadata"]["namespace"]}
    assert env["POD_NAME"] == next(e for e in before["env"] if e["name"] == "POD_NAME")
    assert played["spec"]["template"]["spec"]["hostAliases"] == [{"ip": "10.0.0.2", "hostnames": ["r"]}]
    replaced = {"containers", "hostAliases", "volumes"}
    template = {k: v for k, v in played["spec"]["template"]["spec"].items() if k not in replaced}
    assert template == {k: v for k, v in original["spec"]["template"]["spec"].items() if k not in replaced}


def test_config_and_secret_volumes_become_the_kubelets_files(docs: list[kubeplay.Doc]) -> None:
    frontend = _deployment(docs, "frontend")
    pod = frontend["spec"]["template"]["spec"]
    dirs = {"sim-config": "/c", "sim-signing-key": "/k"}
    played = kubeplay.pod_document(frontend, image="i", replica=0, host_aliases={}, volume_dirs=dirs)
    volumes = {v["name"]: v for v in played["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"] == {"name": "config", "hostPath": {"path": "/c", "type": "Directory"}}
    assert volumes["signing-key"] == {"name": "signing-key", "hostPath": {"path": "/k", "type": "Directory"}}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    with pytest.raises(kubeplay.PlayError, match="no directory for configMap sim-config"):
        kubeplay.pod_document(frontend, image="i", replica=0, host_aliases={}, volume_dirs={})
    # The key's mount sits inside the read-only config volume: the kubelet makes its mountpoint.
    assert kubeplay.nested_mountpoints(pod, "config") == ["signing"]
    assert kubeplay.nested_mountpoints(pod, "tmp") == []
    configs = kubeplay.by_kind(docs, "ConfigMap")
    (config_volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert set(kubeplay.configmap_files(configs, config_volume)) >= {"frontend.yaml", "router.yaml"}
    (secret_volume,) = [v for v in pod["volumes"] if "secret" in v]
    made = kubeplay.signing_secrets(docs)
    files = kubeplay.secret_files(made, secret_volume)
    assert files == {"signing-key": made[0]["stringData"]["signing-key"].encode()}


def test_router_discovery_becomes_the_worker_pods_urls(docs: list[kubeplay.Doc]) -> None:
    (config,) = kubeplay.by_kind(docs, "ConfigMap")
    router_yaml = config["data"]["router.yaml"]
    rewritten = yaml.safe_load(kubeplay.worker_urls_for(router_yaml, docs, ["10.1.0.5", "10.1.0.6"]))
    assert rewritten["workers"] == ["http://10.1.0.5:8200", "http://10.1.0.6:8200"]
    assert "discovery" not in rewritten and "worker_service" not in rewritten
    kept = {
        k: v
        for k, v in yaml.safe_load(router_yaml).items()
        if k not in {"discovery", "worker_service", "namespace"}
    }
    assert {k: v for k, v in rewritten.items() if k != "workers"} == kept
    # A static router config is played as written.
    assert kubeplay.worker_urls_for("workers: [http://a:1]\n", docs, ["x"]) == "workers: [http://a:1]\n"


def test_a_router_pointed_at_the_wrong_service_is_refused(docs: list[kubeplay.Doc]) -> None:
    (config,) = kubeplay.by_kind(docs, "ConfigMap")
    wrong = yaml.safe_load(config["data"]["router.yaml"])
    wrong["worker_service"] = "sim-router"
    with pytest.raises(kubeplay.PlayError, match="does not select the worker pods"):
        kubeplay.worker_urls_for(yaml.safe_dump(wrong), docs, ["10.1.0.5"])
    wrong["worker_service"] = "nope"
    with pytest.raises(kubeplay.PlayError, match="no Service"):
        kubeplay.worker_urls_for(yaml.safe_dump(wrong), docs, ["10.1.0.5"])


def test_service_ports_must_be_the_container_ports_they_target(docs: list[kubeplay.Doc]) -> None:
    for service in kubeplay.by_kind(docs, "Service"):
        (deployment,) = [d for d in kubeplay.by_kind(docs, "Deployment") if kubeplay.selects(service, d)]
        kubeplay.check_service_ports(service, deployment)
        moved = copy.deepcopy(service)
        moved["spec"]["ports"][0]["port"] = 80
        with pytest.raises(kubeplay.PlayError, match="kube-proxy"):
            kubeplay.check_service_ports(moved, deployment)
        moved["spec"]["ports"][0]["targetPort"] = "nope"
        with pytest.raises(kubeplay.PlayError, match="no container port"):
            kubeplay.check_service_ports(moved, deployment)


def test_probe_targets_resolve_named_ports(docs: list[kubeplay.Doc]) -> None:
    probes = kubeplay.probe_targets(_deployment(docs, "worker"))
    assert {(p.kind, p.port, p.path) for p in probes} == {
        ("startupProbe", 8200, "/ready"),
        ("livenessProbe", 8200, "/health"),
        ("readinessProbe", 8200, "/ready"),
    }
    broken = copy.deepcopy(_deployment(docs, "worker"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = "metrics"
    with pytest.raises(kubeplay.PlayError, match="port metrics is no container port"):
        kubeplay.probe_targets(broken)


def test_the_signing_key_secret_is_made_as_the_operator_would(docs: list[kubeplay.Doc]) -> None:
    (made,) = kubeplay.signing_secrets(docs)
    (key,) = made["stringData"].values()
    assert made["metadata"]["name"].endswith("-signing-key") and len(bytes.fromhex(key)) == 32
    assert kubeplay.signing_secrets([*docs, made]) == []  # one that exists is used as it is


def test_service_names_cover_cluster_dns_forms() -> None:
    service = {"metadata": {"name": "sim-router"}}
    assert kubeplay.service_names(service, "agents") == [
        "sim-router",
        "sim-router.agents",
        "sim-router.agents.svc",
        "sim-router.agents.svc.cluster.local",
    ]
