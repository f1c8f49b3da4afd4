"""Runs the operator's generated manifests under `podman kube play`, changing only what needs a cluster.

`agentserve manifests` prints the objects the operator applies. Podman plays Pods/Deployments with
their ConfigMaps and Secrets, exactly as written: command, args, env, probes' targets, security
context, volumes and the config files. What a cluster would add, the harness supplies, and nothing else:

- Services: podman has no kube-proxy or cluster DNS. Every Service name a pod may resolve
  (`NAME`, `NAME.NS`, `NAME.NS.svc`, `NAME.NS.svc.cluster.local`) becomes a hostAlias to the pod
  IP of its selected pods, after checking that the Service's port is the container port it targets
  (so no port translation is needed).
- The router's EndpointSlice discovery (`discovery: kubernetes`) needs an API server: its
  ConfigMap entry is rewritten to the static list of the worker pods' URLs - what the EndpointSlices
  of `worker_service` would list - after checking that `worker_service` is the Service whose selector
  picks the worker pods.
- The signing-key Secret the operator creates at runtime (32 random bytes, hex) is made here.
- The image: the locally built one, never pulled; a Deployment's `replicas` become that many plays.
- The kubelet's probes: `probe_targets` lists each container's httpGet probes for the test to call.

Everything here is pure (documents in, documents out); tests/images/test_image_kube_play.py does I/O.
"""

from __future__ import annotations

import base64
import copy
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

Doc = dict[str, Any]
COMPONENT = "app.kubernetes.io/component"
# Kinds podman plays. Everything else needs a cluster (RBAC, PDBs, NetworkPolicy) or is replaced
# by the harness (Services: hostAliases; the router's ServiceAccount: static discovery).
PLAYED = {"ConfigMap", "Secret", "Deployment"}


class PlayError(ValueError):
    """The manifests are inconsistent in a way a cluster would also trip over."""


@dataclass(frozen=True)
class Probe:
    container: str
    kind: str  # startupProbe | livenessProbe | readinessProbe
    port: int
    path: str
    budget_s: float  # failureThreshold x periodSeconds: how long a kubelet would wait


def load(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: Iterable[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc.get("kind") == kind]


def component(deployment: Mapping[str, Any]) -> str:
    return str(deployment["spec"]["template"]["metadata"]["labels"][COMPONENT])


def selects(service: Mapping[str, Any], deployment: Mapping[str, Any]) -> bool:
    selector = service["spec"].get("selector") or {}
    labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_ports(deployment: Mapping[str, Any]) -> dict[str, int]:
    """Named container ports of a pod template (name -> number), and each number by itself."""
    ports: dict[str, int] = {}
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        for port in container.get("ports") or []:
            ports[str(port["containerPort"])] = int(port["containerPort"])
            if "name" in port:
                ports[str(port["name"])] = int(port["containerPort"])
    return ports


def check_service_ports(service: Mapping[str, Any], deployment: Mapping[str, Any]) -> None:
    """A hostAlias sends the Service's port straight to the pod: it must be the port it targets."""
    ports = container_ports(deployment)
    for port in service["spec"].get("ports") or []:
        target = str(port.get("targetPort", port["port"]))
        if target not in ports:
            raise PlayError(
                f"Service {service['metadata']['name']}: targetPort {target} is no container port"
            )
        if ports[target] != int(port["port"]):
            raise PlayError(
                f"Service {service['metadata']['name']}: port {port['port']} -> {ports[target]} needs"
                " kube-proxy's translation, which the podman harness does not do"
            )


def service_names(service: Mapping[str, Any], namespace: str) -> list[str]:
    name = service["metadata"]["name"]
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def signing_secrets(docs: list[Doc]) -> list[Doc]:
    """The Secrets pods mount that the manifests do not carry: the operator creates them at runtime
    (the frontends' signing key: 32 random bytes as hex under the mounted key)."""
    have = {doc["metadata"]["name"] for doc in by_kind(docs, "Secret")}
    made: list[Doc] = []
    for deployment in by_kind(docs, "Deployment"):
        for volume in deployment["spec"]["template"]["spec"].get("volumes") or []:
            secret = volume.get("secret")
            if not secret or secret["secretName"] in have:
                continue
            keys = [item["key"] for item in secret.get("items") or []] or ["signing-key"]
            made.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": secret["secretName"]},
                    "stringData": {key: secrets.token_hex(32) for key in keys},
                }
            )
            have.add(secret["secretName"])
    return made


def worker_urls_for(router_yaml: str, docs: list[Doc], worker_ips: list[str]) -> str:
    """router.yaml with EndpointSlice discovery replaced by the workers' URLs (same port: the Service's
    `http` port, the one EndpointSlices carry)."""
    config = yaml.safe_load(router_yaml) or {}
    if config.get("discovery") != "kubernetes":
        return router_yaml  # already static: played as written
    service_name = config.get("worker_service")
    services = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == service_name]
    if not services:
        raise PlayError(f"router.yaml: worker_service {service_name!r} is no Service in the manifests")
    workers = [d for d in by_kind(docs, "Deployment") if selects(services[0], d)]
    if not workers or any(component(d) != "worker" for d in workers):
        raise PlayError(f"router.yaml: Service {service_name!r} does not select the worker pods")
    http = [p for p in services[0]["spec"]["ports"] if p.get("name") == "http"]
    if not http:
        raise PlayError(f"Service {service_name!r} has no http port for the router")
    port = int(http[0]["port"])
    del config["discovery"]
    config.pop("worker_service", None)
    config.pop("namespace", None)
    config["workers"] = [f"http://{ip}:{port}" for ip in worker_ips]
    return yaml.safe_dump(config, sort_keys=False)


