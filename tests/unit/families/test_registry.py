from __future__ import annotations

import pytest

from agentserve.families import UnknownFamilyError, family_for_model, get_family


def test_lookup_by_name_and_alias_is_case_and_separator_insensitive() -> None:
    assert get_family("qwen3").name == "qwen3"
    assert get_family("Hermes").name == "qwen3"
    assert get_family("QWEN25").name == "qwen3"


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
    ],
)
def test_family_inferred_from_model_name(model: str, family: str) -> None:
    found = family_for_model(model)
    assert found is not None and found.name == family


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
