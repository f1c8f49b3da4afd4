"""Hugging Face-compatible chat templates, rendered in a Jinja2 sandbox.

A model ships its chat template in `tokenizer_config.json` (`chat_template`: one string, or a list of
named templates such as `default` and `tool_use`) or in a `chat_template.jinja` file. We render them
the way `transformers` does, so a model's own template means the same thing here as in training and
in other servers:

- `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, loop controls, and the
  `{% generation %}` tag accepted (it only marks assistant spans for training masks);
- `tojson` that does not HTML-escape, keeps non-ASCII, and takes `indent`/`separators`/`sort_keys`;
- the globals `raise_exception(message)` and `strftime_now(format)`;
- variables `messages`, `tools` (None when there are none), `add_generation_prompt`, the special
  tokens of `tokenizer_config.json` (`bos_token`, `eos_token`, …) and any extra keyword arguments
  (`enable_thinking`, `truncate_history_thinking`, …).

One deliberate extension: tool-call arguments arrive as `ToolArguments`, a dict (so templates that
iterate `.items()` work) that remembers the JSON text the model produced; `tojson` of it with default
options writes that text back byte for byte, so re-rendered history matches the model's own output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class PromptError(ValueError):
    """A request cannot be turned into a prompt; the frontend answers it with a 400."""


class TemplateRenderError(PromptError):
    """The chat template refused the conversation (`raise_exception`) or failed while rendering."""


class TemplateLoadError(PromptError):
    """A model directory or template file has no usable chat template."""


class ToolArguments(dict[str, Any]):
    """Tool-call arguments as a dict that remembers the model's JSON text (see module docstring)."""

    __slots__ = ("raw",)

    def __init__(self, value: Mapping[str, Any], raw: str) -> None:
        super().__init__(value)
        self.raw = raw


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    default_format = not ensure_ascii and indent is None and separators is None and not sort_keys
    if default_format and type(value) is ToolArguments:
        return value.raw
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


