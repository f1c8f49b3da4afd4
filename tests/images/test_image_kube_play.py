"""The sim example's generated manifests (`agentserve manifests -f examples/sim.yaml`) under
`podman kube play` with the built image: frontend -> router -> worker pods with the operator's own
commands, args, env, config files, security context and probes (kubeplay.py says what stands in for
the cluster). A manifest whose command or config a container rejects fails here."""

from __future__ import annotations

import copy
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import kubeplay
import openai
import pytest
import yaml
from podman_harness import ROOT, Podman, wait_http

pytestmark = pytest.mark.images

EXAMPLE = ROOT / "examples" / "sim.yaml"
# A kubelet would wait failureThreshold x periodSeconds (a worker: 2 h); the sim starts in seconds.
PROBE_CAP_S = 120.0
ORDER = ("worker", "router", "frontend")  # a pod's Services exist before pods that call them


def generated(example: Path) -> list[kubeplay.Doc]:
    """What the operator applies for `example`, from the CLI that shares its code."""
    out = subprocess.run(
        [sys.executable, "-m", "agentserve", "manifests", "-f", str(example)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    ).stdout
    return kubeplay.load(out)


class Played:
    """Pods started from one manifest set: per component, (pod, container names, IP)."""

    def __init__(self) -> None:
        self.pods: dict[str, list[tuple[str, list[str], str]]] = {}

    def ips(self, component: str) -> list[str]:
        return [ip for _, _, ip in self.pods.get(component, [])]


def _watch(podman: Podman, pod: str, containers: list[str]) -> Callable[[], None]:
    """Fails as soon as a container of the pod is no longer running, with its log."""

    def alive() -> None:
        for name in containers:
            state = podman.out("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name)
            if not state.startswith("running"):
                logs = podman.run("logs", name, check=False)
                raise AssertionError(
                    f"{pod}/{name} is not running ({state}):\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}"
                )

    return alive


def play(podman: Podman, docs: list[kubeplay.Doc], tmp: Path) -> Played:
    run = secrets.token_hex(3)
    configmaps = kubeplay.by_kind(docs, "ConfigMap")
    secret_docs = kubeplay.by_kind(docs, "Secret") + kubeplay.signing_secrets(docs)
    services = kubeplay.by_kind(docs, "Service")
    deployments = {kubeplay.component(d): d for d in kubeplay.by_kind(docs, "Deployment")}
    assert set(deployments) == set(ORDER), sorted(deployments)
    aliases: dict[str, list[str]] = {}
    played = Played()
    for component in ORDER:
        deployment = deployments[component]
        namespace = deployment["metadata"].get("namespace", "default")
        maps = copy.deepcopy(configmaps)
        if component == "router":
            for cm in maps:
                if "router.yaml" in cm.get("data", {}):
                    cm["data"]["router.yaml"] = kubeplay.worker_urls_for(
                        cm["data"]["router.yaml"], docs, played.ips("worker")
                    )
        volume_dirs = write_volumes(deployment, maps, secret_docs, tmp / component)
        for replica in range(int(deployment["spec"].get("replicas", 1))):
            pod_doc = kubeplay.pod_document(
                deployment,
                image=podman.agentserve,
                replica=f"{run}-{replica}",
                host_aliases=aliases,
                volume_dirs=volume_dirs,
            )
            path = tmp / f"{pod_doc['metadata']['name']}.yaml"
            path.write_text(kubeplay.dump([pod_doc]))
            output = podman.out("kube", "play", str(path), timeout=180)
            match = re.search(r"Pod:\s*([0-9a-f]{64})", output)
            assert match, output
            pod = match.group(1)
            podman.played(pod)
            infra = podman.out("pod", "inspect", "--format", "{{.InfraContainerID}}", pod)
            names = [
                f"{podman.out('pod', 'inspect', '--format', '{{.Name}}', pod)}-{c['name']}"
                for c in pod_doc["spec"]["template"]["spec"]["containers"]
            ]
            played.pods.setdefault(component, []).append((pod, names, podman.ip(infra)))
        for service in services:
            if kubeplay.selects(service, deployment):
                kubeplay.check_service_ports(service, deployment)
                for ip in played.ips(component):
                    aliases.setdefault(ip, []).extend(kubeplay.service_names(service, namespace))
        # The next component starts once these pods pass their startup probes, as a rollout would.
        probe(podman, played, component, deployment, kinds=("startupProbe",))
    for component in ORDER:
        probe(podman, played, component, deployments[component], kinds=("livenessProbe", "readinessProbe"))
    return played


def write_volumes(
    deployment: kubeplay.Doc,
    configmaps: list[kubeplay.Doc],
    secret_docs: list[kubeplay.Doc],
    root: Path,
) -> dict[str, str]:
    """Each configMap and secret volume of a pod as a kubelet writes it: the files (defaultMode, group
    fsGroup) and the mountpoints of the mounts nested in it. Returns {object name: directory}."""
    pod = deployment["spec"]["template"]["spec"]
    group = (pod.get("securityContext") or {}).get("fsGroup")
    dirs: dict[str, str] = {}
    for volume in pod.get("volumes") or []:
        if "configMap" in volume:
            name, files = volume["configMap"]["name"], kubeplay.configmap_files(configmaps, volume)
            mode = volume["configMap"].get("defaultMode", 0o644)
            contents = {rel: text.encode() for rel, text in files.items()}
        elif "secret" in volume:
            name, contents = volume["secret"]["secretName"], kubeplay.secret_files(secret_docs, volume)
            mode = volume["secret"].get("defaultMode", 0o644)
        else:
            continue
        directory = root / name
        directory.mkdir(parents=True)
        for rel, content in contents.items():
            file = directory / rel
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(content)
            file.chmod(mode)
            if group is not None:
                os.chown(file, 0, int(group))
        for rel in kubeplay.nested_mountpoints(pod, volume["name"]):
            (directory / rel).mkdir(parents=True, exist_ok=True)
        dirs[name] = str(directory)
    return dirs


def probe(
    podman: Podman, played: Played, component: str, deployment: kubeplay.Doc, kinds: tuple[str, ...]
) -> None:
    """The kubelet's httpGet probes of each pod, against the pod IP, within the probes' budgets."""
    for pod, names, ip in played.pods[component]:
        for target in kubeplay.probe_targets(deployment):
            if target.kind in kinds:
                wait_http(
                    f"http://{ip}:{target.port}{target.path}",
                    min(target.budget_s, PROBE_CAP_S),
                    alive=_watch(podman, pod, names),
                )


def test_sim_manifests_serve_end_to_end(podman: Podman, tmp_path: Path) -> None:
    docs = generated(EXAMPLE)
    played = play(podman, docs, tmp_path)
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    assert len(played.ips("worker")) == spec["workers"]["replicas"]

    (frontend_ip,) = played.ips("frontend")
    (service,) = [s for s in kubeplay.by_kind(docs, "Service") if s["metadata"]["name"].endswith("-frontend")]
    base = f"http://{frontend_ip}:{service['spec']['ports'][0]['port']}"
    model = spec["model"]["name"]
    chat = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-none", max_retries=0).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "through the pods"}], max_tokens=64
    )
    assert "through the pods" in (chat.choices[0].message.content or "")  # the sim's echo policy
    message = anthropic.Anthropic(base_url=base, api_key="sk-none", max_retries=0).messages.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "and the Messages API"}]
    )
    assert message.content[-1].type == "text" and "and the Messages API" in message.content[-1].text

    # Both requests were placed by the router pod, on the worker pods it knows.
    (router_ip,) = played.ips("router")
    workers = httpx.get(f"http://{router_ip}:8100/workers", timeout=5).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(f"http://{ip}:8200" for ip in played.ips("worker"))
    metrics = httpx.get(f"http://{router_ip}:8100/metrics", timeout=5).text
    decisions = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("agentserve_router_decisions_total")
    )
    assert decisions >= 2, metrics


