#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback, built from Go modules, with simulated B200 node pools.

    scripts/k8s-local build   # once: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, lws
    scripts/k8s-local up      # start them (idempotent), register KWOK nodes, write a kubeconfig
    scripts/k8s-local lws     # also run the LeaderWorkerSet controller (its CRDs and webhooks)
    scripts/k8s-local env     # print `export KUBECONFIG=...`
    scripts/k8s-local down    # stop everything (`--purge` also drops etcd's data)

Everything is built from source through the Go module proxy — never a downloaded binary: the
Kubernetes commands from `k8s.io/kubernetes` at one pinned release, inside a small wrapper module whose
`replace` lines pin every `k8s.io/*` staging module to the matching `v0.x.y` (the release's own go.mod
points them at `./staging`, which a dependent module cannot use); etcd from `go.etcd.io/etcd/server/v3`;
KWOK (the Kubernetes SIG's simulator of nodes and pod lifecycles) from `sigs.k8s.io/kwok`; the
LeaderWorkerSet controller from `sigs.k8s.io/lws` (its `cmd` package, the manager its image runs). Binaries
are cached under ~/.cache/agentserve-k8s/<version>/bin; the Go build cache makes a rebuild cheap.

`lws` (or `Cluster.install_lws()`) runs the LWS manager as a local process like the others, with its
internal certificate rotation off: its webhook serves on loopback with a certificate from the run's CA,
and the webhook configurations point at that URL (`clientConfig.url`) instead of an in-cluster Service
the apiserver could not reach without a network. The CRDs come from the module (`config/crd/bases`).

`up` makes a CA, serving and client certificates and a service-account key pair (openssl), starts
etcd and the three control-plane components on free loopback ports, then KWOK, which plays the kubelet
of every node annotated `kwok.x-k8s.io/node: fake`: it keeps them Ready, gives scheduled pods IPs and
marks them Running and Ready. The nodes look like the pools of examples/: HGX B200 nodes (8
`nvidia.com/gpu`, labelled `nvidia.com/gpu.product: NVIDIA-B200`, tainted `nvidia.com/gpu:NoSchedule`)
and plain CPU nodes. State lives in AGENTSERVE_K8S_RUN (default ~/.cache/agentserve-k8s/run).

Only the standard library: this runs before any virtualenv exists. Tests import it (tests/e2e_k8s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

K8S_VERSION = "1.36.3"  # k8s.io/kubernetes v1.36.3; its staging modules are v0.36.3
STAGING_VERSION = "0." + K8S_VERSION.split(".", 1)[1]
ETCD_VERSION = "3.6.16"  # go.etcd.io/etcd/server/v3
KWOK_VERSION = "0.7.0"  # sigs.k8s.io/kwok
LWS_VERSION = "0.9.0"  # sigs.k8s.io/lws (LeaderWorkerSet)
GO_MIN = (1, 26)

CACHE = Path(os.environ.get("AGENTSERVE_K8S_CACHE", Path.home() / ".cache" / "agentserve-k8s"))
BUILD = CACHE / f"k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}-kwok-{KWOK_VERSION}"
BIN = BUILD / "bin"
LWS_BUILD = CACHE / f"lws-{LWS_VERSION}"
LWS_BIN = LWS_BUILD / "bin" / "lws-manager"
LWS_CRDS = LWS_BUILD / "crds"
RUN = Path(os.environ.get("AGENTSERVE_K8S_RUN", CACHE / "run"))

K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = (*K8S_COMMANDS, "etcd", "kwok")
# Start order; `down` stops in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "lws")

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

B200_PRODUCT = "NVIDIA-B200"
GPU_RESOURCE = "nvidia.com/gpu"


def log(message: str) -> None:
    print(f"k8s-local: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ build


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("k8s-local: Go is not installed (it builds the control plane from the module proxy)")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    major, minor = (int(p) for p in out.removeprefix("go").split(".")[:2])
    if (major, minor) < GO_MIN:
        raise SystemExit(f"k8s-local: Go {out} is too old; k8s.io/kubernetes v{K8S_VERSION} needs go1.26")
    return go


def _run_go(go: str, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    started = time.monotonic()
    log(f"go {' '.join(args)}  (in {cwd})")
    proc = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"k8s-local: go {args[0]} failed in {cwd} (exit {proc.returncode})")
    log(f"  done in {time.monotonic() - started:.0f} s")


def _staging_modules(go: str, work: Path) -> list[str]:
    """The `k8s.io/*` modules the release's go.mod replaces with ./staging directories."""
    out = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubernetes@v{K8S_VERSION}"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    gomod = Path(json.loads(out)["GoMod"]).read_text(encoding="utf-8")
    modules = []
    for line in gomod.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("./staging/"):
            modules.append(parts[0])
    if not modules:
        raise SystemExit(f"k8s-local: no staging replaces found in k8s.io/kubernetes v{K8S_VERSION}'s go.mod")
    return modules


def _wrapper(work: Path, requires: dict[str, str], replaces: dict[str, str], imports: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    lines = ["module agentserve.local/k8s-local", "", "go 1.26.0", "", "require ("]
    lines += [f"\t{m} v{v}" for m, v in requires.items()]
    lines += [")"]
    if replaces:
        lines += ["", "replace ("] + [f"\t{m} => {m} v{v}" for m, v in replaces.items()] + [")"]
    (work / "go.mod").write_text("\n".join(lines) + "\n", encoding="utf-8")
    body = "\n".join(f'\t_ "{i}"' for i in imports)
    (work / "tools.go").write_text(
        f"//go:build tools\n\n// Pins what k8s-local builds.\npackage tools\n\nimport (\n{body}\n)\n",
        encoding="utf-8",
    )


def _version_ldflags() -> str:
    """What `make` stamps into a release build: without it the apiserver reports v0.0.0-master and
    `helm install` refuses a chart with a kubeVersion constraint."""
    major, minor, _ = K8S_VERSION.split(".")
    pkg = "k8s.io/component-base/version"
    values = {
        "gitVersion": f"v{K8S_VERSION}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": f"v{K8S_VERSION}-module-proxy",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    return " ".join(f"-X {pkg}.{k}={v}" for k, v in values.items())


def build(force: bool = False) -> None:
    """Build every binary once; a later call finds them in the cache and returns at once."""
    if not force and all((BIN / b).exists() for b in BINARIES):
        log(f"binaries cached in {BIN}")
        return
    go = _go()
    BIN.mkdir(parents=True, exist_ok=True)
    src = BUILD / "src"
    started = time.monotonic()

    k8s = src / "kubernetes"
    k8s.mkdir(parents=True, exist_ok=True)
    (k8s / "go.mod").write_text("module agentserve.local/probe\n\ngo 1.26.0\n", encoding="utf-8")
    staging = _staging_modules(go, k8s)
    _wrapper(
        k8s,
        {"k8s.io/kubernetes": K8S_VERSION},
        dict.fromkeys(staging, STAGING_VERSION),
        [f"k8s.io/kubernetes/cmd/{c}" for c in K8S_COMMANDS],
    )
    _run_go(go, ["mod", "tidy"], k8s)
    if force or not all((BIN / c).exists() for c in K8S_COMMANDS):
        pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in K8S_COMMANDS]
        _run_go(
            go,
            ["build", "-trimpath", f"-ldflags=-s -w {_version_ldflags()}", "-o", str(BIN) + "/", *pkgs],
            k8s,
        )

    etcd = src / "etcd"
    _wrapper(etcd, {"go.etcd.io/etcd/server/v3": ETCD_VERSION}, {}, ["go.etcd.io/etcd/server/v3"])
    _run_go(go, ["mod", "tidy"], etcd)
    if force or not (BIN / "etcd").exists():
        _run_go(
            go,
            ["build", "-trimpath", "-ldflags=-s -w", "-o", str(BIN / "etcd"), "go.etcd.io/etcd/server/v3"],
            etcd,
        )

    kwok = src / "kwok"
    _wrapper(kwok, {"sigs.k8s.io/kwok": KWOK_VERSION}, {}, ["sigs.k8s.io/kwok/cmd/kwok"])
    _run_go(go, ["mod", "tidy"], kwok)
    if force or not (BIN / "kwok").exists():
        _run_go(
            go,
            ["build", "-trimpath", "-ldflags=-s -w", "-o", str(BIN / "kwok"), "sigs.k8s.io/kwok/cmd/kwok"],
            kwok,
        )
    log(f"built {', '.join(BINARIES)} in {time.monotonic() - started:.0f} s → {BIN}")
    build_lws(force)


def build_lws(force: bool = False) -> None:
    """The LWS manager and its CRDs, from the module at LWS_VERSION (cached like the rest)."""
    if not force and LWS_BIN.exists() and any(LWS_CRDS.glob("*.yaml")):
        log(f"lws cached in {LWS_BUILD}")
        return
    go = _go()
    started = time.monotonic()
    work = LWS_BUILD / "src"
    _wrapper(work, {"sigs.k8s.io/lws": LWS_VERSION}, {}, ["sigs.k8s.io/lws/cmd"])
    _run_go(go, ["mod", "tidy"], work)
    LWS_BIN.parent.mkdir(parents=True, exist_ok=True)
    _run_go(go, ["build", "-trimpath", "-ldflags=-s -w", "-o", str(LWS_BIN), "sigs.k8s.io/lws/cmd"], work)
    out = subprocess.run(
        [go, "list", "-m", "-json", "sigs.k8s.io/lws"],
        cwd=work,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    source = Path(json.loads(out)["Dir"]) / "config" / "crd" / "bases"
    LWS_CRDS.mkdir(parents=True, exist_ok=True)
    for crd in source.glob("*.yaml"):
        shutil.copyfile(crd, LWS_CRDS / crd.name)
    log(f"built lws {LWS_VERSION} in {time.monotonic() - started:.0f} s → {LWS_BIN}")


# ------------------------------------------------------------------------------------------ pki


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _cert(pki: Path, name: str, subject: str, sans: str | None = None) -> None:
    key, csr, crt = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.crt"
    if crt.exists():
        return
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    ext = pki / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment"]
    lines.append("extendedKeyUsage=serverAuth,clientAuth")
    if sans:
        lines.append(f"subjectAltName={sans}")
    ext.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip


def make_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl("genrsa", "-out", str(pki / "ca.key"), "2048")
        _openssl(
            "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=agentserve-k8s-local-ca",
            "-days", "3650", "-sha256", "-out", str(pki / "ca.crt"),
        )  # fmt: skip
    sans = "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    _cert(pki, "apiserver", "/CN=kube-apiserver", sans)
    _cert(pki, "admin", "/O=system:masters/CN=kubernetes-admin")
    _cert(pki, "controller-manager", "/CN=system:kube-controller-manager")
    _cert(pki, "scheduler", "/CN=system:kube-scheduler")
    _cert(pki, "kwok", "/O=system:masters/CN=kwok-controller")
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "k8s-local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "k8s-local", "context": {"cluster": "k8s-local", "user": user}}],
        "current-context": "k8s-local",
    }


def token_kubeconfig(server: str, ca: Path, token: str, namespace: str = "default") -> dict[str, Any]:
    """A kubeconfig that authenticates with a bearer token (a ServiceAccount's, for RBAC tests)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "k8s-local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [
            {"name": "k8s-local", "context": {"cluster": "k8s-local", "user": "sa", "namespace": namespace}}
        ],
        "current-context": "k8s-local",
    }


# ------------------------------------------------------------------------------------------ nodes


# NVIDIA Topograph's node label of the leaf (top-of-rack) switch: the domain a worker spanning nodes
# fills (nodePool.topologyKey); two B200 nodes per leaf here.
LEAF_LABEL = "network.topology.nvidia.com/leaf"


def b200_node(name: str, zone: str, leaf: str = "leaf-0") -> dict[str, Any]:
    """An HGX B200 node: 8 GPUs, 224 vCPUs, 2 TiB, tainted so only GPU pods land there."""
    return _node(
        name,
        labels={
            "nvidia.com/gpu.product": B200_PRODUCT,
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "183359",
            "node.kubernetes.io/instance-type": "hgx-b200-8",
            "topology.kubernetes.io/zone": zone,
            LEAF_LABEL: leaf,
            "agentserve.dev/pool": "b200",
        },
        taints=[{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}],
        capacity={
            "cpu": "224",
            "memory": "2Ti",
            GPU_RESOURCE: "8",
            "pods": "110",
            "ephemeral-storage": "30Ti",
        },
    )


def cpu_node(name: str, zone: str) -> dict[str, Any]:
    return _node(
        name,
        labels={
            "node.kubernetes.io/instance-type": "cpu-32",
            "topology.kubernetes.io/zone": zone,
            "agentserve.dev/pool": "cpu",
        },
        taints=[],
        capacity={"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "1Ti"},
    )


def _node(
    name: str, labels: dict[str, str], taints: list[dict[str, str]], capacity: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                **labels,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": f"v{K8S_VERSION}-kwok",
                "containerRuntimeVersion": "kwok",
            },
        },
    }


def default_nodes(b200: int, cpu: int) -> list[dict[str, Any]]:
    zones = ("zone-a", "zone-b")
    b200_nodes = [b200_node(f"b200-{i}", zones[(i // 2) % 2], f"leaf-{i // 2}") for i in range(b200)]
    return b200_nodes + [
        cpu_node(f"cpu-{i}", zones[i % 2]) for i in range(cpu)
    ]


# ------------------------------------------------------------------------------------------ cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """The control plane of one run directory: start/stop components, reach the API."""

    run: Path = RUN
    bin: Path = BIN

    @property
    def pki(self) -> Path:
        return self.run / "pki"

    @property
    def kubeconfig_path(self) -> Path:
        return self.run / "kubeconfig"

    def ports(self) -> dict[str, int]:
        path = self.run / "ports.json"
        if path.exists():
            return dict(json.loads(path.read_text(encoding="utf-8")))
        ports = {
            n: free_port()
            for n in (
                "etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok", "lws-webhook",
                "lws-health",
            )
        }  # fmt: skip
        self.run.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ports), encoding="utf-8")
        return ports

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports()['apiserver']}"

    def _pid_file(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        path = self._pid_file(name)
        if not path.exists():
            return None
        pid = int(path.read_text(encoding="utf-8"))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        try:  # a zombie (our own child, not reaped) is not running
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return None
        except (OSError, IndexError):
            return None
        return pid

    def command(self, name: str) -> list[str]:
        p, pki, ports = self.pki, self.pki, self.ports()
        if name == "etcd":
            return [
                str(self.bin / "etcd"),
                "--name=k8s-local",
                f"--data-dir={self.run / 'etcd-data'}",
                f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
                f"--initial-cluster=k8s-local=http://127.0.0.1:{ports['etcd-peer']}",
                "--unsafe-no-fsync",  # a test cluster: speed over durability
                "--quota-backend-bytes=4294967296",
            ]
        if name == "kube-apiserver":
            return [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
            ]
        if name == "kube-controller-manager":
            return [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.run / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.run / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.run / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['controller-manager']}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
                "--concurrent-gc-syncs=20",
            ]
        if name == "kube-scheduler":
            return [
                str(self.bin / "kube-scheduler"),
                f"--kubeconfig={self.run / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={self.run / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={self.run / 'scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                "--leader-elect=false",
            ]
        if name == "kwok":
            return [
                str(self.bin / "kwok"),
                f"--kubeconfig={self.run / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--manage-nodes-with-label-selector=",
                "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
                "--disregard-status-with-label-selector=",
                f"--cidr={POD_CIDR.replace('0.0/16', '0.1/16')}",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{ports['kwok']}",
            ]
        if name == "lws":
            return [
                str(LWS_BIN),
                f"--kubeconfig={self.run / 'kubeconfig'}",
                f"--config={self.run / 'lws-config.yaml'}",
                "--zap-log-level=info",
            ]
        raise ValueError(name)

    def start(self, name: str) -> int:
        running = self.pid(name)
        if running is not None:
            return running
        logs = self.run / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child process
        proc = subprocess.Popen(
            self.command(name),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self._pid_file(name).write_text(str(proc.pid), encoding="utf-8")
        return proc.pid

    def stop(self, name: str, timeout: float = 15.0) -> None:
        pid = self.pid(name)
        if pid is None:
            self._pid_file(name).unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.pid(name) is not None and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        if self.pid(name) is not None:
            os.kill(pid, signal.SIGKILL)
            while self.pid(name) is not None:
                _reap()
                time.sleep(0.05)
        self._pid_file(name).unlink(missing_ok=True)

    def outage(self, name: str, seconds: float) -> None:
        """Stop component `name` for `seconds`, start it again (and wait for the API if it is the apiserver)."""
        self.stop(name)
        time.sleep(seconds)
        self.start(name)
        if name == "kube-apiserver":
            self.wait_ready()

    # --------------------------------------------------------------------------- API access

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as resp:
            text = resp.read()
        return json.loads(text) if text.startswith(b"{") else text.decode()

    def ready(self) -> bool:
        try:
            return self.request("GET", "/readyz") == "ok"
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"k8s-local: the apiserver was not ready in {timeout:.0f} s (logs in {self.run / 'logs'})"
                )
            _reap()
            time.sleep(0.2)

    def apply(self, obj: dict[str, Any]) -> Any:
        """Server-side apply (field manager k8s-local) of a cluster-scoped or namespaced object."""
        kind = obj["kind"]
        plural = {"Node": "nodes", "Namespace": "namespaces"}[kind]
        path = f"/api/v1/{plural}/{obj['metadata']['name']}?fieldManager=k8s-local&force=true"
        result = self.request("PATCH", path, obj, "application/apply-patch+yaml")
        if kind == "Node" and obj.get("status"):
            status_path = f"/api/v1/nodes/{obj['metadata']['name']}/status?fieldManager=k8s-local&force=true"
            self.request(
                "PATCH",
                status_path,
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": obj["metadata"]["name"]},
                    "status": obj["status"],
                },
                "application/apply-patch+yaml",
            )
        return result

    def write_kubeconfigs(self) -> None:
        p = self.pki
        for name, user in (
            ("kubeconfig", "admin"),
            ("controller-manager.kubeconfig", "controller-manager"),
            ("scheduler.kubeconfig", "scheduler"),
            ("kwok.kubeconfig", "kwok"),
        ):
            config = kubeconfig(self.server, p / "ca.crt", p / f"{user}.crt", p / f"{user}.key", user)
            (self.run / name).write_text(json.dumps(config, indent=2), encoding="utf-8")

    def wait_nodes_ready(self, names: list[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.request("GET", "/api/v1/nodes")["items"]
            ready = {
                n["metadata"]["name"]
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (n.get("status") or {}).get("conditions") or []
                )
            }
            if set(names) <= ready:
                return
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"k8s-local: nodes not Ready after {timeout:.0f} s: {sorted(set(names) - ready)}"
                )
            time.sleep(0.3)

    def up(self, b200_nodes: int = 4, cpu_nodes: int = 3) -> None:
        missing = [b for b in BINARIES if not (self.bin / b).exists()]
        if missing:
            raise SystemExit(
                f"k8s-local: {', '.join(missing)} not built: run `scripts/k8s-local build` first"
            )
        started = time.monotonic()
        self.run.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        self.ports()
        self.write_kubeconfigs()
        self.start("etcd")
        self.start("kube-apiserver")
        self.wait_ready()
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self.start(name)
        nodes = default_nodes(b200_nodes, cpu_nodes)
        for node in nodes:
            self.apply(node)
        self.wait_nodes_ready([n["metadata"]["name"] for n in nodes])
        log(
            f"up in {time.monotonic() - started:.1f} s: {self.server}, {b200_nodes} B200 + {cpu_nodes} CPU nodes"
        )
        log(f"kubeconfig: {self.kubeconfig_path}")

    def install_lws(self, timeout: float = 90.0) -> None:
        """Run the LWS manager and install its CRDs and webhooks (idempotent)."""
        if not LWS_BIN.exists():
            raise SystemExit("k8s-local: the LWS manager is not built: run `scripts/k8s-local build`")
        ports = self.ports()
        if "lws-webhook" not in ports:  # a run directory made before LWS existed
            ports = {**ports, "lws-webhook": free_port(), "lws-health": free_port()}
            (self.run / "ports.json").write_text(json.dumps(ports), encoding="utf-8")
        certs = self.run / "lws-certs"
        certs.mkdir(parents=True, exist_ok=True)
        _cert(self.pki, "lws-webhook", "/CN=lws-webhook", "IP:127.0.0.1,DNS:localhost")
        shutil.copyfile(self.pki / "lws-webhook.crt", certs / "tls.crt")
        shutil.copyfile(self.pki / "lws-webhook.key", certs / "tls.key")
        # The manager's Configuration (config.lws.x-k8s.io/v1alpha1): no leader election, no internal
        # cert rotation (our CA signs its serving certificate), webhook and probes on loopback.
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": ports["lws-webhook"], "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['lws-health']}"},
        }
        (self.run / "lws-config.yaml").write_text(json.dumps(config), encoding="utf-8")
        for crd in sorted(LWS_CRDS.glob("*.yaml")):
            self.apply_crd(crd)
        for webhook in lws_webhooks(ports["lws-webhook"], (self.pki / "ca.crt").read_bytes()):
            kind = webhook["kind"].lower() + "s"
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}/{webhook['metadata']['name']}"
            self.request("PATCH", path + "?fieldManager=k8s-local&force=true", webhook, APPLY)
        self.start("lws")
        deadline = time.monotonic() + timeout
        health = f"http://127.0.0.1:{ports['lws-health']}/readyz"
        while True:
            try:
                with urllib.request.urlopen(health, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.pid("lws") is None:
                logs = self.run / "logs"
                raise SystemExit(f"k8s-local: the LWS manager did not become ready (logs in {logs})")
            time.sleep(0.2)
        log(f"lws {LWS_VERSION} running, webhook on 127.0.0.1:{ports['lws-webhook']}")

    def uninstall_lws(self) -> None:
        """Stop the LWS manager; delete its webhooks and CRDs (and with them every LeaderWorkerSet)."""
        self.stop("lws")
        for kind in ("mutating", "validating"):
            name = f"lws-{kind}-webhook-configuration"
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{name}"
            try:
                self.request("DELETE", path)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
        for crd in sorted(LWS_CRDS.glob("*.yaml")):
            name = _yaml_document(crd.read_text(encoding="utf-8"))["metadata"]["name"]
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            try:
                self.request("DELETE", path)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    self.request("GET", path)
                except urllib.error.HTTPError as exc:
                    if exc.code == 404:
                        break
                time.sleep(0.2)

    def apply_crd(self, path: Path) -> None:
        """Apply a CRD file (YAML, one document) and wait until it is Established."""
        obj = _yaml_document(path.read_text(encoding="utf-8"))
        name = obj["metadata"]["name"]
        base = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        self.request("PATCH", base + "?fieldManager=k8s-local&force=true", obj, APPLY)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            conditions = (self.request("GET", base).get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return
            time.sleep(0.1)
        raise SystemExit(f"k8s-local: CRD {name} not established in 30 s")

    def down(self, purge: bool = False) -> None:
        for name in reversed(COMPONENTS):
            self.stop(name)
        if purge:
            shutil.rmtree(self.run, ignore_errors=True)


APPLY = "application/apply-patch+yaml"

# LWS's webhooks (config/webhook/manifests.yaml and its patches at LWS_VERSION): name, path, kind,
# resources, operations; the pod webhooks only see pods labelled leaderworkerset.sigs.k8s.io/name.
_LWS_WEBHOOKS: tuple[tuple[str, str, str, str, str, tuple[str, ...], bool], ...] = (
    ("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", "Mutating",
     "leaderworkerset.x-k8s.io", "leaderworkersets", ("CREATE", "UPDATE"), False),
    ("mpod.kb.io", "/mutate--v1-pod", "Mutating", "", "pods", ("CREATE",), True),
    ("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", "Validating",
     "leaderworkerset.x-k8s.io", "leaderworkersets", ("CREATE", "UPDATE"), False),
    ("vpod.kb.io", "/validate--v1-pod", "Validating", "", "pods", ("CREATE", "UPDATE"), True),
    ("vdisaggregatedset.kb.io", "/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset", "Validating",
     "disaggregatedset.x-k8s.io", "disaggregatedsets", ("CREATE", "UPDATE"), False),
)  # fmt: skip


def lws_webhooks(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The Mutating/ValidatingWebhookConfigurations of LWS, pointed at its loopback webhook server."""
    import base64

    bundle = base64.b64encode(ca).decode()
    out: list[dict[str, Any]] = []
    for kind in ("Mutating", "Validating"):
        hooks = []
        for name, path, hook_kind, group, resource, operations, pods_only in _LWS_WEBHOOKS:
            if hook_kind != kind:
                continue
            hook: dict[str, Any] = {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "rules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": ["v1"],
                        "operations": list(operations),
                        "resources": [resource],
                    }
                ],
            }
            if pods_only:
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
                }
            hooks.append(hook)
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": f"{kind}WebhookConfiguration",
                "metadata": {"name": f"lws-{kind.lower()}-webhook-configuration"},
                "webhooks": hooks,
            }
        )
    return out


