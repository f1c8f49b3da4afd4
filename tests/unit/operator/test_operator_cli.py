"""`agentserve crd` and `agentserve manifests`: what a user runs before `kubectl apply`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from agentserve.cli import main
from agentserve.operator.crd import crd_yaml
from kubecheck import assert_valid

VALID = """\
apiVersion: agentserve.dev/v1alpha1
kind: AgentServingDeployment
metadata:
  name: coder
spec:
  model:
    name: Qwen/Qwen3-32B
  workers:
    engine: sim
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["crd"], capsys) == (0, crd_yaml(), "")


def test_manifests_prints_valid_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "asd.yaml"
    path.write_text(VALID)
    code, out, err = run(["manifests", "-f", str(path), "-n", "agents"], capsys)
    assert (code, err) == (0, "")
    objs = [o for o in yaml.safe_load_all(out) if o]
    assert {o["metadata"]["namespace"] for o in objs} == {"agents"}
    assert len([o for o in objs if o["kind"] == "Deployment"]) == 3
    assert_valid(objs)


def test_manifests_reads_several_documents_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    second = VALID.replace("name: coder", "name: chat\n  namespace: other")
    monkeypatch.setattr("sys.stdin", io.StringIO(VALID + "---\n" + second))
    code, out, _ = run(["manifests", "-f", "-"], capsys)
    assert code == 0
    names = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in yaml.safe_load_all(out) if o}
    assert ("default", "coder-frontend") in names and ("other", "chat-frontend") in names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            VALID.replace("engine: sim", "engine: vllm"),
            "spec.workers.engine: Input should be 'trtllm' or 'sim'",
        ),
        (
            VALID.replace("engine: sim", "engine: sim\n    tensorParallelSize: 2"),
            "spec.workers: the sim engine",
        ),
        (VALID.replace("engine: sim", "engine: trtllm"), "spec: the trtllm engine needs model.source"),
        (
            VALID.replace("    engine: sim", "    engine: sim\n    replicaz: 2"),
            "spec.workers.replicaz: Extra inputs",
        ),
        (VALID.replace("name: coder", "name: Coder"), "metadata.name: metadata.name must be a DNS label"),
        (VALID.replace("kind: AgentServingDeployment", "kind: Deployment"), "apiVersion/kind: expected"),
        (VALID + "status2: {}\n", "status2: unknown field"),
        ("a: [", "not YAML"),
        ("", "no AgentServingDeployment found"),
    ],
)
def test_invalid_input_exits_2_naming_the_field(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "asd.yaml"
    path.write_text(text)
    code, out, err = run(["manifests", "-f", str(path)], capsys)
    assert code == 2 and out == ""
    assert expected in err
    assert str(path) in err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["manifests", "-f", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "nope.yaml" in err


def test_operator_command_passes_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentserve.operator import handlers

    seen: dict[str, object] = {}

    def fake_run(**kwargs: object) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(handlers, "run_operator", fake_run)
    assert main(["operator", "-n", "ai", "-n", "research", "--metrics-port", "0", "--liveness", ""]) == 0
    assert seen == {
        "namespaces": ["ai", "research"],
        "liveness": "",
        "metrics_port": 0,
        "verbose": False,
        "manage_crd": False,
        "resync_seconds": 30.0,
        "peering": None,
    }
    assert main(["operator", "--manage-crd", "--peering", "agentserve"]) == 0
    assert seen["manage_crd"] is True and seen["peering"] == "agentserve"


def test_kopf_run_module_registers_handlers_and_the_cli_does_not_need_kopf() -> None:
    import subprocess
    import sys

    env_code = (
        "import sys, kopf, agentserve.operator as op; "
        "assert op.handlers.reconcile; "
        "ids = {h.id for h in kopf.get_default_registry()._changing.get_all_handlers()}; "
        "assert 'reconcile' in ids, ids"
    )
    subprocess.run([sys.executable, "-c", env_code], check=True, timeout=60)
    light = (
        "import sys, agentserve.operator.manifests, agentserve.operator.crd; "
        "assert 'kopf' not in sys.modules and 'kubernetes' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", light], check=True, timeout=60)
