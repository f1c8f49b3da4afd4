from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agentserve.config import (
    ConfigError,
    FrontendConfig,
    ReplayPolicy,
    WorkerConfig,
    add_config_flags,
    config_from_args,
    config_to_yaml,
    load_config,
)


def parse(model: type, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, model)
    return parser.parse_args(argv)


def test_flags_are_generated_from_fields_with_dynamo_names() -> None:
    args = parse(
        FrontendConfig,
        [
            "--no-strip-anthropic-preamble",
            "--enable-streaming-tool-dispatch",
            "--tool-call-parser",
            "hermes",
            "--replay-policy",
            "inject",
            "--apis",
            "chat",
            "--apis",
            "responses",
            "--strip-pattern",
            "date=Today is .*",
        ],
    )
    config = config_from_args(FrontendConfig, args)
    assert config.strip_anthropic_preamble is False
    assert config.enable_streaming_tool_dispatch is True
    assert config.tool_call_parser == "hermes"
    assert config.replay_policy is ReplayPolicy.INJECT
    assert config.apis == ["chat", "responses"]
    assert config.strip_pattern == ["date=Today is .*"]


def test_unset_flags_keep_file_values_and_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "frontend.yaml"
    path.write_text("port: 9000\nreasoning_parser: qwen3\nstrip_anthropic_preamble: false\n")
    config = config_from_args(
        FrontendConfig, parse(FrontendConfig, ["--config", str(path), "--port", "9100"])
    )
    assert config.port == 9100
    assert config.reasoning_parser == "qwen3"
    assert config.strip_anthropic_preamble is False


def test_yaml_round_trip_is_what_the_component_reads_back(tmp_path: Path) -> None:
    config = WorkerConfig(engine="trtllm", tensor_parallel_size=4, block_size=64)
    path = tmp_path / "worker.yaml"
    path.write_text(config_to_yaml(config))
    assert load_config(WorkerConfig, path) == config


def test_bad_values_are_config_errors_not_tracebacks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="block_size"):
        load_config(WorkerConfig, overrides={"block_size": 0})
    path = tmp_path / "bad.yaml"
    path.write_text("no_such_setting: 1\n")
    with pytest.raises(ConfigError, match="no_such_setting"):
        load_config(WorkerConfig, path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(WorkerConfig, path)


def test_invalid_choice_is_rejected_by_the_flag_parser() -> None:
    with pytest.raises(SystemExit):
        parse(WorkerConfig, ["--engine", "vllm"])