def secret_files(secret_docs: Iterable[Doc], volume: Mapping[str, Any]) -> dict[str, bytes]:
    """The files a kubelet writes for a secret volume: each item's key at its path (all keys if none)."""
    source = volume["secret"]
    (secret,) = [d for d in secret_docs if d["metadata"]["name"] == source["secretName"]]
    values = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    values.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    items = source.get("items") or [{"key": key, "path": key} for key in values]
    return {item["path"]: values[item["key"]] for item in items}


def configmap_files(configmaps: Iterable[Doc], volume: Mapping[str, Any]) -> dict[str, str]:
    """The files a kubelet writes for a configMap volume: each item's key at its path (all if none)."""
    source = volume["configMap"]
    (cm,) = [d for d in configmaps if d["metadata"]["name"] == source["name"]]
    data = cm.get("data") or {}
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    return {item["path"]: data[item["key"]] for item in items}


def nested_mountpoints(pod: Mapping[str, Any], volume: str) -> list[str]:
    """Directories the kubelet makes inside a read-only volume for mounts below it
    (kubelet's makeNestedMountpoints): without them the runtime cannot mount there."""
    out: set[str] = set()
    for container in pod["containers"]:
        mounts = container.get("volumeMounts") or []
        for outer in (m for m in mounts if m["name"] == volume):
            base = outer["mountPath"].rstrip("/") + "/"
            out.update(m["mountPath"][len(base) :] for m in mounts if m["mountPath"].startswith(base))
    return sorted(out)


def pod_document(
    deployment: Doc,
    *,
    image: str,
    replica: str | int,
    host_aliases: Mapping[str, list[str]],
    volume_dirs: Mapping[str, str] | None = None,
) -> Doc:
    """One Deployment replica as podman plays it: the locally built image, never pulled, one replica,
    hostAliases for the Services; the pod template otherwise untouched. Secret and configMap volumes
    become hostPaths of the directories `volume_dirs` names (by Secret/ConfigMap name), holding the
    files a kubelet would write: podman 4.3's kube play crashes on secret volumes (a nil dereference
    in VolumeFromSecret) and does not make the mountpoints of nested mounts as a kubelet does (the
    signing key is mounted inside the read-only config volume)."""
    doc = copy.deepcopy(deployment)
    doc["metadata"]["name"] = f"{deployment['metadata']['name']}-{replica}"
    doc["spec"]["replicas"] = 1
    pod = doc["spec"]["template"]["spec"]
    for volume in pod.get("volumes") or []:
        for kind, key in (("secret", "secretName"), ("configMap", "name")):
            if kind in volume:
                name = volume.pop(kind)[key]
                if volume_dirs is None or name not in volume_dirs:
                    raise PlayError(f"volume {volume['name']}: no directory for {kind} {name}")
                volume["hostPath"] = {"path": volume_dirs[name], "type": "Directory"}
    namespace = deployment["metadata"].get("namespace", "default")
    for container in pod["containers"] + (pod.get("initContainers") or []):
        container["image"] = image
        container["imagePullPolicy"] = "Never"
        # Podman publishes every containerPort on the host (a kubelet only publishes hostPorts):
        # replicas would collide. Pod IPs reach every port anyway; probe_targets reads the original.
        container.pop("ports", None)
        container["env"] = [downward(var, namespace) for var in container.get("env") or []]
    if host_aliases:
        pod["hostAliases"] = [
            *(pod.get("hostAliases") or []),
            *({"ip": ip, "hostnames": names} for ip, names in host_aliases.items()),
        ]
    return doc


def downward(var: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """Podman resolves fieldRef metadata.name/labels/annotations but not metadata.namespace: give it
    the value the downward API would."""
    field = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if field == "metadata.namespace":
        return {"name": var["name"], "value": namespace}
    return dict(var)


def probe_targets(deployment: Mapping[str, Any]) -> list[Probe]:
    """Each container's httpGet probes with their ports resolved, as a kubelet would call them."""
    ports = container_ports(deployment)
    out: list[Probe] = []
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(kind)
            if not probe:
                continue
            get = probe.get("httpGet")
            if get is None:
                raise PlayError(f"{container['name']}.{kind}: only httpGet probes are played here")
            port = str(get["port"])
            if port not in ports:
                raise PlayError(f"{container['name']}.{kind}: port {port} is no container port")
            budget = probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10)
            out.append(Probe(container["name"], kind, ports[port], get.get("path", "/"), float(budget)))
    return out


def dump(docs: Iterable[Doc]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False)