class _GenerationTag(Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant tokens for training masks: a no-op here."""

    tags = {"generation"}  # noqa: RUF012 - the Extension API declares tags as a class attribute

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return list(parser.parse_statements(("name:endgeneration",), drop_needle=True))


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        extensions=["jinja2.ext.loopcontrols", _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


_ENV = _environment()

# How templates read reasoning: Qwen, GLM, Kimi, MiniMax and Nemotron templates use
# `reasoning_content`; gpt-oss templates use `message.thinking`; templates written after vLLM renamed
# the field read `message.reasoning`.
_REASONING_KEYS = {
    "reasoning_content": re.compile(r"\breasoning_content\b"),
    "reasoning": re.compile(r"\.reasoning\b|\[\s*['\"]reasoning['\"]\s*\]"),
    "thinking": re.compile(r"\.thinking\b|\[\s*['\"]thinking['\"]\s*\]"),
}


@dataclass(frozen=True)
class ChatTemplate:
    """One compiled chat template and what it reads."""

    source: str
    name: str = "default"
    # The message keys this template reads reasoning from (empty: it never sees reasoning natively).
    reasoning_keys: tuple[str, ...] = field(init=False)
    _template: jinja2.Template = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            template = _compile(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateLoadError(f"chat template {self.name!r}: {exc}") from exc
        object.__setattr__(self, "_template", template)
        keys = tuple(k for k, pattern in _REASONING_KEYS.items() if pattern.search(self.source))
        object.__setattr__(self, "reasoning_keys", keys)

    @property
    def reads_reasoning(self) -> bool:
        """True when the template reads past reasoning itself (the `auto` replay policy goes native)."""
        return bool(self.reasoning_keys)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        now: datetime | None = None,
        special_tokens: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render like `transformers`' `apply_chat_template(..., tokenize=False)`.

        `now` fixes what `strftime_now` sees (default: the current local time).
        """
        moment = now
        variables: dict[str, Any] = dict(special_tokens or {})
        variables.update(kwargs)

        def strftime_now(fmt: str) -> str:
            return (moment or datetime.now()).strftime(fmt)

        variables.update(
            messages=messages,
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            strftime_now=strftime_now,
        )
        try:
            return self._template.render(variables)
        except jinja2.TemplateError as exc:
            raise TemplateRenderError(f"chat template {self.name!r}: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateRenderError(f"chat template {self.name!r} failed: {exc!r}") from exc

    def constants(self) -> dict[str, Any]:
        """Top-level `{% set name = <constant> %}` values of the template, read without rendering."""
        return _constants(self.source)


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


@lru_cache(maxsize=64)
def _constants(source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in _ENV.parse(source).body:
        if isinstance(node, nodes.Assign) and isinstance(node.target, nodes.Name):
            value = node.node
            if not isinstance(value, nodes.Expr):
                continue
            try:
                out[node.target.name] = value.as_const()
            except nodes.Impossible:
                continue
    return out


@dataclass(frozen=True)
class ModelTemplates:
    """A model's chat templates by name, plus the special tokens its templates may reference."""

    templates: Mapping[str, ChatTemplate]
    special_tokens: Mapping[str, str] = field(default_factory=dict)

    def select(self, has_tools: bool) -> ChatTemplate:
        """The `tool_use` template when tools are given and one exists, else `default` (as transformers)."""
        if has_tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        return next(iter(self.templates.values()))

    @classmethod
    def single(cls, source: str, special_tokens: Mapping[str, str] | None = None) -> ModelTemplates:
        return cls({"default": ChatTemplate(source)}, dict(special_tokens or {}))


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    tokens: dict[str, str] = {}
    for key, value in config.items():
        if not key.endswith("_token"):
            continue
        if isinstance(value, str):
            tokens[key] = value
        elif isinstance(value, Mapping) and isinstance(value.get("content"), str):
            tokens[key] = value["content"]
    return tokens


def parse_template_field(value: Any) -> dict[str, ChatTemplate]:
    """The `chat_template` value of a tokenizer config: a string or a list of `{name, template}`."""
    if isinstance(value, str):
        return {"default": ChatTemplate(value)}
    if isinstance(value, list):
        named: dict[str, ChatTemplate] = {}
        for item in value:
            if not (isinstance(item, Mapping) and isinstance(item.get("template"), str)):
                raise TemplateLoadError("chat_template list entries need a 'name' and a 'template'")
            name = str(item.get("name", "default"))
            named[name] = ChatTemplate(item["template"], name)
        if named:
            return named
    raise TemplateLoadError("chat_template must be a string or a list of named templates")


def load_model_templates(model_dir: str | Path, override: str | Path | None = None) -> ModelTemplates | None:
    """A model directory's chat templates (None when it has none); `override` is a template file.

    Precedence as in transformers: `chat_template.jinja`, then `chat_template` in
    `tokenizer_config.json`, then `chat_template.json` (processor configs).
    """
    root = Path(model_dir)
    config: dict[str, Any] = {}
    config_path = root / "tokenizer_config.json"
    if config_path.is_file():
        config = _read_json(config_path)
    special = _special_tokens(config)
    if override is not None:
        return ModelTemplates({"default": ChatTemplate(read_template_file(Path(override)))}, special)
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return ModelTemplates({"default": ChatTemplate(read_template_file(jinja_file))}, special)
    if config.get("chat_template") is not None:
        return ModelTemplates(parse_template_field(config["chat_template"]), special)
    processor = root / "chat_template.json"
    if processor.is_file():
        value = _read_json(processor).get("chat_template")
        if value is not None:
            return ModelTemplates(parse_template_field(value), special)
    return None


def read_template_file(path: Path) -> str:
    """A chat template file's text (errors become TemplateLoadError)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TemplateLoadError(f"cannot read chat template {path}: {exc}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(read_template_file(path))
    except json.JSONDecodeError as exc:
        raise TemplateLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise TemplateLoadError(f"{path} must hold a JSON object")
    return value
