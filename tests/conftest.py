from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Test helper modules (e.g. corpus_cases) import by their bare name from their own directory.
sys.path.insert(0, str(Path(__file__).parent / "unit" / "families"))

settings.register_profile("ci", max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci")

# Shared helpers for the Kubernetes tests (tests/kubecheck.py), imported by bare name.
sys.path.insert(0, str(Path(__file__).parent))


# Suites that share one expensive session fixture run on one xdist worker each (`--dist loadgroup`):
# the control plane of tests/e2e_k8s and the images built by tests/images. Everything else spreads.
_SERIAL_GROUPS = {"e2e_k8s": "k8s", "images": "images"}


# scripts/test runs the suite in two phases: AGENTSERVE_TEST_PHASE=parallel (under xdist) leaves out the
# tests marked `serial`, AGENTSERVE_TEST_PHASE=serial runs only them; unset, everything runs.
_PHASES = {"parallel": False, "serial": True}


# First: xdist reads the groups in its own hook of the same name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        parts = Path(str(item.fspath)).relative_to(tests).parts
        group = _SERIAL_GROUPS.get(parts[0]) if len(parts) > 1 else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    phase = os.environ.get("AGENTSERVE_TEST_PHASE", "")
    if phase in _PHASES:
        wanted = _PHASES[phase]
        left_out = [item for item in items if (item.get_closest_marker("serial") is not None) != wanted]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if (item.get_closest_marker("serial") is not None) == wanted]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` xdist tags each grouped test's id with its group; if a pytest or
    xdist upgrade stops that, every worker would build its own control plane: stop instead."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    grouped = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group")]
    untagged = [nodeid for nodeid in grouped if "@" not in nodeid]
    if untagged:
        raise pytest.UsageError(f"xdist did not tag grouped tests (pytest, xdist versions?): {untagged[:3]}")
