"""Every example: valid against the CRD, renders with `agentserve manifests`, and renders valid objects;
harness settings point at an example's frontend Service with its served model name."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentserve.cli import main
from agentserve.operator.build import Target
from agentserve.operator.manifests import load_resources
from kubecheck import assert_valid, crd_schema_errors

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_the_promised_examples_exist() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "sim",
        "qwen3-coder-b200",
        "gpt-oss-120b-b200",
        "deepseek-r1-8xb200",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_renders_valid_objects(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        assert crd_schema_errors(doc) == []
    assert main(["manifests", "-f", str(path)]) == 0
    objs = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    # frontend, router and workers: a Deployment each, or a LeaderWorkerSet for workers spanning nodes;
    # and a prefill pool's Deployment where the example has one
    prefill = any(
        (d or {}).get("spec", {}).get("workers", {}).get("prefill")
        for d in yaml.safe_load_all(path.read_text())
    )
    assert len([o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet")]) == 3 + prefill
    assert_valid(objs)


def _by_stem(stem: str) -> dict[str, Any]:
    (res,) = load_resources((ROOT / "examples" / f"{stem}.yaml").read_text())
    return {"res": res, "url": Target(res.name, res.namespace).frontend_url}


def test_b200_examples_use_gpus_on_b200_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    for stem, gpus in (("qwen3-coder-b200", 8), ("gpt-oss-120b-b200", 1), ("deepseek-r1-8xb200", 8)):
        assert main(["manifests", "-f", str(ROOT / "examples" / f"{stem}.yaml")]) == 0
        objs = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
        worker = next(
            o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-worker")
        )
        pod = worker["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B200"
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
    sim = _by_stem("sim")["res"]
    assert sim.spec.workers.engine == "sim" and sim.spec.resolved_gpus_per_worker() == 0


def test_claude_code_env_points_at_the_frontend() -> None:
    env = {}
    for line in (ROOT / "examples" / "harness" / "claude-code.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    target = _by_stem("qwen3-coder-b200")
    assert env["ANTHROPIC_BASE_URL"] == target["url"]  # no /v1: the client appends /v1/messages
    assert env["ANTHROPIC_MODEL"] == target["res"].spec.model.name
    assert "ANTHROPIC_AUTH_TOKEN" in env
    assert "anthropic" in target["res"].spec.agent.apis


def test_codex_config_points_at_the_frontend() -> None:
    config = tomllib.loads((ROOT / "examples" / "harness" / "codex-config.toml").read_text())
    target = _by_stem("qwen3-coder-b200")
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == target["url"] + "/v1"
    assert provider["wire_api"] == "responses"
    assert config["model"] == target["res"].spec.model.name
    assert "responses" in target["res"].spec.agent.apis and target["res"].spec.agent.codex_catalog
