"""What the prompt pipeline needs to know about a family's markup, read from its fallback template.

Each fallback template (`families/templates/<name>.jinja`) declares, as top-level constants, the facts
that hold for the family whichever template renders it: its think block (with canonical whitespace),
whether tool-call ids have a native form, and whether system messages may appear mid-conversation.
Keeping them in the template keeps one source for the markup the template itself writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

from agentserve.families import Family
from agentserve.prompt.template import ChatTemplate

ToolCallIds = Literal["keep", "kimi", "mistral"]


@dataclass(frozen=True, slots=True)
class FamilyMarkup:
    # The family's think block around one reasoning segment, with its canonical whitespace
    # (`"<think>\n"`, `"\n</think>\n\n"`); None for families without an inline block (gpt-oss, Llama).
    think_open: str | None = None
    think_close: str | None = None
    tool_call_ids: ToolCallIds = "keep"  # the native id form the family's templates expect
    system_anywhere: bool = False  # system messages may appear after the first message

    @property
    def can_inject(self) -> bool:
        return self.think_open is not None and self.think_close is not None

    def think_block(self, text: str) -> str:
        if self.think_open is None or self.think_close is None:
            raise ValueError("this family has no inline think block")
        return self.think_open + text + self.think_close

    def ends_in_reasoning(self, prompt: str) -> bool:
        """The prompt leaves a think block open, so generation starts inside reasoning.

        Dynamo calls this `prompt_injected_reasoning`: Qwen3-Thinking-2507, DeepSeek-R1, MiniMax M2 and
        Nemotron 3 templates write the opening tag themselves and the model only writes the close.
        """
        if self.think_open is None or self.think_close is None:
            return False
        # Only the generation prompt's end counts: a `<think>` quoted anywhere earlier (a tool
        # description, a user message) must not make the parser read the whole answer as reasoning.
        return prompt.rstrip().endswith(self.think_open.strip())


def markup_from_template(template: ChatTemplate) -> FamilyMarkup:
    facts = template.constants()
    think_open, think_close = facts.get("think_open"), facts.get("think_close")
    ids = facts.get("tool_call_ids", "keep")
    if ids not in ("keep", "kimi", "mistral"):
        raise ValueError(f"unknown tool_call_ids {ids!r} in a fallback template")
    return FamilyMarkup(
        think_open if isinstance(think_open, str) else None,
        think_close if isinstance(think_close, str) else None,
        ids,
        bool(facts.get("system_anywhere", False)),
    )


def family_template(family: Family) -> ChatTemplate:
    """The family's fallback template, compiled once."""
    return _family_template(family.name, family.chat_template)


def family_markup(family: Family) -> FamilyMarkup:
    return _family_markup(family.name, family.chat_template)


@cache
def _family_template(name: str, source: str) -> ChatTemplate:
    return ChatTemplate(source, f"{name} (fallback)")


@cache
def _family_markup(name: str, source: str) -> FamilyMarkup:
    return markup_from_template(_family_template(name, source))
