"""Fixtures of the operations tests: the real promtool (scripts/install-promtool builds it from Go
modules, cached), skipped with the reason where it is not built, except in CI (CI=true), where a
missing promtool is a failure."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Helpers imported by bare name: this directory's and the frontend integration tests' (the stack).
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "frontend"))


def _promtool_path() -> Path:
    spec = importlib.util.spec_from_file_location("promtool_build", ROOT / "scripts" / "promtool_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.PROMTOOL
    return path


class Promtool:
    def __init__(self, path: Path) -> None:
        self.path = path

    def run(
        self, *args: str, stdin: str | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.path), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
            check=False,
        )


@pytest.fixture(scope="session")
def promtool() -> Promtool:
    path = _promtool_path()
    if not path.exists():
        reason = f"promtool not built at {path}: run scripts/install-promtool (needs Go)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return Promtool(path)
