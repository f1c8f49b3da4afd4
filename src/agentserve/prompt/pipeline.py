"""The prompt pipeline's one entry point: `render_prompt(conversation, pipeline, …) -> RenderedPrompt`.

    strip volatile spans → template messages (replay policy) → chat template → token ids → block hashes

`PromptPipeline` holds what is loaded once per deployment (family, templates, tokenizer, settings);
`PromptPipeline.from_config` is the I/O edge that reads a model directory. `render_prompt` is pure:
the same conversation and options give the same prompt (pass `now` if a template reads the clock).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agentserve.config import PromptConfig, ReplayPolicy
from agentserve.conversation import Conversation
from agentserve.families import FAMILIES, Family, UnknownFamilyError, family_for_model, get_family
from agentserve.families.compose import ParserChoiceError, with_parsers
from agentserve.prompt.hashing import block_hashes
from agentserve.prompt.markup import FamilyMarkup, family_markup, family_template
from agentserve.prompt.messages import TemplateMessage, template_messages, template_tools
from agentserve.prompt.replay import ReplayMode, resolve_mode
from agentserve.prompt.strip import StripRules, strip_conversation
from agentserve.prompt.template import (
    ChatTemplate,
    ModelTemplates,
    PromptError,
    TemplateLoadError,
    load_model_templates,
    read_template_file,
)
from agentserve.prompt.tokenizer import Tokenizer, embedded_tokenizer


@dataclass(frozen=True)
class PromptPipeline:
    family: Family
    templates: ModelTemplates  # the model's own, or the family's fallback
    tokenizer: Tokenizer
    replay: ReplayPolicy = ReplayPolicy.AUTO
    strip: StripRules = field(default_factory=StripRules)
    block_size: int = 32
    hash_seed: int = 0
    truncate_history_thinking: bool = False
    reasoning_default: bool | None = None  # thinking when a request does not say (None: the template's)
    markup: FamilyMarkup = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "markup", family_markup(self.family))

    @classmethod
    def for_family(cls, family: Family | str, **settings: Any) -> PromptPipeline:
        """The family's fallback template and the embedded tokenizer (tests, the sim engine)."""
        fam = get_family(family) if isinstance(family, str) else family
        templates = ModelTemplates({"default": family_template(fam)})
        return cls(fam, templates, settings.pop("tokenizer", None) or embedded_tokenizer(), **settings)

    @classmethod
    def from_config(cls, config: PromptConfig) -> PromptPipeline:
        """Load what `config` names: family, model directory (template, tokenizer), template override."""
        family = resolve_family(config)
        templates: ModelTemplates | None = None
        if config.model_path is not None:
            templates = load_model_templates(config.model_path, config.chat_template)
            tokenizer = Tokenizer.from_model_dir(config.model_path)
        else:
            tokenizer = embedded_tokenizer()
            if config.chat_template is not None:
                templates = ModelTemplates.single(read_template_file(Path(config.chat_template)))
        return cls(
            family,
            templates or ModelTemplates({"default": family_template(family)}),
            tokenizer,
            replay=config.replay_policy,
            strip=StripRules.parse(config.strip_anthropic_preamble, config.strip_pattern),
            block_size=config.block_size,
            hash_seed=config.hash_seed,
            truncate_history_thinking=config.truncate_history_thinking,
            reasoning_default=_REASONING_DEFAULTS[config.reasoning_default],
        )


_REASONING_DEFAULTS: dict[str, bool | None] = {"template": None, "on": True, "off": False}


def resolve_family(config: PromptConfig) -> Family:
    """The served family, with the output parser `reasoning_parser` / `tool_call_parser` select."""
    if config.family:
        try:
            family = get_family(config.family)
        except UnknownFamilyError as exc:
            raise TemplateLoadError(f"--family: {exc}") from exc
    else:
        inferred = family_for_model(config.model)
        if inferred is None:
            known = ", ".join(sorted(f.name for f in FAMILIES))
            raise TemplateLoadError(
                f"cannot infer the model family from --model {config.model!r}: set --family (one of {known})"
            )
        family = inferred
    try:
        return with_parsers(family, config.reasoning_parser, config.tool_call_parser)
    except ParserChoiceError as exc:
        raise TemplateLoadError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    token_ids: tuple[int, ...]
    block_hashes: tuple[int, ...]
    stripped: Mapping[str, int]  # spans removed per strip rule
    starts_in_reasoning: bool  # the prompt leaves a think block open: parse output as reasoning first
    replay: ReplayMode  # how past reasoning was rendered


