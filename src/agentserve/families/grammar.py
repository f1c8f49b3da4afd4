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


def text_without(markers: Sequence[str], *, nonempty: bool = True, not_first: str = "") -> str:
    """A terminal body: any text that contains none of `markers` (nor starts with a character of
    `not_first`)."""
    if not_first:
        body = "/[^" + _regex_escape(not_first) + "](.|\\n)*/"
    else:
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


def name_arguments_calls(tools: Sequence[GrammarTool], arguments_key: str = "arguments") -> str:
    """One alternative per tool: its `{"name": …, "<arguments_key>": …}` JSON object (Hermes,
    Llama 3 JSON, Nemotron)."""
    return alternatives([json_rule(name_arguments_schema(t, arguments_key)) for t in tools])


def name_then_arguments(tools: Sequence[GrammarTool], between: str) -> str:
    """One alternative per tool: its name, `between` (a marker expression), then its JSON arguments
    (Mistral, DeepSeek V3.1)."""
    return alternatives([f"{lit(t.name)} {between} {json_rule(t.schema)}" for t in tools])


def per_tool_rules(rule: str, tools: Sequence[GrammarTool], body: Callable[[GrammarTool], str]) -> list[str]:
    """`rule` as one alternative per tool (`rule_0 | rule_1 …`), then each tool's own rule
    `rule_i: body(tool)` (the XML families, whose parameters differ per tool)."""
    numbered = [f"{rule}_{i}" for i in range(len(tools))]
    return [
        f"{rule}: {alternatives(numbered)}",
        *(f"{n}: {body(t)}" for n, t in zip(numbered, tools, strict=True)),
    ]


class GrammarUnsupported(ValueError):
    """A tool schema the family's syntax cannot enforce (a feature of a raw-text XML value)."""

    def __init__(self, message: str, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


def is_any_object(schema: Mapping[str, Any]) -> bool:
    """Any arguments object: nothing to enforce beyond an object."""
    return not schema.get("properties") and schema.get("additionalProperties") is not False


def _string_only(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "string" or (
        "type" not in schema and all(isinstance(v, str) for v in schema.get("enum", [None]))
    )


def _mentions_string(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    return any(
        isinstance(sub, Mapping) and _mentions_string(sub)
        for key in ("anyOf", "oneOf")
        for sub in schema.get(key, [])
    )


def raw_value(schema: Mapping[str, Any], raw: str, closer: str, tool: str, key: str, *, pad: str = "") -> str:
    """A parameter value as the XML families write it — raw text for strings, JSON text for every
    other type (what `parsing.xmlargs` reads back by the schema) — and its closing tag, as a Lark
    expression. `raw` is the family's free-text value including its closer (a rule with a
    `[lazy]` regex that ends with it, or a terminal and a special-token closer); `closer` the
    closer alone; `pad` the formatting the parser strips around a value (qwen3-coder's one
    newline each side)."""
    if "const" in schema and isinstance(schema["const"], str):
        return f"{pad} {lit(schema['const'])} {pad} {closer}"
    if _string_only(schema):
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return f"{pad} (" + " | ".join(lit(v) for v in enum) + f") {pad} {closer}"
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and "/" not in pattern:
            return f"{pad} /" + pattern.removeprefix("^").removesuffix("$") + f"/ {pad} {closer}"
        for unsupported in ("format", "minLength", "maxLength"):
            if unsupported in schema:
                raise GrammarUnsupported(
                    f"{unsupported!r} of parameter {key!r} cannot be enforced on a raw-text value", tool
                )
        return raw
    if _mentions_string(schema):
        raise GrammarUnsupported(
            f"parameter {key!r} mixes strings with other types, which a raw-text value cannot tell apart",
            tool,
        )
    return f"WS? {json_rule(schema)} WS? {closer}"


def xml_parameters(
    tool: GrammarTool, param: Callable[[str, str], str], raw: str, closer: str, key: str, *, pad: str = ""
) -> str:
    """The parameters of one call as a Lark expression: in schema order, required ones always,
    optional ones maybe; any keys and raw values when the schema names no properties.
    `param(key, value)` writes one parameter around a value that ends with its closer."""
    schema = tool.schema
    if is_any_object(schema):
        return f"({param(key, raw)})*"
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    parts: list[str] = []
    for name, sub in props.items():
        value = raw_value(sub if isinstance(sub, Mapping) else {}, raw, closer, tool.name, name, pad=pad)
        expr = param(lit(name), value)
        parts.append(expr if name in required else f"({expr})?")
    return " ".join(parts) if parts else "WS?"


CallsBuilder = Callable[[Sequence[GrammarTool], CallCount, Markers], str]


@dataclass(frozen=True, slots=True)
class Shape:
    """What the output may hold, for a family that lays out the whole grammar itself (harmony)."""

    tools: tuple[GrammarTool, ...]
    count: CallCount | None  # None: no calls
    text: bool  # free text may be the answer
    json_schema: Mapping[str, Any] | None  # the answer must be this JSON value
    budget: int | None  # reasoning tokens at most
    starts_in_reasoning: bool


Layout = Callable[[Shape, Markers], str]


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    calls: CallsBuilder | None = None  # None: `layout` writes the whole grammar
    think: tuple[str, str] | None = None
    markers: tuple[str, ...] = ()
    calls_first: bool = False
    text_not_first: str = ""  # characters text cannot start with (calls_first: what opens a call)
    # What the family's template renders for `tools: []`: "nothing" (no tool preamble at all), so
    # tool_choice none may leave the tools out of the prompt.
    renders_nothing_without_tools: bool = True
    # The whole grammar for families whose reasoning is not a tagged block before the answer
    # (harmony's channels); None: the generic `reasoning? body` layout of `constraints.build`.
    layout: Layout | None = None
    extra_markers: tuple[str, ...] = ()  # special tokens a layout references besides `markers`

    @property
    def marker_strings(self) -> tuple[str, ...]:
        """Every marker the grammar may reference, to resolve against the tokenizer once."""
        think = self.think or ()
        return tuple(dict.fromkeys((*think, *self.markers, *self.extra_markers)))
