"""The CPU images as users run them: `agentserve up` from a read-only container as uid 1000, the
operator image's CLI, and what the images carry (hygiene: size, no toolchain, every version pinned)."""

from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest
from podman_harness import ROOT, Podman, wait_http

from image_deps import BOOKWORM_PYTHON, CUT, closure, environment, installed_extras, pruned

pytestmark = pytest.mark.images

# Uncompressed size (`podman images`, `docker images`) of the agentserve image: issue 14's target (238 MB
# today; docs/kubernetes.md has the table).
SIZE_LIMIT_MB = 250
TOOLCHAIN = ("gcc", "cc", "c++", "g++", "clang", "make", "ld", "as", "strip", "rustc", "cargo")


def test_up_serves_from_a_read_only_container_as_uid_1000(podman: Podman) -> None:
    cid = podman.start(
        "--read-only",
        "--read-only-tmpfs=false",  # only the image's VOLUMEs are writable (/tmp, $HOME)
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        podman.agentserve,
        "up",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--workers",
        "2",
    )
    base = f"http://{podman.ip(cid)}:8000"

    def alive() -> None:
        state = podman.out("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", cid)
        assert state.startswith("running"), f"{state}\n{podman.run('logs', cid, check=False).stderr}"

    assert wait_http(f"{base}/health", 60, alive=alive).json()
    ids = podman.out("exec", cid, "id", "-u").split()
    assert ids == ["1000"]
    # The root filesystem is read-only; the documented volumes are writable by uid 1000.
    assert podman.run("exec", cid, "touch", "/opt/agentserve/x", check=False).returncode != 0
    for path in ("/tmp", "/var/cache/agentserve"):
        podman.out("exec", cid, "touch", f"{path}/written")

    chat = openai.OpenAI(base_url=f"{base}/v1", api_key="agentserve", max_retries=0).chat.completions.create(
        model="qwen3-sim", messages=[{"role": "user", "content": "hello from the host"}], max_tokens=64
    )
    assert "hello from the host" in (chat.choices[0].message.content or "")  # the sim's echo policy
    message = anthropic.Anthropic(base_url=base, api_key="agentserve", max_retries=0).messages.create(
        model="qwen3-sim", max_tokens=64, messages=[{"role": "user", "content": "hello, anthropic"}]
    )
    assert message.content[-1].type == "text" and "hello, anthropic" in message.content[-1].text


def test_operator_image_prints_the_crd(podman: Podman) -> None:
    result = podman.run("run", "--rm", "--read-only", "--cap-drop=ALL", podman.operator, "crd")
    (crd_file,) = (ROOT / "crds").glob("*.yaml")
    assert result.stdout == crd_file.read_text()
    # Its default command is the operator, and everything it imports is in the image.
    config = json.loads(podman.out("image", "inspect", podman.operator))[0]["Config"]
    assert config["Entrypoint"] == ["agentserve"] and config["Cmd"] == ["operator"]
    podman.run(
        "run", "--rm", "--read-only", "--entrypoint", "python3", podman.operator,
        "-c", "import kopf, kubernetes.client, kubernetes.dynamic, agentserve.operator",
    )  # fmt: skip


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "images" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


INSTALLED = (
    "import importlib.metadata as m, json;"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)
# Imports every module of the packages named in argv (none run at import), less the prefixes given with
# a leading "-"; prints those that fail. Catches a pruned distribution that some module still imports.
IMPORT_ALL = """
import importlib, pkgutil, sys
tops = [a for a in sys.argv[1:] if not a.startswith("-")]
skip = tuple(a[1:] for a in sys.argv[1:] if a.startswith("-"))
failed = {}
for top in tops:
    for info in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."):
        if info.name.endswith(".__main__") or info.name.startswith(skip):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed[info.name] = repr(exc)
print(failed)
"""
# Per image: the packages it runs (the agentserve image has no kopf, so not agentserve.operator).
MODULES = {"agentserve": ["agentserve", "-agentserve.operator"], "operator": ["agentserve", "kopf"]}