@dataclass(frozen=True, slots=True)
class TemplateInput:
    """What goes into the chat template, before it is rendered (exposed for the benchmark and CLIs)."""

    template: ChatTemplate
    messages: list[TemplateMessage]
    tools: list[dict[str, Any]]
    kwargs: dict[str, Any]
    replay: ReplayMode


def is_agent_traffic(conversation: Conversation) -> bool:
    """Tools declared or tool calls in history: the conversation is an agent loop."""
    return bool(conversation.tools) or any(m.tool_calls for m in conversation.messages)


def template_input(
    conversation: Conversation,
    pipeline: PromptPipeline,
    *,
    enable_thinking: bool | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
) -> TemplateInput:
    template = pipeline.templates.select(bool(conversation.tools))
    mode = resolve_mode(pipeline.replay, template, pipeline.markup)
    keys = template.reasoning_keys or ("reasoning_content",)
    messages = template_messages(conversation, pipeline.markup, mode, keys)
    kwargs: dict[str, Any] = dict(pipeline.templates.special_tokens)
    # Agent turns need their reasoning: never let a template truncate it for agent traffic.
    kwargs["truncate_history_thinking"] = pipeline.truncate_history_thinking and not is_agent_traffic(
        conversation
    )
    if reasoning_effort is not None:
        kwargs["reasoning_effort"] = reasoning_effort  # gpt-oss's `Reasoning:` line; the client's kwargs win
    kwargs.update(template_kwargs or {})
    if enable_thinking is None:
        enable_thinking = pipeline.reasoning_default
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
        kwargs.setdefault("thinking", enable_thinking)  # DeepSeek V3.1 templates read `thinking`
    return TemplateInput(template, messages, template_tools(conversation.tools), kwargs, mode)


def render_text(
    inputs: TemplateInput, *, add_generation_prompt: bool = True, now: datetime | None = None
) -> str:
    return inputs.template.render(
        inputs.messages, inputs.tools, add_generation_prompt=add_generation_prompt, now=now, **inputs.kwargs
    )


def render_prompt(
    conversation: Conversation,
    pipeline: PromptPipeline,
    *,
    enable_thinking: bool | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
    add_generation_prompt: bool = True,
    now: datetime | None = None,
) -> RenderedPrompt:
    """Strip, render, tokenize and hash one request's prompt.

    `enable_thinking` None leaves thinking to the deployment (`pipeline.reasoning_default`, else the
    template's own default); `reasoning_effort` (`low|medium|high`) reaches templates with an effort knob.

    Raises `PromptError` (a 400 for the client) when the request cannot become a prompt: images for a
    text-only model, or a template that refuses the conversation.
    """
    stripped, counts = strip_conversation(conversation, pipeline.strip)
    inputs = template_input(
        stripped,
        pipeline,
        enable_thinking=enable_thinking,
        template_kwargs=template_kwargs,
        reasoning_effort=reasoning_effort,
    )
    text = render_text(inputs, add_generation_prompt=add_generation_prompt, now=now)
    ids = pipeline.tokenizer.encode(text)
    return RenderedPrompt(
        text=text,
        token_ids=tuple(ids),
        block_hashes=tuple(block_hashes(ids, pipeline.block_size, pipeline.hash_seed)),
        stripped=counts,
        starts_in_reasoning=add_generation_prompt and pipeline.markup.ends_in_reasoning(text),
        replay=inputs.replay,
    )


__all__ = [
    "PromptError",
    "PromptPipeline",
    "RenderedPrompt",
    "TemplateInput",
    "render_prompt",
    "render_text",
    "template_input",
]
