"""The real promtool (scripts/install-promtool builds it from Go modules, cached) for tests/ops."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def promtool_path() -> Path:
    """Where scripts/promtool_build.py puts the binary of its pinned release."""
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
