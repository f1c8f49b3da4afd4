"""scripts/gpu-smoke: the checks a person with one GPU node runs (they need a GPU; here only their
presence and the refusal to run without a model are checked)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

SCRIPT = Path(__file__).parents[3] / "scripts" / "gpu-smoke"


def test_the_smoke_script_has_every_check_and_needs_a_model() -> None:
    loader = SourceFileLoader("gpu_smoke", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_smoke", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    assert set(module.CHECKS) == {
        "stop",
        "cancel",
        "adp",
        "gauges",
        "cached",
        "retention",
        "logprobs",
        "profile",
        "multinode",
        "disagg",
        "kill",
    }
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env={}, check=False)
    assert done.returncode == 2 and "AGENTSERVE_GPU_SMOKE_MODEL" in done.stdout
