"""The harness binaries `scripts/install-harnesses` puts in .tools, and running them headless.

Every run gets a fresh HOME (and config dirs) under the test's tmp directory and an environment built
from scratch: nothing of the developer's own Claude/Codex/pi setup (keys, base URLs, settings) leaks
in, and nothing the harness writes leaks out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness_stack import REPO

TOOLS = REPO / ".tools"
NODE24_BIN = TOOLS / "node24" / "bin"

BINARIES = {
    "claude": TOOLS / "harnesses" / "node_modules" / ".bin" / "claude",
    "codex": TOOLS / "harnesses" / "node_modules" / ".bin" / "codex",
    "pi": TOOLS / "harnesses" / "node_modules" / ".bin" / "pi",
    "openclaw": TOOLS / "openclaw" / "node_modules" / ".bin" / "openclaw",
}
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(name: str) -> Path:
    """The installed binary; absent: skip with the reason, or fail under CI=true (CI must run them)."""
    binary = BINARIES[name]
    missing = not binary.exists()
    if name == "openclaw" and not (NODE24_BIN / "node").exists():
        missing = True
    if missing:
        reason = f"{name} is not installed in {binary.parent} (run scripts/install-harnesses)"
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return binary


def base_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: system PATH (+ Node 24 for OpenClaw), a fresh HOME, no proxies."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{NODE24_BIN}:{SYSTEM_PATH}" if NODE24_BIN.exists() else SYSTEM_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "TMPDIR": str(home),
        # loopback only: never route the stack's traffic through a proxy the machine may define
        "NO_PROXY": "127.0.0.1,localhost",
    }
    env.update(extra)
    return env


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def json_lines(self) -> list[dict[str, Any]]:
        """stdout's JSON-lines events (non-JSON lines skipped)."""
        events: list[dict[str, Any]] = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    value = json.loads(line)
                    if isinstance(value, dict):
                        events.append(value)
        return events

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.returncode} after {self.seconds:.1f} s\n"
            f"--- stdout (tail)\n{self.stdout[-6000:]}\n--- stderr (tail)\n{self.stderr[-4000:]}"
        )


def run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float) -> Run:
    """Run a harness headless (stdin closed) in its own process group; the group dies on timeout."""
    start = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        stderr += f"\n[killed after {timeout} s]"
        return Run(list(argv), -9, stdout, stderr, time.monotonic() - start)
    finally:
        # tools the harness started in the background (its shells) go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return Run(list(argv), process.returncode, stdout, stderr, time.monotonic() - start)


@contextlib.contextmanager
def explain(*runs: Run, log: str = "") -> Iterator[None]:
    """Attach the harness's output and the server log to an assertion that fails inside."""
    try:
        yield
    except AssertionError as exc:
        detail = "\n\n".join(r.describe() for r in runs)
        raise AssertionError(f"{exc}\n\n{detail}\n--- agentserve log (tail)\n{log[-4000:]}") from None


def check_loop_files(project: Path) -> None:
    """What the scripted tool calls write: proof.txt (6*7 evaluated by the shell), then upper.txt."""
    proof, upper = project / "proof.txt", project / "upper.txt"
    assert proof.exists(), "turn 1's tool call did not run: no proof.txt"
    assert proof.read_text() == "agentserve-42\n"
    assert upper.exists(), "turn 2's first parallel call did not run: no upper.txt"
    assert upper.read_text() == "AGENTSERVE-42\n"


FINAL_TEXT = "HARNESS-LOOP-DONE: proof.txt and upper.txt are written."
MISS = "SCENARIO-MISS"
PROMPT = "Write proof.txt with your shell tool, then say done."
