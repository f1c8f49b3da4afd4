"""Helpers of the e2e suite (fixtures in conftest.py).

The operator and chart against a real control plane (scripts/k8s-local): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler built from Go modules, and KWOK nodes shaped like B200 pools.

The suite starts its own control plane in a temporary run directory (so it never touches one a
developer has up), installs the chart with the real `helm`, and runs the operator as a local process
whose kubeconfig carries the chart's ServiceAccount token: the chart's RBAC is what is tested. It
skips with the reason when the binaries are not built (`scripts/k8s-local build`) — and fails
instead under CI=true, where scripts/test builds them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
CHART = ROOT / "charts" / "agentserve"
RELEASE = "agentserve"
OPERATOR_NS = "agentserve-system"
OPERATOR_SA = "agentserve"  # the chart's ServiceAccount for release "agentserve"


def load_k8s_local() -> ModuleType:
    spec = importlib.util.spec_from_file_location("k8s_local", ROOT / "scripts" / "k8s_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["k8s_local"] = module
    spec.loader.exec_module(module)
    return module


k8s_local = load_k8s_local()


def missing_prerequisite() -> str | None:
    absent = [b for b in k8s_local.BINARIES if not (k8s_local.BIN / b).exists()]
    if absent:
        return f"control plane not built ({', '.join(absent)}): run scripts/k8s-local build"
    for tool in ("helm", "kubectl"):
        if not (TOOLS / tool).exists():
            return f"{tool} not installed at {TOOLS}: run scripts/install-helm"
    if shutil.which("openssl") is None:
        return "openssl not found"
    return None


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must run the k8s suite)")
    pytest.skip(reason)


@dataclass
class Kube:
    """The running control plane, with the real kubectl and helm bound to its admin kubeconfig."""

    cluster: Any
    kubeconfig: Path
    env: dict[str, str] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60) -> str:
        proc = subprocess.run(  # noqa: PLW1510 - the caller reads returncode
            [str(TOOLS / "kubectl"), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout if proc.returncode == 0 else proc.stderr

    def kubectl_result(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: PLW1510 - the caller reads returncode
            [str(TOOLS / "kubectl"), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: PLW1510 - the caller reads returncode
            [str(TOOLS / "helm"), *args], env=self.env, capture_output=True, text=True, timeout=120
        )

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        proc = self.kubectl_result(*args)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise AssertionError(proc.stderr)
        return dict(json.loads(proc.stdout))

    def items(
        self, kind: str, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"]
        args += ["-n", namespace] if namespace else ["-A"]
        if selector:
            args += ["-l", selector]
        return list(json.loads(self.kubectl(*args))["items"])

    def merge_patch(self, name: str, namespace: str, patch: dict[str, Any], subresource: str = "") -> str:
        """A JSON merge patch of the AgentServingDeployment `name` (or of its `subresource`)."""
        args = ["patch", "asd", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch)]
        return self.kubectl(*args, *([f"--subresource={subresource}"] if subresource else []))

    def apply_yaml(self, text: str, namespace: str | None = None) -> str:
        args = ["apply", "--server-side", "--field-manager=e2e", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=text)

    def ensure_namespace(self, name: str) -> None:
        proc = self.kubectl_result("create", "namespace", name)
        assert proc.returncode == 0 or "AlreadyExists" in proc.stderr, proc.stderr

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        token = self.kubectl("create", "token", service_account, "-n", namespace, "--duration=4h").strip()
        config = k8s_local.token_kubeconfig(
            self.cluster.server, self.cluster.pki / "ca.crt", token, namespace
        )
        path.write_text(json.dumps(config), encoding="utf-8")
        return path


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until `predicate()` is truthy; bounded, with the last value in the failure."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})")


@dataclass
class Operator:
    """`agentserve operator` as a local process with the chart ServiceAccount's token."""

    kube: Kube
    kubeconfig: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    args: tuple[str, ...] = ()

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        out = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentserve", "operator", "--liveness=", "--metrics-port=0", *self.args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""


def load_example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "examples" / name).read_text(encoding="utf-8")))


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}