def _yaml_document(text: str) -> dict[str, Any]:
    """One YAML document (a CRD file). PyYAML, imported here: only `lws` parses YAML, and it runs from
    the project's environment (tests, scripts/test), unlike `build` and `up`."""
    import yaml

    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


# ------------------------------------------------------------------------------------------ cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k8s-local", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build the binaries from Go modules (cached)")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p = sub.add_parser("up", help="start the control plane and KWOK nodes (idempotent)")
    p.add_argument("--b200-nodes", type=int, default=4, help="HGX B200 nodes (8 GPUs each)")
    p.add_argument("--cpu-nodes", type=int, default=3, help="CPU-only nodes")
    p = sub.add_parser("down", help="stop everything")
    p.add_argument("--purge", action="store_true", help="also delete certificates and etcd data")
    sub.add_parser("lws", help="run the LeaderWorkerSet controller; install its CRDs and webhooks")
    sub.add_parser("env", help="print `export KUBECONFIG=...`")
    sub.add_parser("status", help="which components run")
    args = parser.parse_args(argv)
    cluster = Cluster()
    if args.command == "build":
        build(force=args.force)
    elif args.command == "up":
        cluster.up(args.b200_nodes, args.cpu_nodes)
        print(f"export KUBECONFIG={cluster.kubeconfig_path}")
    elif args.command == "down":
        cluster.down(purge=args.purge)
    elif args.command == "lws":
        cluster.install_lws()
    elif args.command == "env":
        print(f"export KUBECONFIG={cluster.kubeconfig_path}")
    elif args.command == "status":
        for name in COMPONENTS:
            pid = cluster.pid(name)
            print(f"{name}: {'running (pid %d)' % pid if pid else 'stopped'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
