"""What a family contributes to a constraint: its tool-call syntax as grammar source.

A constraint (`agentserve.constraints`) is llguidance Lark source built by the frontend from the
request (tools, tool_choice, parallel flag, strict, output format, thinking budget). Everything that
depends on how a model writes reasoning and calls comes from the family, as a `ToolGrammar`:

- `think`: the reasoning markers (None: the family does not reason in tags);
- `markers`: the strings free text must never contain (the parser would read them as a call);
- `calls(tools, count, m)`: a pure function returning Lark rules that define the nonterminal
  `calls` — the family's whole tool-call section holding `count.least..count.most` calls, each of
  one of `tools` with its arguments matching the tool's schema (`%json{…}`);
- `calls_first`: calls can only open the content (Llama 3 JSON, pythonic), never follow text.

`Markers` writes a marker as a special-token reference (`<tool_call>`) where the served tokenizer
has it as one special token, else as a string literal, so the same source fits any tokenizer.
Nothing here compiles or does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class GrammarTool:
    """One tool a call may name, and the schema its arguments must match (`{"type": "object"}` when
    the tool is neither strict nor forced: any object)."""

    name: str
    schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CallCount:
    least: int = 0  # 1: at least one call (required / any / named)
    most: int | None = None  # None: any number; 1: no parallel calls


@dataclass(frozen=True, slots=True)
class Markers:
    """Marker strings the served tokenizer holds as single special tokens, with their ids."""

    specials: Mapping[str, int] = field(default_factory=dict)

    def tok(self, text: str) -> str:
        """A marker as a Lark expression: a special-token reference (`<tool_call>` by name where the
        marker is shaped `<…>`, else `<[id]>`), or a string literal."""
        token = self.specials.get(text)
        if token is None:
            return lit(text)
        return text if text.startswith("<") and text.endswith(">") else f"<[{token}]>"


def lit(text: str) -> str:
    """A Lark string literal (JSON escaping is valid Lark escaping)."""
    return json.dumps(text, ensure_ascii=False)


def json_rule(schema: Mapping[str, Any]) -> str:
    """An inline JSON-schema nonterminal, keys in the schema's own order."""
    return "%json" + json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def repeat(item: str, sep: str, count: CallCount) -> str:
    """`item` (sep item)* with the call count's bounds, as a Lark expression (never empty: an
    absent section is the caller's `calls?`)."""
    if count.most == 1:
        return item
    return f"{item} ({sep} {item})*" if sep else f"{item}+"


def text_without(markers: Sequence[str], *, nonempty: bool = True) -> str:
    """A terminal body: any text that contains none of `markers`."""
    body = "/(.|\\n)+/" if nonempty else "/(.|\\n)*/"
    if not markers:
        return body
    alternatives = "|".join(_regex_escape(m) for m in markers)
    return f"{body} & ~/(.|\\n)*({alternatives})(.|\\n)*/"


def _regex_escape(text: str) -> str:
    out = []
    for ch in text:
        if ch in "\\.+*?()|[]{}^$/":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        else:
            out.append(ch)
    return "".join(out)


def name_arguments_schema(tool: GrammarTool, arguments_key: str = "arguments") -> dict[str, Any]:
    """`{"name": <tool>, "<arguments_key>": <schema>}`, name first (Hermes, Mistral, Nemotron)."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: dict(tool.schema)},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def alternatives(rules: Sequence[str]) -> str:
    return " | ".join(rules) if len(rules) > 1 else rules[0]


CallsBuilder = Callable[[Sequence[GrammarTool], CallCount, Markers], str]


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    calls: CallsBuilder
    think: tuple[str, str] | None = None
    markers: tuple[str, ...] = ()
    calls_first: bool = False
    # What the family's template renders for `tools: []`: "nothing" (no tool preamble at all), so
    # tool_choice none may leave the tools out of the prompt.
    renders_nothing_without_tools: bool = True

    @property
    def marker_strings(self) -> tuple[str, ...]:
        """Every marker the grammar may reference, to resolve against the tokenizer once."""
        think = self.think or ()
        return tuple(dict.fromkeys((*think, *self.markers)))
