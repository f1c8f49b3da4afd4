"""What the simulated engine says: output policies producing raw model text in a family's format.

A policy maps an `OutputContext` (which turn of the conversation this is, the last user message,
the last message of any role) to the raw text a model of the configured family would emit, markers
included; the frontend's family parser then sees exactly what it would see from a real model.

- `EchoPolicy` (default): a short reasoning segment, then an answer quoting the last user message.
- `ScriptPolicy`: a scenario file of raw outputs chosen by turn number and/or a regex on the last
  message, emitted byte for byte (tests and demos use it to make a harness call tools).

The context comes from request hints when the frontend sends them, else from the decoded prompt
(`context_from_prompt`, which reads ChatML-style prompts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from agentserve.worker.engine import Hints

if TYPE_CHECKING:
    from agentserve.families import Family


@dataclass(frozen=True, slots=True)
class OutputContext:
    turn: int = 1  # 1-based index of the model response being generated
    last_user_message: str = ""
    last_message: str = ""


class OutputPolicy(Protocol):
    def respond(self, ctx: OutputContext) -> str:
        """The raw output text (reasoning and tool markers in the family's syntax)."""
        ...


# --------------------------------------------------------------------------------------------------
# Raw formats


@dataclass(frozen=True, slots=True)
class RawFormat:
    """How a family writes one reasoning segment followed by an answer."""

    reasoning_open: str
    reasoning_close: str
    answer_open: str = ""
    answer_close: str = ""

    def render(self, reasoning: str, answer: str) -> str:
        return "".join(
            (
                self.reasoning_open,
                reasoning,
                self.reasoning_close,
                self.answer_open,
                answer,
                self.answer_close,
            )
        )


THINK_TAGS = RawFormat("<think>\n", "\n</think>\n\n")
# The chat template already opened `<think>` (DeepSeek-R1 style): the output starts inside it.
THINK_TAGS_OPENED = RawFormat("", "\n</think>\n\n")
HARMONY = RawFormat(
    "<|channel|>analysis<|message|>", "<|end|>", "<|start|>assistant<|channel|>final<|message|>", "<|return|>"
)


def raw_format_for(family: Family | None) -> RawFormat:
    """The output shape of a family (`Family.output_style`); `<think>` tags without one."""
    if family is not None and family.output_style == "harmony":
        return HARMONY
    return THINK_TAGS_OPENED if family is not None and family.starts_in_reasoning else THINK_TAGS


# --------------------------------------------------------------------------------------------------
# Policies


def _snippet(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class EchoPolicy:
    def __init__(self, fmt: RawFormat = THINK_TAGS, limit: int = 400) -> None:
        self.fmt = fmt
        self.limit = limit

    def respond(self, ctx: OutputContext) -> str:
        said = _snippet(ctx.last_user_message, self.limit)
        words = len(ctx.last_user_message.split())
        reasoning = f"The user wrote {words} word{'s' if words != 1 else ''}. I will repeat it back."
        answer = f'You said: "{said}"' if said else "Hello! How can I help?"
        return self.fmt.render(reasoning, answer)


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Rule:
    output: str
    turn: int | None = None
    match: re.Pattern[str] | None = None  # searched in the last message (any role)

    def applies(self, ctx: OutputContext) -> bool:
        if self.turn is not None and ctx.turn != self.turn:
            return False
        return self.match is None or self.match.search(ctx.last_message) is not None


class ScriptPolicy:
    """The first rule that applies wins; then `default`; then the fallback policy (echo).

    Scenario file (YAML or JSON)::

        rules:
          - turn: 1                      # the first model response of the conversation
            output: "<think>\\nLook first.\\n</think>\\n\\n<tool_call>\\n{...}\\n</tool_call>"
          - match: "(?i)no such file"    # regex searched in the last message
            output: "The file does not exist."
        default: "Done."                 # optional
    """

    def __init__(self, rules: Sequence[Rule], default: str | None, fallback: OutputPolicy) -> None:
        self.rules = tuple(rules)
        self.default = default
        self.fallback = fallback

    @classmethod
    def from_mapping(cls, data: Any, fallback: OutputPolicy) -> ScriptPolicy:
        if not isinstance(data, Mapping):
            raise ScenarioError("a scenario is a mapping with `rules` (and optionally `default`)")
        unknown = set(data) - {"rules", "default"}
        if unknown:
            raise ScenarioError(f"unknown scenario keys: {sorted(unknown)}")
        raw_rules = data.get("rules")
        raw_rules = [] if raw_rules is None else raw_rules
        if not isinstance(raw_rules, list):
            raise ScenarioError("`rules` must be a list")
        rules = [_rule(i, r) for i, r in enumerate(raw_rules)]
        default = data.get("default")
        if default is not None and not isinstance(default, str):
            raise ScenarioError("`default` must be a string")
        return cls(rules, default, fallback)

    @classmethod
    def from_file(cls, path: str | Path, fallback: OutputPolicy) -> ScriptPolicy:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
            data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ScenarioError(f"cannot read scenario {p}: {exc}") from exc
        return cls.from_mapping(data, fallback)

    def outputs(self) -> list[str]:
        """Every scripted text (to check they survive the tokenizer byte for byte)."""
        return [r.output for r in self.rules] + ([self.default] if self.default is not None else [])

    def respond(self, ctx: OutputContext) -> str:
        for rule in self.rules:
            if rule.applies(ctx):
                return rule.output
        return self.default if self.default is not None else self.fallback.respond(ctx)


def _rule(index: int, raw: Any) -> Rule:
    where = f"rule {index + 1}"
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: must be a mapping")
    unknown = set(raw) - {"turn", "match", "output"}
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}")
    output = raw.get("output")
    if not isinstance(output, str):
        raise ScenarioError(f"{where}: `output` (a string) is required")
    turn = raw.get("turn")
    if turn is not None and (not isinstance(turn, int) or isinstance(turn, bool) or turn < 1):
        raise ScenarioError(f"{where}: `turn` must be a positive integer")
    pattern = raw.get("match")
    compiled = None
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ScenarioError(f"{where}: `match` must be a regex string")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ScenarioError(f"{where}: bad regex {pattern!r}: {exc}") from exc
    return Rule(output, turn, compiled)


# --------------------------------------------------------------------------------------------------
# Context


_CHATML_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"^\s*<tool_response>")


