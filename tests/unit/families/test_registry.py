from __future__ import annotations

import pytest

from agentserve.families import UnknownFamilyError, family_for_model, get_family


def test_lookup_by_name_and_alias_is_case_and_separator_insensitive() -> None:
    assert get_family("qwen3").name == "qwen3"
    assert get_family("Hermes").name == "qwen3"
    assert get_family("QWEN25").name == "qwen3"


@pytest.mark.parametrize(
    ("alias", "family"),
    [
        ("qwen3_coder", "qwen3-coder"),
        ("qwen3-xml", "qwen3-coder"),
        ("Qwen3.5", "qwen3-coder"),
        ("nemotron-3", "qwen3-coder"),
        ("nemotron_v3", "qwen3-coder"),
        ("nemotron-nano", "qwen3-coder"),
        ("step-3.5", "qwen3-coder"),
        ("glm45", "glm-4.5"),
        ("glm47", "glm-4.5"),
        ("GLM-4.6", "glm-4.5"),
        ("glm-4.7", "glm-4.5"),
        ("glm-5", "glm-4.5"),
        ("minimax_m2", "minimax-m2"),
        ("MiniMax-M2.1", "minimax-m2"),
        ("minimax-m2.5", "minimax-m2"),
        ("minimax-m2.7", "minimax-m2"),
    ],
)
def test_xml_family_aliases(alias: str, family: str) -> None:
    assert get_family(alias).name == family


def test_minimax_output_starts_in_reasoning() -> None:
    assert get_family("minimax-m2").starts_in_reasoning
    assert not get_family("glm-4.5").starts_in_reasoning


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(UnknownFamilyError, match=r"known families: .*qwen3"):
        get_family("no-such-model")


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("Qwen/Qwen3-8B", "qwen3"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3"),
        ("Qwen/QwQ-32B", "qwen3"),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder"),
        ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "qwen3-coder"),
        ("Qwen/Qwen3.5-397B-A17B", "qwen3-coder"),
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "qwen3-coder"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "qwen3-coder"),
        ("nvidia/Nemotron-3-Super-120B-A12B", "qwen3-coder"),
        ("stepfun-ai/Step-3.5-Flash", "qwen3-coder"),
        ("zai-org/GLM-4.5-Air", "glm-4.5"),
        ("zai-org/GLM-4.6-FP8", "glm-4.5"),
        ("zai-org/GLM-4.7", "glm-4.5"),
        ("zai-org/GLM-5", "glm-4.5"),
        ("MiniMaxAI/MiniMax-M2", "minimax-m2"),
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2"),
    ],
)
def test_family_inferred_from_model_name(model: str, family: str) -> None:
    found = family_for_model(model)
    assert found is not None and found.name == family


def test_unrelated_model_name_has_no_family() -> None:
    assert family_for_model("acme/widget-7b") is None