@pytest.mark.parametrize("which", ["agentserve", "operator"])
def test_image_hygiene(podman: Podman, which: str) -> None:
    image = podman.agentserve if which == "agentserve" else podman.operator
    info = json.loads(podman.out("image", "inspect", image))[0]
    size_mb = info["Size"] / 1e6
    print(f"{image}: {size_mb:.0f} MB, {len(info['RootFS']['Layers'])} layers")
    if which == "agentserve":
        assert size_mb < SIZE_LIMIT_MB, f"{image} is {size_mb:.0f} MB"
    config = info["Config"]
    assert config["User"] == "1000:1000"
    assert config["Entrypoint"] == ["agentserve"]
    # Kubernetes ignores HEALTHCHECK and one image serves three ports: the operator's probes check.
    assert not config.get("Healthcheck")
    assert set(config.get("Volumes") or {}) >= {"/tmp"}

    # No toolchain, no build tree, no package manager caches or indexes in the final stage.
    found = podman.run(
        "run", "--rm", "--entrypoint", "sh", image, "-c",
        f"for t in {' '.join(TOOLCHAIN)}; do command -v $t; done;"
        " ls -d /src /root/.cache /var/cache/agentserve/.cache /tmp/* /var/lib/apt/lists/*.lz4"
        " /opt/agentserve/bin/pip* /opt/agentserve/lib/python3*/site-packages/pip 2>/dev/null; true",
    ).stdout.split()  # fmt: skip
    assert found == []

    # Every distribution in the venv is pinned by images/constraints.txt, at the pinned version.
    installed = json.loads(
        podman.out("run", "--rm", "--entrypoint", "/opt/agentserve/bin/python", image, "-c", INSTALLED)
    )
    # ... and is what tests/unit/operator/test_image_dependencies.py derives for this Python and machine
    # (the closure of the image's extras less the pruned edges), so those unit tests speak for the image.
    python, machine = podman.out(
        "run", "--rm", "--entrypoint", "python3", image, "-c",
        "import platform; print(platform.python_version(), platform.machine())",
    ).split()  # fmt: skip
    assert python == BOOKWORM_PYTHON
    expected = closure(installed_extras(which), environment(python, machine), CUT)
    names = {re.sub(r"[-_.]+", "-", name).lower() for name in installed} - {"agentserve"}
    assert not names & pruned(which)
    if not expected.drifted:  # else the unit tests skip too: this venv's metadata is not the pinned one
        assert names == expected.names
    failed = podman.out(
        "run", "--rm", "--read-only", "--entrypoint", "python3", image, "-c", IMPORT_ALL, *MODULES[which]
    )  # fmt: skip
    assert failed == "{}"
    if which == "agentserve":
        # What the router's EndpointSlice discovery builds (router/discovery.py), with aiohttp pruned.
        podman.run(
            "run", "--rm", "--read-only", "--entrypoint", "python3", image, "-c",
            "import kubernetes.client as c, kubernetes.config, kubernetes.watch as w;"
            " c.DiscoveryV1Api(c.ApiClient()); w.Watch(); import agentserve.router.discovery",
        )  # fmt: skip
    pins = _pins()
    unpinned = {
        name: version
        for name, version in installed.items()
        if name != "agentserve" and pins.get(re.sub(r"[-_.]+", "-", name).lower()) != version
    }
    assert not unpinned, f"installed but not at a pinned version: {unpinned}"


def test_built_on_the_local_base(podman: Podman, built: dict[str, str]) -> None:
    """scripts/build-images passes its debootstrapped base as BASE_IMAGE: both images start with its
    layer (the Dockerfiles' default is the public python image)."""
    base = json.loads(podman.out("image", "inspect", built["AGENTSERVE_BASE_IMAGE"]))[0]["RootFS"]["Layers"]
    for image in (podman.agentserve, podman.operator):
        layers = json.loads(podman.out("image", "inspect", image))[0]["RootFS"]["Layers"]
        assert layers[: len(base)] == base
