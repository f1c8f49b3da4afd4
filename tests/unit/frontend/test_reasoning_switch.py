"""A requested reasoning effort switches hybrid-thinking templates on, in every API (issue 18, item 2).

The frontend's `render` is what the real request renders: each API's knob is decoded, mapped onto
`enable_thinking` (and gpt-oss's `Reasoning:` level), and the deployment default fills the gap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentserve.api import decode_chat, decode_messages, decode_responses
from agentserve.api.options import ReasoningOptions
from agentserve.api.request import DecodedRequest
from agentserve.api.signing import Signer
from agentserve.config import UpConfig
from agentserve.families import FAMILIES
from agentserve.frontend.app import frontend_of
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.service import Frontend
from agentserve.frontend.up import build_up
from agentserve.prompt.pipeline import PromptPipeline, render_prompt

USER = "list the files"
SIGNER = Signer(b"0123456789abcdef0123456789abcdef")

# Families whose template has a thinking switch (rendering differs with it on and off).
HYBRID = ("deepseek-r1", "deepseek-v3.1", "glm-4.5", "minimax-m2", "nemotron", "qwen3", "qwen3-coder")


def frontend(family: str, **settings: Any) -> Frontend:
    config = UpConfig.model_validate({"port": 0, "sim_speedup": 0, "family": family, **settings})
    app, _ = build_up(config, keys=ApiKeys())
    return frontend_of(app)


def chat(effort: str | None) -> DecodedRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": USER}]}
    if effort is not None:
        body["reasoning_effort"] = effort
    return decode_chat(body)


def responses(effort: str | None) -> DecodedRequest:
    body: dict[str, Any] = {"model": "m", "input": USER}
    if effort is not None:
        body["reasoning"] = {"effort": effort}
    return decode_responses(body, signer=SIGNER)


def anthropic(effort: str | None) -> DecodedRequest:
    body: dict[str, Any] = {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": USER}]}
    if effort == "adaptive":
        body["thinking"] = {"type": "adaptive"}
    elif effort == "enabled":
        body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    elif effort == "disabled":
        body["thinking"] = {"type": "disabled"}
    elif effort is not None:
        body["output_config"] = {"effort": effort}
    return decode_messages(body)


APIS: dict[str, Callable[[str | None], DecodedRequest]] = {
    "chat": chat,
    "responses": responses,
    "anthropic": anthropic,
}
ON = {"chat": ("low", "medium", "high", "xhigh"), "responses": ("low", "medium", "high", "xhigh")}
ON["anthropic"] = ("adaptive", "enabled", "low", "high", "max")
OFF = {"chat": ("none", "minimal"), "responses": ("none", "minimal"), "anthropic": ("disabled",)}


def switched(family: str, thinking: bool) -> str:
    pipeline = PromptPipeline.for_family(family)
    return render_prompt(chat(None).conversation, pipeline, enable_thinking=thinking).text


def test_the_hybrid_families_are_the_ones_with_a_switch() -> None:
    # The list above is what the templates do: a family added with a switch must be listed.
    names = sorted(f.name for f in FAMILIES)
    assert tuple(n for n in names if switched(n, True) != switched(n, False)) == HYBRID


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize("family", HYBRID)
def test_an_effort_turns_thinking_on_and_none_turns_it_off(family: str, api: str) -> None:
    f = frontend(family)
    on, off = switched(family, True), switched(family, False)
    for effort in ON[api]:
        assert f.render(APIS[api](effort)).text == on, effort
    for effort in OFF[api]:
        assert f.render(APIS[api](effort)).text == off, effort


def test_deepseek_v31_opens_its_think_block_when_codex_or_pi_ask_for_medium() -> None:
    f = frontend("deepseek-v3.1")
    assert f.render(chat(None)).text.endswith("<｜Assistant｜></think>")  # the template's default: off
    for request in (chat("medium"), responses("medium")):
        prompt = f.render(request)
        assert prompt.text.endswith("<｜Assistant｜><think>") and prompt.starts_in_reasoning


@pytest.mark.parametrize(
    ("default", "effort", "expected"),
    [
        ("template", None, None),
        ("on", None, True),
        ("off", None, False),
        ("off", "medium", True),  # the client's ask wins over the deployment
        ("on", "none", False),
    ],
)
def test_the_deployment_default_applies_when_the_request_names_no_effort(
    default: str, effort: str | None, expected: bool | None
) -> None:
    f = frontend("deepseek-v3.1", reasoning_default=default)
    text = f.render(chat(effort)).text
    if expected is None:
        assert text == render_prompt(chat(None).conversation, PromptPipeline.for_family("deepseek-v3.1")).text
    else:
        assert text == switched("deepseek-v3.1", expected)


@pytest.mark.parametrize(
    ("api", "effort", "line"),
    [
        ("chat", None, "Reasoning: medium"),
        ("chat", "low", "Reasoning: low"),
        ("chat", "minimal", "Reasoning: low"),
        ("chat", "high", "Reasoning: high"),
        ("responses", "xhigh", "Reasoning: high"),
        ("responses", "medium", "Reasoning: medium"),
        ("anthropic", "max", "Reasoning: high"),
        ("anthropic", "low", "Reasoning: low"),
    ],
)
def test_gpt_oss_maps_the_effort_onto_its_reasoning_line(api: str, effort: str | None, line: str) -> None:
    text = frontend("gpt-oss").render(APIS[api](effort)).text
    assert line + "\n" in text or text.split("<|end|>")[0].endswith(line)


def test_a_clients_template_kwargs_win_over_the_mapped_level() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": USER}],
        "reasoning_effort": "high",
        "chat_template_kwargs": {"reasoning_effort": "low"},
    }
    assert "Reasoning: low" in frontend("gpt-oss").render(decode_chat(body)).text


def test_explicit_switches_win_over_the_effort() -> None:
    assert ReasoningOptions(mode="disabled", effort="high").enabled is False
    assert ReasoningOptions(mode="adaptive", effort="low").enabled is True
    assert ReasoningOptions(mode="enabled", effort="none").enabled is True
    assert ReasoningOptions().enabled is None and ReasoningOptions().level is None
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": USER}],
        "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert frontend("qwen3").render(decode_chat(body)).text == switched("qwen3", False)