def context_from_prompt(prompt: str) -> OutputContext:
    """Read turn and last messages from a ChatML prompt (`<|im_start|>role\\n…<|im_end|>`).

    Turn = assistant messages before the final generation prompt + 1. A user message that is only
    a `<tool_response>` is a tool result, not something the user said. Prompts in other formats
    give their last 2000 characters as both messages.
    """
    messages = [(m.group(1), m.group(2)) for m in _CHATML_MESSAGE.finditer(prompt)]
    if not messages:
        tail = prompt[-2000:]
        return OutputContext(1, tail, tail)
    if messages[-1][0] == "assistant":  # the generation prompt (possibly with an opened <think>)
        messages.pop()
    turn = sum(1 for role, _ in messages if role == "assistant") + 1
    last_message = messages[-1][1].strip() if messages else ""
    last_user = next(
        (
            text.strip()
            for role, text in reversed(messages)
            if role == "user" and not _TOOL_RESPONSE.match(text)
        ),
        "",
    )
    return OutputContext(turn, last_user, last_message)


def context_for(hints: Hints | None, prompt_text: str | None) -> OutputContext:
    """Hints win field by field; missing fields come from the prompt when it is given."""
    base = context_from_prompt(prompt_text) if prompt_text is not None else OutputContext()
    if hints is None:
        return base
    return OutputContext(
        hints.turn if hints.turn is not None else base.turn,
        hints.last_user_message if hints.last_user_message is not None else base.last_user_message,
        hints.last_message if hints.last_message is not None else base.last_message,
    )


def hints_complete(hints: Hints | None) -> bool:
    return hints is not None and None not in (hints.turn, hints.last_user_message, hints.last_message)
