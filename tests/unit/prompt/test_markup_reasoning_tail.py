"""Where generation starts: only the end of the prompt can leave a think block open."""

from __future__ import annotations

from agentserve.prompt.markup import FamilyMarkup

QWEN = FamilyMarkup(think_open="<think>\n", think_close="\n</think>\n\n")


def test_a_generation_prompt_that_opens_the_block_starts_in_reasoning() -> None:
    assert QWEN.ends_in_reasoning("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_a_think_tag_quoted_earlier_in_the_prompt_does_not() -> None:
    # Codex puts the model catalog's description into a tool description: "<think> reasoning, …".
    prompt = (
        '<|im_start|>system\n# Tools\n{"description": "Qwen3: <think> reasoning, <tool_call> calls"}'
        "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not QWEN.ends_in_reasoning(prompt)


def test_families_without_an_inline_block_never_do() -> None:
    assert not FamilyMarkup().ends_in_reasoning("<think>\n")
