"""podman on the store of scripts/build-images, for the tests under tests/images."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("buildah", "podman", "runc", "debootstrap")
BUILD_TIMEOUT_S = 1800


def unusable() -> str | None:
    """Why the images cannot be built and run here, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/test installs them from Debian when root)"
    if os.geteuid() != 0:
        return "buildah/podman with the vfs store need root on this kernel"
    return None


@dataclass
class Podman:
    """podman/buildah on the store and configuration of scripts/build-images."""

    env: dict[str, str]
    agentserve: str
    operator: str
    _pods: list[str] = field(default_factory=list)
    _containers: list[str] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
        return result

    def out(self, *args: str, timeout: float = 120) -> str:
        return self.run(*args, timeout=timeout).stdout.strip()

    def start(self, *args: str) -> str:
        """`podman run -d ARGS`: the container's id, removed at the end of the test."""
        cid = self.out("run", "-d", *args)
        self._containers.append(cid)
        return cid

    def played(self, pod: str) -> None:
        self._pods.append(pod)

    def ip(self, container: str) -> str:
        """The address of a container (or of a pod's infra container) on its network."""
        ips = self.out(
            "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", container
        ).split()
        assert ips, f"{container} has no IP address"
        return ips[0]

    def cleanup(self) -> None:
        for cid in self._containers:
            self.run("rm", "--force", "--time", "2", "--volumes", cid, check=False)
        for pod in self._pods:
            self.run("pod", "rm", "--force", "--time", "2", pod, check=False, timeout=180)
        self._containers.clear()
        self._pods.clear()


# Checkouts on one machine share the store: each tests the images of its own tree, under its own tag.
TAG = "test-" + hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]


def script_env() -> dict[str, str]:
    return {**os.environ, "AGENTSERVE_IMAGE_TAG": TAG}


def build_env() -> dict[str, str]:
    """The CONTAINERS_* variables and image names of scripts/build-images."""
    lines = subprocess.run(
        [str(ROOT / "scripts" / "build-images"), "--env"],
        capture_output=True,
        text=True,
        check=True,
        env=script_env(),
    ).stdout.splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def wait_http(url: str, timeout_s: float, *, alive: object = None) -> httpx.Response:
    """GET url until it answers 2xx/3xx (a kubelet's httpGet success) or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            response = httpx.get(url, timeout=2.0)
            if 200 <= response.status_code < 400:
                return response
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = exc
        if callable(alive):
            alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: no success in {timeout_s:.0f} s (last: {last})")
        time.sleep(0.5)
