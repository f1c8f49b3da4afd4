"""pi (`pi -p`, Chat Completions) completing its scripted tool loop against the network deployment with
disaggregated prefill: a frontend, a router, 1 prefill + 2 decode sim workers, all separate processes.
The loop must pass the same checks as against `agentserve up`, and the traces show where each turn's
prompt was prefilled (the cold first turn on the prefill worker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness_stack import Stack, check_loop_traces, running_split_stack
from harness_tools import MISS, PROMPT, check_loop_files, explain, require
from test_harness_pi import pi

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("pi")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_split_stack(tmp_path_factory.mktemp("split-stack"), "pi.yaml") as s:
        yield s


def test_pi_loop_over_prefill_and_decode_workers(binary: Path, stack: Stack, tmp_path: Path) -> None:
    result = pi(binary, stack, tmp_path, PROMPT)
    with explain(result, log=stack.log()):
        assert result.returncode == 0
        assert MISS not in result.stdout
        check_loop_files(tmp_path / "project")
    turns = check_loop_traces(stack.traces(3), "chat", "bash")
    prefill = [t["prefill"] for t in turns]
    assert all(p is not None for p in prefill), prefill
    assert prefill[0]["where"] == "remote" and prefill[0]["outcome"] == "remote", prefill[0]
    assert prefill[0]["received_tokens"] > 0
    assert all(p["outcome"] in ("local", "remote") for p in prefill), prefill