def _bad_flag(docs: list[kubeplay.Doc]) -> None:
    (worker,) = [d for d in kubeplay.by_kind(docs, "Deployment") if kubeplay.component(d) == "worker"]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--config")] = "--config-file"


def _bad_config(docs: list[kubeplay.Doc]) -> None:
    (config,) = kubeplay.by_kind(docs, "ConfigMap")
    frontend = yaml.safe_load(config["data"]["frontend.yaml"])
    frontend["router_address"] = frontend.pop("router_url")
    config["data"]["frontend.yaml"] = yaml.safe_dump(frontend)


@pytest.mark.parametrize(
    ("breaks", "says"),
    [(_bad_flag, "unrecognized arguments: --config-file"), (_bad_config, "router_address")],
    ids=["worker-flag", "frontend-config"],
)
def test_a_broken_manifest_fails(
    podman: Podman, tmp_path: Path, breaks: Callable[[list[kubeplay.Doc]], None], says: str
) -> None:
    docs = generated(EXAMPLE)
    breaks(docs)
    started = time.monotonic()
    with pytest.raises(AssertionError, match="is not running") as failure:
        play(podman, docs, tmp_path)
    assert says in str(failure.value)
    assert time.monotonic() - started < PROBE_CAP_S  # the exit is seen at once, not at a timeout
