"""Volatile-span stripping: remove per-request noise before rendering, hashing and routing.

Claude Code starts `system` with a billing line that differs per conversation (`cc_version` carries a
hash of the first prompt) and, against first-party hosts, per request (`cch`):

    x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;[ cch=7be21;]
                                [ cc_workload=cron;][ cc_is_subagent=true;]   (one line)

It sits at token zero, so left in place it makes every conversation's prompt unique and no prefix is
ever shared. Two shapes reach us: the whole first system block (Claude Code's `system[0]`, dropped
entirely), or the first line of a system text followed by a newline (proxies that join the blocks,
a single-string `system`; the line is removed). Fields are `key=value;` pairs, so new fields and
orders match too.

Operators add their own volatile spans (dates, session ids in a harness's prompt) as named regexes,
`NAME=REGEX`; every match in system, user and tool-result text is removed. Assistant text is never
touched: it is the model's own output and must re-render exactly. Counts per rule are reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from agentserve.conversation import Conversation, Image, Message, Part, Text, ToolResult
from agentserve.prompt.template import PromptError

BILLING_RULE = "anthropic_billing"

# The header, then its `key=value;` fields; what follows on the same line is not part of it.
_BILLING = re.compile(r"\s*x-anthropic-billing-header:(?:[ \t]*[A-Za-z0-9_.-]+=[^;\n]*;)*[ \t]*")


class StripPatternError(PromptError):
    pass


@dataclass(frozen=True, slots=True)
class StripRule:
    name: str
    pattern: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class StripRules:
    billing: bool = True
    patterns: tuple[StripRule, ...] = ()

    @classmethod
    def parse(cls, billing: bool, patterns: Iterable[str]) -> StripRules:
        """Rules from configuration: `strip_anthropic_preamble` and `strip_pattern` (`NAME=REGEX`)."""
        rules = []
        for spec in patterns:
            name, sep, regex = spec.partition("=")
            name = name.strip()
            if not sep or not name or not regex:
                raise StripPatternError(f"strip pattern {spec!r} must be NAME=REGEX")
            if name == BILLING_RULE:
                raise StripPatternError(f"strip pattern name {BILLING_RULE!r} is reserved")
            try:
                rules.append(StripRule(name, re.compile(regex)))
            except re.error as exc:
                raise StripPatternError(f"strip pattern {name!r}: {exc}") from exc
        return cls(billing, tuple(rules))

    @property
    def active(self) -> bool:
        return self.billing or bool(self.patterns)


NO_STRIPPING = StripRules(billing=False)


def strip_billing_line(system: tuple[Text, ...]) -> tuple[tuple[Text, ...], bool]:
    """Remove Claude Code's billing line from the start of `system` (either shape)."""
    if not system:
        return system, False
    first = system[0].text
    m = _BILLING.match(first)
    if m is None:
        return system, False
    rest = first[m.end() :]
    if rest.startswith("\n"):
        rest = rest[1:]
    elif rest.startswith("\r\n"):
        rest = rest[2:]
    if not rest.strip():
        return system[1:], True  # the whole block was the billing line
    return (Text(rest), *system[1:]), True


def strip_conversation(conversation: Conversation, rules: StripRules) -> tuple[Conversation, dict[str, int]]:
    """The conversation without its volatile spans, and how many spans each rule removed."""
    counts: dict[str, int] = {}
    if not rules.active:
        return conversation, counts
    system = conversation.system
    if rules.billing:
        system, removed = strip_billing_line(system)
        if removed:
            counts[BILLING_RULE] = 1
    messages = conversation.messages
    if rules.patterns:
        system = tuple(Text(_sub(p.text, rules.patterns, counts)) for p in system)
        messages = tuple(_strip_message(m, rules.patterns, counts) for m in messages)
    if system is conversation.system and messages is conversation.messages:
        return conversation, counts
    return Conversation(system, messages, conversation.tools), counts


def _sub(text: str, patterns: tuple[StripRule, ...], counts: dict[str, int]) -> str:
    for rule in patterns:
        text, n = rule.pattern.subn("", text)
        if n:
            counts[rule.name] = counts.get(rule.name, 0) + n
    return text


def _strip_message(message: Message, patterns: tuple[StripRule, ...], counts: dict[str, int]) -> Message:
    if message.role == "assistant":
        return message
    parts: list[Part] = []
    for part in message.parts:
        if isinstance(part, Text):
            parts.append(Text(_sub(part.text, patterns, counts)))
        elif isinstance(part, ToolResult):
            content: list[Text | Image] = [
                Text(_sub(c.text, patterns, counts)) if isinstance(c, Text) else c for c in part.content
            ]
            parts.append(ToolResult(part.call_id, tuple(content), part.is_error, part.name))
        else:
            parts.append(part)
    return Message(message.role, tuple(parts))
