"""What a request asks for besides the conversation, in one API-neutral vocabulary.

Each codec maps its own knobs here (Anthropic `thinking`/`output_config`, Chat `reasoning_effort`,
Responses `reasoning`/`text`), so the prompt pipeline and the engine see one shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

ToolChoiceMode: TypeAlias = Literal["auto", "none", "required", "named"]
ThinkingMode: TypeAlias = Literal["default", "enabled", "adaptive", "disabled"]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # the forced tool when mode == "named"


@dataclass(frozen=True, slots=True)
class ReasoningOptions:
    """Whether and how much the model should think.

    `mode` "default" leaves it to the model's template; `effort` is the API's word as sent (Anthropic
    low/medium/high/max, OpenAI none/minimal/low/medium/high/xhigh); `summary` is the Responses
    `reasoning.summary` (whether the encoder mirrors reasoning into summary parts).
    """

    mode: ThinkingMode = "default"
    budget_tokens: int | None = None
    effort: str | None = None
    summary: str | None = None
    display: str | None = None  # Anthropic adaptive thinking: "summarized", "omitted", "updates"…

    @property
    def enabled(self) -> bool | None:
        """True/False when the client decided, None to keep the model's default."""
        if self.mode == "disabled" or self.effort == "none":
            return False
        if self.mode in ("enabled", "adaptive"):
            return True
        return None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    model: str
    max_tokens: int | None = None  # None: up to the context window
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    reasoning: ReasoningOptions = ReasoningOptions()
    response_format: ResponseFormat | None = None
    include_usage: bool = False  # Chat stream_options.include_usage: a final usage chunk
    verbosity: str | None = None  # Responses text.verbosity
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # Chat chat_template_kwargs
