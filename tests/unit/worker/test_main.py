from __future__ import annotations

from pathlib import Path

import pytest
from tiny_tokenizer import write_tiny_tokenizer

from agentserve.config import ConfigError, WorkerConfig
from agentserve.worker.engines.sim import SimEngine
from agentserve.worker.main import build_engine, build_policy
from agentserve.worker.outputs import HARMONY, THINK_TAGS, EchoPolicy, ScriptPolicy
from agentserve.worker.tokenizer import ByteTokenizer, HFTokenizer


def test_sim_engine_from_config(tmp_path: Path) -> None:
    tok = write_tiny_tokenizer(tmp_path)
    cfg = WorkerConfig(
        tokenizer=str(tok), block_size=16, sim_kv_blocks=100, max_batch_size=4, sim_speedup=float("inf"),
        enable_block_reuse=False,
    )  # fmt: skip
    engine = build_engine(cfg)
    assert isinstance(engine, SimEngine)
    assert isinstance(engine.tokenizer, HFTokenizer)
    assert engine.block_size == 16 and engine.pool.num_blocks == 100
    assert engine.config.scheduler.max_batch_size == 4 and not engine.config.scheduler.prefix_caching
    assert engine.config.zero_time


def test_model_path_and_fallback_tokenizers(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path)
    assert isinstance(build_engine(WorkerConfig(model_path=str(tmp_path))).tokenizer, HFTokenizer)  # type: ignore[attr-defined]
    empty = tmp_path / "empty"
    empty.mkdir()
    # No tokenizer in the model dir: the embedded default tokenizer (package data) is used.
    fallback = build_engine(WorkerConfig(model_path=str(empty))).tokenizer  # type: ignore[attr-defined]
    assert isinstance(fallback, HFTokenizer)
    assert fallback.encode("<tool_call>") == [fallback.encode("<tool_call>")[0]]  # markers are single tokens
    with pytest.raises(ConfigError, match="tokenizer"):
        build_engine(WorkerConfig(tokenizer=str(tmp_path / "missing.json")))


def test_echo_format_follows_the_family() -> None:
    tok = ByteTokenizer()
    qwen = build_policy(WorkerConfig(model="Qwen/Qwen3-30B-A3B"), tok)
    assert isinstance(qwen, EchoPolicy) and qwen.fmt is THINK_TAGS
    oss = build_policy(WorkerConfig(family="gpt-oss"), tok)
    assert isinstance(oss, EchoPolicy) and oss.fmt is HARMONY


def test_script_policy_must_survive_the_tokenizer(tmp_path: Path) -> None:
    script = tmp_path / "s.yaml"
    script.write_text('rules:\n  - turn: 1\n    output: "<tool_call>\\n{}\\n</tool_call>"\n')
    assert isinstance(build_policy(WorkerConfig(sim_script=str(script)), ByteTokenizer()), ScriptPolicy)

    class Lossy(ByteTokenizer):
        def decode(self, ids: object) -> str:  # type: ignore[override]
            return "?"

    with pytest.raises(ConfigError, match="exactly"):
        build_policy(WorkerConfig(sim_script=str(script)), Lossy())
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: 1\n")
    with pytest.raises(ConfigError, match="rules"):
        build_policy(WorkerConfig(sim_script=str(bad)), ByteTokenizer())
