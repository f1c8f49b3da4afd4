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
        ("openai/gpt-oss-120b", "gpt-oss"),
        ("openai/gpt-oss-20b", "gpt-oss"),
        ("moonshotai/Kimi-K2-Instruct-0905", "kimi-k2"),
        ("moonshotai/Kimi-K2-Thinking", "kimi-k2"),
        ("moonshotai/Kimi-K2.5", "kimi-k2"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3.1"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3.1"),
        ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3.1"),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseek-v3.1"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "deepseek-r1"),
        ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mistral"),
        ("mistralai/Magistral-Small-2509", "mistral"),
        ("mistralai/Devstral-Small-2507", "mistral"),
        ("mistralai/Ministral-8B-Instruct-2410", "mistral"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3-json"),
        ("meta-llama/Llama-3.2-3B-Instruct", "llama3-json"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama3-json"),
        ("meta-llama/Meta-Llama-3.1-405B-Instruct-FP8", "llama3-json"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "pythonic"),
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8", "pythonic"),
        ("allenai/Olmo-3-7B-Instruct", "pythonic"),
        ("nvidia/Llama-3.1-Nemotron-Nano-8B-v1", "nemotron"),
        ("nvidia/Llama-3_3-Nemotron-Super-49B-v1_5", "nemotron"),
        ("nvidia/Llama-3_1-Nemotron-Ultra-253B-v1", "nemotron"),
        ("nvidia/Llama-3.3-Nemotron-Super-49B-v1", "nemotron"),
        ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "nemotron"),
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


@pytest.mark.parametrize(
    "model",
    [
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",  # Qwen3-Coder XML calls: not the nemotron family
        "nvidia/Nemotron-3-Super-120B-A12B",
        "meta-llama/Llama-3-8B-Instruct",  # Llama 3.0 has no tool-call format
        "meta-llama/Llama-2-7b-chat-hf",
    ],
)
def test_models_of_other_formats_are_not_taken_by_json_families(model: str) -> None:
    found = family_for_model(model)
    assert found is None or found.name not in {"nemotron", "llama3-json", "pythonic", "mistral"}


@pytest.mark.parametrize(
    ("alias", "family"),
    [
        ("magistral", "mistral"),
        ("Devstral", "mistral"),
        ("llama3_json", "llama3-json"),
        ("llama3", "llama3-json"),
        ("llama-3.1", "llama3-json"),
        ("llama4_pythonic", "pythonic"),
        ("llama-4", "pythonic"),
        ("olmo-3", "pythonic"),
        ("nemotron_deci", "nemotron"),
        ("nemotron-json", "nemotron"),
        ("llama-nemotron", "nemotron"),
    ],
)
def test_json_family_aliases(alias: str, family: str) -> None:
    assert get_family(alias).name == family


def test_unrelated_model_name_has_no_family() -> None:
    assert family_for_model("acme/widget-7b") is None


@pytest.mark.parametrize(
    ("alias", "family"),
    [
        ("harmony", "gpt-oss"),
        ("gpt_oss", "gpt-oss"),
        ("openai", "gpt-oss"),
        ("kimi_k2", "kimi-k2"),
        ("Kimi-K2.5", "kimi-k2"),
        ("kimi-k25", "kimi-k2"),
        ("kimi-k2-thinking", "kimi-k2"),
        ("deepseek_v31", "deepseek-v3.1"),
        ("deepseek_v3", "deepseek-v3.1"),
        ("deepseek-v3", "deepseek-v3.1"),
        ("deepseek-v3.1-terminus", "deepseek-v3.1"),
        ("deepseek_r1", "deepseek-r1"),
    ],
)
def test_special_token_family_aliases(alias: str, family: str) -> None:
    assert get_family(alias).name == family


def test_deepseek_v32_is_not_the_v3_family() -> None:
    # V3.2 writes DSML tool calls, a different format.
    for model in ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek-ai/DeepSeek-V3.2"):
        found = family_for_model(model)
        assert found is None or found.name != "deepseek-v3.1", model
    assert family_for_model("deepseek-ai/DeepSeek-V3.1") is get_family("deepseek-v3")


def test_deepseek_r1_starts_in_reasoning_and_v31_does_not() -> None:
    assert get_family("deepseek-r1").starts_in_reasoning
    assert not get_family("deepseek-v3.1").starts_in_reasoning
