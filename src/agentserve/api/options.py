"""What a request asks for besides the conversation, in one API-neutral vocabulary.

Each codec maps its own knobs here (Anthropic `thinking`/`output_config`, Chat `reasoning_effort`,
Responses `reasoning`/`text`), so the prompt pipeline and the engine see one shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from agentserve.sampling import Samplers

ToolChoiceMode: TypeAlias = Literal["auto", "none", "required", "named"]
ThinkingMode: TypeAlias = Literal["default", "enabled", "adaptive", "disabled"]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # the forced tool when mode == "named"
    # Chat / Responses `allowed_tools`: the only tools a call may name (None: every tool offered).
    allowed: tuple[str, ...] | None = None


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
        """True/False when the client decided, None to keep the deployment's default.

        An explicit mode wins (Anthropic `thinking`, Chat `chat_template_kwargs.enable_thinking`);
        otherwise an effort decides: asking for any level of reasoning turns a hybrid template's
        thinking on (Codex sends `reasoning.effort`, pi `reasoning_effort`, without a mode), and
        `none`/`minimal` turn it off.
        """
        if self.mode == "disabled":
            return False
        if self.mode in ("enabled", "adaptive"):
            return True
        if self.effort in _OFF_EFFORTS:
            return False
        if self.effort is not None:
            return True
        return None

    @property
    def level(self) -> str | None:
        """The effort on a three-step scale (`low|medium|high`) for templates with a real knob
        (gpt-oss's `Reasoning:` system line); None when the client named no effort."""
        if self.effort is None:
            return None
        return _LEVELS.get(self.effort, "high")


_OFF_EFFORTS = frozenset({"none", "minimal"})
# gpt-oss cannot stop reasoning: "none"/"minimal" are its lowest level; "xhigh"/"max" its highest.
_LEVELS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium"}


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class GenerationOptions(Samplers):
    """What the request asks for besides the conversation; its samplers (`agentserve.sampling`) are
    the engines' own, copied to the engine request as they are."""

    model: str
    max_tokens: int | None = None  # None: up to the context window
    stop: tuple[str, ...] = ()
    stream: bool = False
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    reasoning: ReasoningOptions = ReasoningOptions()
    response_format: ResponseFormat | None = None
    include_usage: bool = False  # Chat stream_options.include_usage: a final usage chunk
    verbosity: str | None = None  # Responses text.verbosity
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # Chat chat_template_kwargs
    # Log-probabilities of the answer's tokens: None asks for none, k for each token's own and the k
    # most likely alternatives (Chat `logprobs`/`top_logprobs`, Responses `top_logprobs` / include).
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # Chat `logit_bias`: (token id, -100..100)
