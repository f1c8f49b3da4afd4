from __future__ import annotations

import pytest
from anthropic.types import ModelInfo
from openai.types import Model

from agentserve.api.catalog import (
    ModelFacts,
    anthropic_model,
    anthropic_models,
    codex_catalog,
    find_model,
    openai_models,
)
from agentserve.api.errors import InvalidRequestError, ModelNotFoundError

from .helpers import Recorder, anthropic_client, openai_client

QWEN = ModelFacts(
    id="qwen3-coder",
    display_name="Qwen3 Coder (local)",
    context_window=262144,
    max_output_tokens=65536,
    created=1753142400,
    reasoning=True,
    reasoning_levels=("low", "medium", "high"),
    default_reasoning_level="medium",
    aliases=("claude-qwen3-coder",),
)
OSS = ModelFacts(id="gpt-oss-120b", input_modalities=("text", "image"))

# The fields Codex requires without a serde default (codex-rs/protocol/src/openai_models.rs).
CODEX_REQUIRED = {
    "slug", "display_name", "supported_reasoning_levels", "shell_type", "visibility", "supported_in_api",
    "priority", "base_instructions", "supports_reasoning_summaries", "support_verbosity",
    "truncation_policy", "supports_parallel_tool_calls", "experimental_supported_tools",
}  # fmt: skip


def test_anthropic_shape_through_the_sdk() -> None:
    page = anthropic_models([QWEN, OSS], limit=1000)
    assert [m["id"] for m in page["data"]] == ["qwen3-coder", "claude-qwen3-coder", "gpt-oss-120b"]
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("qwen3-coder", "gpt-oss-120b", False)
    for m in page["data"]:
        ModelInfo.model_validate(m)
    client = anthropic_client(Recorder(page))
    listed = list(client.models.list(limit=1000))
    assert [m.id for m in listed] == ["qwen3-coder", "claude-qwen3-coder", "gpt-oss-120b"]
    assert listed[0].max_input_tokens == 262144 and listed[0].max_tokens == 65536
    assert listed[0].created_at.year == 2025
    one = anthropic_model(QWEN)
    assert (
        anthropic_client(Recorder(one)).models.retrieve("qwen3-coder").display_name == "Qwen3 Coder (local)"
    )


def test_anthropic_pagination() -> None:
    models = [ModelFacts(id=f"m{i}") for i in range(5)]
    first = anthropic_models(models, limit=2)
    assert [m["id"] for m in first["data"]] == ["m0", "m1"] and first["has_more"]
    second = anthropic_models(models, limit=2, after_id=first["last_id"])
    assert [m["id"] for m in second["data"]] == ["m2", "m3"] and second["has_more"]
    last = anthropic_models(models, limit=2, after_id="m3")
    assert [m["id"] for m in last["data"]] == ["m4"] and not last["has_more"]
    before = anthropic_models(models, limit=2, before_id="m4")
    assert [m["id"] for m in before["data"]] == ["m2", "m3"] and before["has_more"]
    for kwargs in ({"limit": 0}, {"limit": 1001}, {"after_id": "zz"}, {"before_id": "zz"}):
        with pytest.raises(InvalidRequestError):
            anthropic_models(models, **kwargs)  # type: ignore[arg-type]
    empty = anthropic_models([])
    assert empty == {"data": [], "has_more": False, "first_id": None, "last_id": None}


def test_openai_shape_through_the_sdk_also_carries_the_codex_catalog() -> None:
    body = openai_models([QWEN, OSS], codex=True)
    for m in body["data"]:
        Model.model_validate(m)
    listed = list(openai_client(Recorder(body)).models.list())
    assert [m.id for m in listed] == ["qwen3-coder", "claude-qwen3-coder", "gpt-oss-120b"]
    assert body["models"] == codex_catalog([QWEN, OSS])["models"]
    assert "models" not in openai_models([QWEN])


def test_codex_model_info() -> None:
    info = codex_catalog([QWEN])["models"][0]
    assert set(info) >= CODEX_REQUIRED
    assert info["slug"] == "qwen3-coder"
    assert info["truncation_policy"] == {"mode": "tokens", "limit": 10000}
    assert info["apply_patch_tool_type"] is None  # Codex 0.169.0 rejects "function"
    assert info["context_window"] == 262144 and info["auto_compact_token_limit"] == 235929
    assert info["supports_parallel_tool_calls"] is True and info["supports_reasoning_summaries"] is True
    assert [lvl["effort"] for lvl in info["supported_reasoning_levels"]] == ["low", "medium", "high"]
    assert info["default_reasoning_level"] == "medium"
    assert info["shell_type"] == "shell_command" and info["visibility"] == "list"
    assert info["base_instructions"]
    plain = codex_catalog([OSS])["models"][0]
    assert plain["supports_reasoning_summaries"] is False and plain["supported_reasoning_levels"] == []
    assert plain["input_modalities"] == ["text", "image"] and plain["description"] is None


def test_find_model() -> None:
    assert find_model([QWEN, OSS], "claude-qwen3-coder") is QWEN
    with pytest.raises(ModelNotFoundError) as err:
        find_model([QWEN], "gpt-9")
    assert err.value.status_for("anthropic") == 404
    assert err.value.anthropic_body()["error"]["type"] == "not_found_error"
    assert err.value.openai_body()["error"]["code"] == "model_not_found"
