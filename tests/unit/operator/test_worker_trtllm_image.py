"""images/worker-trtllm/Dockerfile cannot be built here (its NVIDIA base cannot be pulled), so every command
and path it uses is checked against facts pinned from the base image's own documentation: NVIDIA's
TensorRT-LLM docs and the files in NVIDIA/TensorRT-LLM that build and describe the release image. A new
command or path in the Dockerfile fails here until a documented fact backs it (docs/kubernetes.md has the
table with the sources). hadolint lints the file in test_operator_images.py.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from agentserve.operator.build import CACHE_DIR, RUN_AS, build
from agentserve.operator.spec import AgentServingDeploymentSpec

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "images" / "worker-trtllm" / "Dockerfile"
# The facts below are this tag's: a new tag fails test_the_base_is_the_documented_release until they are
# checked again.
BASE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"

# Sources (all NVIDIA's; repository files in NVIDIA/TensorRT-LLM):
RELEASE_MD = "docker/release.md (the release container's NGC description)"
MULTI = "docker/Dockerfile.multi, stage `release` (builds the release image)"
USER_DF = "docker/Dockerfile.user (`make -C docker ngc-release_run LOCAL_USER=1`, on the release image)"
INSTALL_BASE = "docker/common/install_base.sh (devel stage, under release)"
QUICK_START = "https://nvidia.github.io/TensorRT-LLM/quick-start-guide.html"
SSH_DOC = (
    "docs/source/dev-on-cloud/build-image-to-dockerhub.md: the image has no ssh server; "
    "`apt update && apt install openssh-server` on top of it"
)

# Commands the release image has, and where its documentation runs them.
COMMANDS: dict[str, str] = {
    "python3": f"{RELEASE_MD}: `python3 -c \"import tensorrt_llm\"`; {MULTI}: `python3 -c 'import site...'`",
    "python3 -m pip": f"{MULTI}: `pip install /tmp/wheel/tensorrt_llm*.whl` into python3's site-packages "
    f"(then found there with python3); {INSTALL_BASE}: apt `python3-pip`",
    "rm": f"{MULTI}: `rm -v ...`, `rm -rf /root/.cache/pip`",
    "apt-get": f"{INSTALL_BASE}: `apt-get update && apt-get install -y ...` as root; {SSH_DOC}",
    "getent": f"{USER_DF}: `getent passwd ${{USER_ID}} || useradd ...`",
    "useradd": f"{USER_DF}: `useradd --gid --uid --create-home --no-log-init --shell /bin/bash`",
}
# Facts about the environment the commands run in.
RUNS_AS_ROOT = f"{MULTI}: no USER instruction; its `pip install` writes the system site-packages"
PYTHON = (
    "3.12.3",
    f"{MULTI}: ARG PYTHON_VERSION=3.12.3; site-packages /usr/local/lib/python3.12/dist-packages",
)
SCRIPTS_ON_PATH = (
    f"{QUICK_START}: `trtllm-serve ...` by bare name in the container (a console script of the same pip)"
)
# Absolute paths the Dockerfile may name, and why each is safe.
PATHS: dict[str, str] = {
    "/opt/agentserve-src": "created by this Dockerfile's WORKDIR, removed after the install",
    "/": "root directory",
    "/usr/sbin/nologin": "only written to /etc/passwd by useradd (never executed; pods run `agentserve`)",
    "/var/lib/apt/lists/": f"apt's package lists, emptied after the install as {INSTALL_BASE} does",
    CACHE_DIR: "HOME: the operator mounts a volume there (checked below)",
}


def _steps() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _commands(shell: str) -> list[list[str]]:
    """The simple commands of a RUN line: split at && || ; | and subshell parentheses."""
    parts = re.split(r"&&|\|\||;|\|", shell.replace("(", " ").replace(")", " "))
    return [shlex.split(part) for part in parts if part.strip()]


def _name(words: list[str]) -> str:
    """`python3 -m pip` for module invocations, else the program."""
    if words[0] == "python3" and len(words) > 2 and words[1] == "-m":
        return f"python3 -m {words[2]}"
    return words[0]


def test_the_base_is_the_documented_release() -> None:
    assert [arg for op, arg in _steps() if op == "FROM"] == [BASE]


def test_every_command_is_one_the_release_image_documents() -> None:
    runs = [arg for op, arg in _steps() if op == "RUN"]
    assert runs
    used = {_name(words) for run in runs for words in _commands(run)}
    assert used - set(COMMANDS) == set(), f"undocumented in {BASE}: {used - set(COMMANDS)}"
    assert all(COMMANDS[name] for name in used)
    # No USER before the RUNs: they run as the release image's root (RUNS_AS_ROOT).
    ops = [op for op, _ in _steps()]
    assert "USER" not in ops[: max(i for i, op in enumerate(ops) if op == "RUN")], RUNS_AS_ROOT


def test_every_absolute_path_is_accounted_for() -> None:
    paths: set[str] = set()
    for op, arg in _steps():
        if op in {"FROM", "ENTRYPOINT", "CMD", "EXPOSE", "USER"}:
            continue
        paths |= set(re.findall(r"(?<![\w.])(/[\w./-]*)", arg))
    # COPY destinations are relative to the WORKDIR above (created by it).
    assert paths - set(PATHS) == set(), f"paths without a fact: {paths - set(PATHS)}"


def test_agentserve_installs_into_the_python_that_has_tensorrt_llm() -> None:
    """`python3 -m pip install .` (no venv, which would hide tensorrt_llm) on the documented Python."""
    (run,) = [arg for op, arg in _steps() if op == "RUN"]
    installs = [words for words in _commands(run) if _name(words) == "python3 -m pip"]
    assert installs == [["python3", "-m", "pip", "install", "--no-cache-dir", "."]]
    assert "venv" not in DOCKERFILE.read_text().replace("# ", "")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert PYTHON[0] in SpecifierSet(requires), PYTHON[1]


def _worker_container() -> tuple[dict[str, Any], dict[str, Any]]:
    spec = AgentServingDeploymentSpec.model_validate(
        {
            "model": {"name": "Qwen/Qwen3-32B", "source": {"pvc": {"claimName": "models", "path": "q"}}},
            "workers": {"engine": "trtllm"},
        }
    )
    (deployment,) = [
        o
        for o in build(spec, "coder", "ai")
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "coder-worker"
    ]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_the_operator_runs_what_the_image_provides() -> None:
    """The worker pod the operator writes for engine trtllm: this image, `agentserve` through PATH (the
    documented console-script directory), uid 1000, and a volume at each writable path the image names."""
    pod, container = _worker_container()
    steps = _steps()
    assert container["image"].startswith("ghcr.io/agentserve/worker-trtllm:")
    assert container["command"][0] == "agentserve", SCRIPTS_ON_PATH
    assert pod["securityContext"]["runAsUser"] == RUN_AS == 1000
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert [arg for op, arg in steps if op == "USER"] == [f"{RUN_AS}:{RUN_AS}"]
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(arg for op, arg in steps if op == "ENV")))
    mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert {env["HOME"], "/tmp", "/dev/shm"} <= mounts
    assert {"name": "HOME", "value": env["HOME"]} in container["env"]
