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
    ],
)
def test_family_inferred_from_model_name(model: str, family: str) -> None:
    found = family_for_model(model)
    assert found is not None and found.name == family


def test_unrelated_model_name_has_no_family() -> None:
    assert family_for_model("acme/widget-7b") is None
