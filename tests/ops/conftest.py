"""Fixtures of the operations tests: the real promtool, skipped with the reason where it is not built,
except in CI (CI=true), where a missing promtool is a failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Helpers imported by bare name: this directory's and the frontend integration tests' (the stack).
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "frontend"))

from promtool_runner import Promtool, promtool_path  # noqa: E402


@pytest.fixture(scope="session")
def promtool() -> Promtool:
    path = promtool_path()
    if not path.exists():
        reason = f"promtool not built at {path}: run scripts/install-promtool (needs Go)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return Promtool(path)
