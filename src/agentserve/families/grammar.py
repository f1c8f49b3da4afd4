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
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentserve.parsing.xmlargs import STRING, read_value, value_types
from agentserve.schema_refs import deref, escape_token, inlined, nested, standalone

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
        "properties": {
            "name": {"const": tool.name},
            arguments_key: dict(nested(tool.schema, f"#/properties/{escape_token(arguments_key)}")),
        },
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


# Keywords that say nothing about which values are valid.
ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
# What a root `arguments` object may say where each parameter is written apart (the XML families,
# pythonic calls): its named parameters, which are required, whether others may appear.
OBJECT_KEYWORDS = ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "$defs", "definitions", "$schema", "$id",
}  # fmt: skip


def is_any_object(schema: Mapping[str, Any]) -> bool:
    """Any arguments object: nothing to enforce beyond an object."""
    return (
        schema.get("type", "object") == "object"
        and schema.get("additionalProperties", True) in (True, {})
        and not (set(schema) - ANNOTATIONS - {"type", "additionalProperties", "properties", "$schema", "$id"})
        and not schema.get("properties")
    )


def parameters(tool: GrammarTool) -> tuple[list[tuple[str, Mapping[str, Any]]], set[str]]:
    """A call's parameters in schema order as (name, schema), and the required ones, where each
    parameter is written apart (the XML families, pythonic calls). A required name without a
    schema of its own is any value. Raises GrammarUnsupported for a root such a syntax cannot
    enforce (`anyOf`, `minProperties`, a schema for additional properties …): a 400, never a call
    that skips it."""
    root = deref(tool.schema, tool.schema)
    extra = sorted(set(root) - OBJECT_KEYWORDS)
    if extra:
        raise GrammarUnsupported(f"{extra[0]!r} at the root of the parameters cannot be enforced", tool.name)
    if root.get("type", "object") != "object":
        raise GrammarUnsupported("the parameters must be an object", tool.name)
    closed = root.get("additionalProperties", True)
    if closed not in (True, False, {}):
        raise GrammarUnsupported("a schema for 'additionalProperties' cannot be enforced", tool.name)
    props = root.get("properties") or {}
    named = [(k, v if isinstance(v, Mapping) else {}) for k, v in props.items()]
    required = {r for r in root.get("required") or () if isinstance(r, str)}
    for name in sorted(required - set(props)):
        if closed is False:
            raise GrammarUnsupported(f"required parameter {name!r} is not among the properties", tool.name)
        named.append((name, {}))
    return named, required


def _literal_texts(
    members: Sequence[object], types: tuple[str, ...], refused: Sequence[str], tool: str, key: str
) -> list[str]:
    """The raw texts of `enum`/`const` members that the parser reads back as those members
    (`parsing.xmlargs.read_value`), none holding a text that ends a value (`refused`)."""
    texts = []
    for member in members:
        text = member if isinstance(member, str) else json.dumps(member, ensure_ascii=False)
        if any(stop and stop in text for stop in refused):
            continue
        back = json.loads(read_value(text, types))
        if back == member and type(back) is type(member):
            texts.append(text)
    if not texts:
        raise GrammarUnsupported(f"no value of parameter {key!r} can be written as a raw-text value", tool)
    return texts


def _members(schema: Mapping[str, Any], root: Mapping[str, Any]) -> list[object] | None:
    """The values a schema lists (`enum`, `const`, or a union of those and `null`: pydantic's
    `Optional[Literal[…]]`); None where it does not list them all."""
    if "enum" in schema or "const" in schema:
        listed = schema.get("enum", [schema.get("const")])
        return list(listed) if isinstance(listed, list) else None
    branches = [b for key in ("anyOf", "oneOf") for b in schema.get(key, [])]
    if not branches or set(schema) - ANNOTATIONS - {"anyOf", "oneOf"}:
        return None
    members: list[object] = []
    for branch in branches:
        resolved = deref(branch, root) if isinstance(branch, Mapping) else {}
        if set(resolved) - ANNOTATIONS == {"type"} and resolved["type"] == "null":
            members.append(None)
            continue
        listed = _members(resolved, root) if not ({"anyOf", "oneOf"} & set(resolved)) else None
        if listed is None:
            return None
        members += listed
    return members


