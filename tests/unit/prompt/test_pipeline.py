"""render_prompt: the stages together, settings from configuration, purity."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from importlib import resources
from pathlib import Path

import pytest
from prompt_cases import TOOLS, conversation

from agentserve.config import PromptConfig, ReplayPolicy
from agentserve.conversation import Conversation, Image, Message, Reasoning, Text, ToolCall
from agentserve.prompt.hashing import block_hashes
from agentserve.prompt.messages import UnsupportedContentError
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.template import ChatTemplate, ModelTemplates, PromptError, TemplateLoadError

SHOW_KWARGS = "{{ truncate_history_thinking }}|{{ enable_thinking }}|{{ thinking }}|{{ custom }}"


def test_tokens_and_hashes_follow_the_configured_block_size_and_seed() -> None:
    pipeline = PromptPipeline.for_family("qwen3", block_size=8, hash_seed=1337)
    rendered = render_prompt(conversation(), pipeline)
    assert list(rendered.token_ids) == pipeline.tokenizer.encode(rendered.text)
    assert list(rendered.block_hashes) == block_hashes(rendered.token_ids, 8, 1337)
    assert len(rendered.block_hashes) == len(rendered.token_ids) // 8


def test_the_same_request_renders_the_same_prompt() -> None:
    pipeline = PromptPipeline.for_family("qwen3")
    now = datetime(2026, 1, 2)
    assert render_prompt(conversation(), pipeline, now=now) == render_prompt(
        conversation(), pipeline, now=now
    )


def show_kwargs(conv: Conversation, truncate: bool, **kwargs: object) -> str:
    pipeline = PromptPipeline(
        PromptPipeline.for_family("qwen3").family,
        ModelTemplates.single(SHOW_KWARGS),
        PromptPipeline.for_family("qwen3").tokenizer,
        truncate_history_thinking=truncate,
    )
    return render_prompt(conv, pipeline, **kwargs).text  # type: ignore[arg-type]


def test_agent_traffic_never_lets_the_template_truncate_reasoning() -> None:
    chat = Conversation((), (Message("user", (Text("hi"),)),))
    agent = Conversation((), chat.messages, TOOLS)
    assert show_kwargs(chat, truncate=True).startswith("True|")
    assert show_kwargs(agent, truncate=True).startswith("False|")
    assert show_kwargs(chat, truncate=False).startswith("False|")


def test_thinking_switch_and_client_template_arguments_reach_the_template() -> None:
    chat = Conversation((), (Message("user", (Text("hi"),)),))
    assert show_kwargs(chat, False) == "False|||"
    out = show_kwargs(chat, False, enable_thinking=True, template_kwargs={"custom": "x"})
    assert out == "False|True|True|x"
    out = show_kwargs(chat, False, template_kwargs={"truncate_history_thinking": True})
    assert out.startswith("True|")  # a client that sets it explicitly is obeyed


def test_images_are_a_prompt_error_for_the_client() -> None:
    conv = Conversation((), (Message("user", (Image(url="http://x/y.png"),)),))
    with pytest.raises(UnsupportedContentError):
        render_prompt(conv, PromptPipeline.for_family("qwen3"))
    assert issubclass(UnsupportedContentError, PromptError)


def test_replay_mode_is_reported() -> None:
    turn = Message("assistant", (Reasoning("r"), ToolCall("1", "f")))
    conv = conversation(turn)
    assert render_prompt(conv, PromptPipeline.for_family("qwen3")).replay == "native"
    drop = PromptPipeline.for_family("qwen3", replay=ReplayPolicy.DROP)
    assert render_prompt(conv, drop).replay == "drop"
    assert "<think>" not in render_prompt(conv, drop).text.split("<|im_start|>user")[1]


def model_dir(tmp_path: Path, template: str) -> Path:
    embedded = Path(str(resources.files("agentserve.data").joinpath("tokenizer.json")))
    shutil.copy(embedded, tmp_path / "tokenizer.json")
    config = {"chat_template": template, "bos_token": "<|begin_of_text|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


def test_from_config_reads_the_model_directory(tmp_path: Path) -> None:
    path = model_dir(tmp_path, "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}")
    config = PromptConfig(model="Qwen/Qwen3-8B", model_path=str(path), block_size=4, hash_seed=7)
    pipeline = PromptPipeline.from_config(config)
    assert pipeline.family.name == "qwen3"
    rendered = render_prompt(Conversation((), (Message("user", (Text("hi"),)),)), pipeline)
    assert rendered.text == "<|begin_of_text|>[hi]"
    assert rendered.replay == "inject"  # this template does not read reasoning; qwen3 has a think block
    assert list(rendered.block_hashes) == block_hashes(rendered.token_ids, 4, 7)


def test_from_config_falls_back_to_the_family_template_and_honours_an_override(tmp_path: Path) -> None:
    path = model_dir(tmp_path, "")
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    pipeline = PromptPipeline.from_config(PromptConfig(family="qwen3", model_path=str(path)))
    assert pipeline.templates.select(False).source == pipeline.family.chat_template
    override = tmp_path / "mine.jinja"
    override.write_text("mine", encoding="utf-8")
    pipeline = PromptPipeline.from_config(PromptConfig(family="qwen3", chat_template=str(override)))
    assert pipeline.templates.select(False) == ChatTemplate("mine")


def test_from_config_needs_a_family() -> None:
    with pytest.raises(TemplateLoadError, match="cannot infer the model family"):
        PromptPipeline.from_config(PromptConfig(model="acme/widget"))
    with pytest.raises(TemplateLoadError, match="unknown model family"):
        PromptPipeline.from_config(PromptConfig(family="nope"))
