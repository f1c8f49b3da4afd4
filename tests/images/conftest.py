"""The images built for real (scripts/build-images: debootstrap base, buildah) and run with podman.

Tests marked `images` need root, buildah, podman, runc and debootstrap (scripts/test installs them from
Debian); elsewhere they skip with the reason, and fail under CI=true. The session builds both CPU images
once from this tree, tagged for this checkout (AGENTSERVE_IMAGES_PREBUILT=1 reuses them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helper modules here (podman_harness, kubeplay) import by their bare names.
sys.path.insert(0, str(Path(__file__).parent))

from podman_harness import BUILD_TIMEOUT_S, ROOT, Podman, build_env, script_env, unusable


@pytest.fixture(scope="session")
def built() -> dict[str, str]:
    reason = unusable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"images tests cannot run in CI: {reason}")
        pytest.skip(reason)
    if os.environ.get("AGENTSERVE_IMAGES_PREBUILT") != "1":
        started = time.monotonic()
        result = subprocess.run(
            [str(ROOT / "scripts" / "build-images")],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
            env=script_env(),
        )
        assert result.returncode == 0, result.stderr[-6000:]
        # Sizes and layers (scripts/build-images' stdout) for the log of the run.
        print(f"\nscripts/build-images: {time.monotonic() - started:.0f} s\n{result.stdout}")
    return build_env()


@pytest.fixture
def podman(built: dict[str, str]) -> Iterator[Podman]:
    env = {**os.environ, **built}
    handle = Podman(env, agentserve=built["AGENTSERVE_IMAGE"], operator=built["AGENTSERVE_OPERATOR_IMAGE"])
    try:
        yield handle
    finally:
        handle.cleanup()
