"""scripts/gpu-smoke: the checks a person with one GPU node runs (they need a GPU; here only their
presence and the refusal to run without a model are checked)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Any

import pytest

from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.outputs import ScriptPolicy
from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER, HFTokenizer

SCRIPT = Path(__file__).parents[3] / "scripts" / "gpu-smoke"


def smoke_module() -> Any:
    loader = SourceFileLoader("gpu_smoke", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_smoke", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_smoke_script_has_every_check_and_needs_a_model() -> None:
    module = smoke_module()
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
        "guided",
        "kill",
    }
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env={}, check=False)
    assert done.returncode == 2 and "AGENTSERVE_GPU_SMOKE_MODEL" in done.stdout


class _ChatTokenizer:
    """What the check asks of a transformers tokenizer, over the embedded one (ChatML prompts)."""

    def __init__(self) -> None:
        self.hf = HFTokenizer.from_file(EMBEDDED_TOKENIZER)

    def convert_tokens_to_ids(self, text: str) -> int | None:
        ids = self.hf.encode(text)
        return ids[0] if len(ids) == 1 else None

    def apply_chat_template(self, messages: list[dict[str, str]], **_: object) -> list[int]:
        return self.hf.encode(
            f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
        )

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids)


@pytest.mark.anyio
@pytest.mark.parametrize("family", ["gpt-oss", "qwen3", "kimi-k2", "qwen3-coder"])
async def test_the_guided_check_passes_against_the_sim(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `guided` check's own logic (constraints built for the family, the outputs checked
    against the grammar and parsed) run against the sim, which obeys constraints as TensorRT-LLM's
    guided decoding must; its script answers with neither JSON nor a call."""
    (tmp_path / "tokenizer.json").write_text(Path(EMBEDDED_TOKENIZER).read_text())
    module = smoke_module()
    monkeypatch.setattr(module, "MODEL", str(tmp_path))
    monkeypatch.setenv("AGENTSERVE_GPU_SMOKE_FAMILY", family)
    tok = _ChatTokenizer()
    monkeypatch.setattr(module, "tokenizer", lambda: tok)
    settings: list[dict[str, object]] = []

    async def engine(**given: object) -> SimEngine:
        settings.append(given)
        script = ScriptPolicy.from_mapping({"rules": [], "default": "Hello there! How can I help?"}, None)
        sim = SimEngine(SimConfig(speedup=0), tok.hf, script)
        await sim.start()
        return sim

    monkeypatch.setattr(module, "engine", engine)
    said = await module.check_guided()
    assert said.startswith(f"{family}, llguidance: answer {{") and "; call {" in said
    assert settings == [{"guided_decoding_backend": "llguidance"}]