def _bare_union(schema: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    """Types and nothing else (`["string", "null"]`, `anyOf` of bare types): every raw text is read
    back as one of them, so any text is a valid value."""
    if set(schema) - ANNOTATIONS - {"type", "anyOf", "oneOf", "nullable"}:
        return False
    return all(
        isinstance(b, Mapping) and _bare_union(deref(b, root), root)
        for key in ("anyOf", "oneOf")
        for b in schema.get(key, [])
    )


@dataclass(frozen=True, slots=True)
class ValueSyntax:
    """How an XML family writes a parameter's value (facts of its parser, as Lark pieces)."""

    raw: str  # the free-text value including its closer (a `[lazy]` rule that ends with it, or a
    # terminal and a special-token closer)
    closer: str  # the closer alone: a string literal, or a special token text never holds
    key: str  # the terminal of any parameter name (a tool whose schema names none)
    keys: str  # the regex of the parameter names the parser reads back whole (outside it: 400)
    pad: str = ""  # what the parser strips around a value (qwen3-coder: one newline each side)
    ends: tuple[str, ...] = ()  # texts besides the closer at which the parser ends a value

    @property
    def closer_text(self) -> str:
        """The closer as text ("" for a special token)."""
        return str(json.loads(self.closer)) if self.closer.startswith('"') else ""


def raw_value(
    schema: Mapping[str, Any],
    syntax: ValueSyntax,
    tool: str,
    key: str,
    *,
    root: Mapping[str, Any] | None = None,
    rules: list[str] | None = None,
) -> str:
    """A parameter value as the XML families write it — raw text for strings, JSON text for every
    other type (what `parsing.xmlargs` reads back by the schema) — and its closing tag, as a Lark
    expression, in the family's `syntax`. `root` is the tool's whole schema, which `schema`'s
    `$ref`s point into; `rules` where a value needing a rule of its own adds it (a patterned value
    before a text closer: `_lazy_value`)."""
    raw, closer, pad = syntax.raw, syntax.closer, syntax.pad
    root = root if root is not None else schema
    resolved = deref(schema, root)
    types = value_types(inlined(resolved, root))
    refused = syntax.closer_text
    members = _members(resolved, root)
    if members is not None:
        texts = _literal_texts(members, types, (refused, *syntax.ends), tool, key)
        return f"{pad} (" + " | ".join(lit(t) for t in texts) + f") {pad} {closer}"
    if STRING not in types:
        return f"WS? {json_rule(standalone(schema, root))} WS? {closer}"
    if types != (STRING,):
        if _bare_union(resolved, root) and not ("oneOf" in resolved and {"integer", "number"} <= set(types)):
            return raw
        raise GrammarUnsupported(
            f"parameter {key!r} mixes strings with other types, which a raw-text value cannot tell apart",
            tool,
        )
    for unsupported in ("format", "minLength", "maxLength", "anyOf", "oneOf", "allOf", "not"):
        if unsupported in resolved:
            raise GrammarUnsupported(
                f"{unsupported!r} of parameter {key!r} cannot be enforced on a raw-text value", tool
            )
    pattern = resolved.get("pattern")
    if isinstance(pattern, str):
        regex = "/" + _slashes_escaped(pattern.removeprefix("^").removesuffix("$")) + "/"
        stops = [t for t in dict.fromkeys((refused, *syntax.ends)) if t]
        if rules is None or not stops:
            return f"{pad} {regex} {pad} {closer}"
        if refused:
            return _lazy_value(regex, refused, pad, rules, syntax.ends)
        # a special-token closer ends the lexeme; the text must still hold no text the parser
        # ends a value at (GLM reads `</arg_value>` written as text as the closer too)
        n = len(rules)
        rules.append(
            f"XVALUE_{n}: {regex} & ~/(.|\\n)*({'|'.join(_regex_escape(t) for t in stops)})(.|\\n)*/"
        )
        return f"{pad} XVALUE_{n} {pad} {closer}"
    return raw


def _lazy_value(regex: str, closer: str, pad: str, rules: list[str], ends: Sequence[str]) -> str:
    """A patterned value and its text closer as one lazy lexeme (a rule added to `rules`): it ends
    at the closer's first occurrence, where the parser ends the value. A greedy pattern (`x.*y`)
    would run on past it, or could not end where its pattern allows more (`a( b)*` then the pad's
    newline). The value never holds the closer, nor, with a pad (one newline each side, which the
    parser strips), starts or ends with a newline, nor any other text the parser ends a value at
    (`ends`: qwen3-coder's next `<parameter=`, `</function>` …)."""
    n = len(rules)
    stops = "|".join(_regex_escape(end) for end in dict.fromkeys((closer, *ends)))
    body = f"{regex} & ~/(.|\\n)*({stops})(.|\\n)*/"
    edge = ""
    if pad:
        if pad != '"\\n"?':
            raise ValueError(f"a pad of one optional newline is the one known: {pad}")
        body += " & ~/\\n(.|\\n)*/ & ~/(.|\\n)*\\n/"
        edge = "/\\n?/"
    rules += [f"XVALUE_{n}: {body}", f"xvalue_{n}[lazy]: {edge} XVALUE_{n} {edge} {lit(closer)}"]
    return f"xvalue_{n}"


def _slashes_escaped(pattern: str) -> str:
    """A regex as a Lark `/…/` literal: its unescaped `/` escaped."""
    out, escaped = [], False
    for ch in pattern:
        out.append("\\/" if ch == "/" and not escaped else ch)
        escaped = ch == "\\" and not escaped
    return "".join(out)


def xml_parameters(
    tool: GrammarTool, param: Callable[[str, str], str], syntax: ValueSyntax, rules: list[str] | None = None
) -> str:
    """The parameters of one call as a Lark expression: in schema order, required ones always,
    optional ones maybe; any keys and raw values when the schema names no properties.
    `param(key, value)` writes one parameter around a value that ends with its closer; `rules`
    receives the rules some values need of their own (`raw_value`)."""
    raw, key, keys = syntax.raw, syntax.key, syntax.keys
    if is_any_object(deref(tool.schema, tool.schema)):
        return f"({param(key, raw)})*"
    named, required = parameters(tool)
    for name, _ in named:
        if re.fullmatch(keys, name) is None or name != name.strip():
            raise GrammarUnsupported(
                f"parameter name {name!r} cannot be written in this call syntax", tool.name
            )
    parts: list[str] = []
    for name, sub in named:
        value = raw_value(sub, syntax, tool.name, name, root=tool.schema, rules=rules)
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
    # The tool names the family's call syntax carries, as the regex its parser reads a name with
    # (a whole name matches it); None: any name (a JSON string). A constrained call of a tool the
    # syntax cannot name is a 400, not a call the parser would misread.
    tool_names: str | None = None

    @property
    def marker_strings(self) -> tuple[str, ...]:
        """Every marker the grammar may reference, to resolve against the tokenizer once."""
        think = self.think or ()
        return tuple(dict.fromkeys((*think, *self.markers, *self.extra_markers)))
