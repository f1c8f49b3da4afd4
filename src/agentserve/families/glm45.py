"""GLM-4.5 / 4.6 / 4.7 / 5.x: `<think>` reasoning, `<arg_key>`/`<arg_value>` tool calls.

Raw output::

    <think>Need to look up weather.</think>
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

- GLM-4.7+ may omit the newline after the name, and writes zero-argument calls inline:
  `<tool_call>get_time</tool_call>`.
- Values are raw text exactly as the template wrote them (`<arg_value>{{ v }}</arg_value>`, no
  formatting newlines), typed by the tool's schema (`xmlargs`); strings stream as they arrive.
- A value also ends where the next `<arg_key>` or `</tool_call>` begins (a forgotten
  `</arg_value>` still dispatches). The call is dispatched at `</tool_call>`.
- `<tool_call>` not followed by a name and then a newline, `<arg_key>` or `</tool_call>` is text.
- `<tool_call>` inside reasoning ends the reasoning (GLM opens calls without closing its thought).
- End-of-turn tokens (`<|user|>`, `<|observation|>`, `<|endoftext|>`) carry no content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentserve.conversation import OutputEvent
from agentserve.families.base import Family
from agentserve.families.grammar import (
    CallCount,
    GrammarTool,
    Markers,
    ToolGrammar,
    ValueSyntax,
    lit,
    per_tool_rules,
    repeat,
    text_without,
    xml_parameters,
)
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock
from agentserve.parsing.xmlblock import NAME_LIMIT, XmlCallBlock, is_partial, skip_ws, tags

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ARG_KEY = "<arg_key>"
ARG_KEY_END = "</arg_key>"
ARG_VALUE = "<arg_value>"
ARG_VALUE_END = "</arg_value>"
END_OF_TURN = ("<|user|>", "<|observation|>", "<|endoftext|>", "<|assistant|>", "<|system|>")

_BODY = tags(ARG_KEY, TOOL_CALL_END)
_KEY_ENDS = tags(ARG_KEY_END, ARG_KEY, ARG_VALUE, ARG_VALUE_END, TOOL_CALL_END)
_VALUE_ENDS = tags(ARG_VALUE_END, ARG_KEY, TOOL_CALL_END)
_CALL_END = tags(TOOL_CALL_END)
_AFTER_NAME = (ARG_KEY, TOOL_CALL_END)
_NAME_RUN = re.compile(r"[\w.:/-]*")
VALUE_ENDS = ("</arg_value>", "<arg_key>", "</tool_call>")  # what a value's text may not hold
KEYS = r"[^<\n]+"  # an `<arg_key>` name: up to its closing tag, on one line

# States
_NAME, _BODY_S, _KEY, _BETWEEN, _VALUE, _SKIP = range(6)


class Glm45Block(XmlCallBlock):
    """From `<tool_call>` to its `</tool_call>`: one call."""

    __slots__ = ("_key", "_name", "_state")

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self._state = _NAME
        self._name: list[str] = []
        self._key: list[str] = []

    def _run(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _VALUE:
                i, marker = self._stream_value(buf, i, _VALUE_ENDS, out)
                if marker == ARG_VALUE_END:
                    self._state = _BODY_S
                elif marker == ARG_KEY:
                    self._start_key()
                elif marker:
                    self._end_call(out)
            elif state == _BODY_S:
                i, marker = self._skip_to(buf, i, _BODY)
                if marker == ARG_KEY:
                    self._start_key()
                elif marker:
                    self._end_call(out)
            elif state == _KEY:
                cut, m = self._find(buf, i, _KEY_ENDS)
                self._key.append(buf[i:cut])
                self._raw.append(buf[i:cut])
                if sum(len(p) for p in self._key) > NAME_LIMIT:
                    self._tail = ""  # skipping goes on from `cut` now
                    i = self._bad("argument key too long", cut)
                elif m is None:
                    i = n
                elif m.group() != ARG_KEY_END or not "".join(self._key).strip():
                    i = self._bad(f"argument key not closed before {m.group()}", cut)
                else:
                    self._raw.append(ARG_KEY_END)
                    self._state = _BETWEEN
                    i = m.end()
            elif state == _BETWEEN:
                j = skip_ws(buf, i)
                self._raw.append(buf[i:j])
                if j == n:
                    return n
                if buf.startswith(ARG_VALUE, j):
                    self._raw.append(ARG_VALUE)
                    self._begin_value("".join(self._key).strip(), out)
                    self._state = _VALUE
                    i = j + len(ARG_VALUE)
                elif is_partial(buf, j, (ARG_VALUE,)):
                    self._tail = buf[j:]
                    return n
                else:
                    i = self._bad("argument key without <arg_value>", j)
            elif state == _SKIP:
                i, marker = self._skip_to(buf, i, _CALL_END)
                if marker:
                    self._end_call(out)
            else:  # _NAME: outside a call until the name is complete
                j = self._read_name(buf, i, out)
                if j == i and self._state == _NAME:
                    return i  # a possible tag start: the driver holds it
                i = j
        return i

    def _read_name(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        if not self._name:
            j = skip_ws(buf, i)
            self._pending.append(buf[i:j])
            i = j
            if i == n:
                return n
        m = _NAME_RUN.match(buf, i)
        j = m.end() if m is not None else i
        if j > i:
            self._name.append(buf[i:j])
        name = "".join(self._name)
        if len(name) > NAME_LIMIT:
            self._pending.append(name)
            return self._give_up(j)
        if j == n:
            return n
        c = buf[j]
        if name and c == "\n":
            self._start(name, "\n", out)
            return j + 1
        if name and c == "<":
            if buf.startswith(_AFTER_NAME, j):
                self._start(name, "", out)
                return j
            if is_partial(buf, j, _AFTER_NAME):
                return j  # maybe `<arg_key>` or `</tool_call>`, split across chunks
        self._pending.append(name)
        return self._give_up(j)

    def _start(self, name: str, sep: str, out: list[OutputEvent]) -> None:
        self._start_call(name, "".join(self._pending) + name + sep, out)
        self._state = _BODY_S

    def _start_key(self) -> None:
        self._key = []
        self._state = _KEY

    def _bad(self, message: str, j: int) -> int:
        self._set_malformed(message)
        self._state = _SKIP
        return j

    def _end_call(self, out: list[OutputEvent]) -> None:
        self._finish_call(out)
        self.done = True

    def _between_arguments(self) -> bool:
        return self._state == _BODY_S

    def _close_uncommitted(self, out: list[OutputEvent]) -> None:
        self.fallback = "".join(self._pending) + "".join(self._name)


def _block(ctx: BlockContext) -> ToolBlock:
    return Glm45Block(ctx)


SYNTAX = Syntax(tool_blocks={TOOL_CALL: _block}, swallow=END_OF_TURN)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: `<tool_call>NAME` + `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs."""

    def param(key: str, value: str) -> str:
        # The parser reads a name only when a newline, `<arg_key>` or `</tool_call>` follows it.
        return (
            f'"\\n"? {m.tok("<arg_key>")} {key} {m.tok("</arg_key>")} "\\n"? {m.tok("<arg_value>")} {value}'
        )

    close = m.tok("</arg_value>")

    def function(tool: GrammarTool) -> str:
        values = ValueSyntax(raw=f"AVALUE {close}", closer=close, key="AKEY", keys=KEYS, ends=VALUE_ENDS)
        return f"{lit(tool.name)} {xml_parameters(tool, param, values, extra)}"

    extra: list[str] = []  # rules of values that need their own (`raw_value`)
    rules = [
        f"calls: {repeat('call', 'WS?', count)}",
        f'call: {m.tok(TOOL_CALL)} function "\\n"? {m.tok("</tool_call>")}',
        *per_tool_rules("function", tools, function),
        *extra,
    ]
    rules += [f"AVALUE: {text_without(VALUE_ENDS, nonempty=False)}", f"AKEY: /{KEYS}/"]
    return "\n".join(rules)


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("<think>", "</think>"),
    markers=(TOOL_CALL, "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    tool_names=_NAME_RUN.pattern,
)

FAMILY = Family(
    name="glm-4.5",
    description="GLM-4.5 / 4.6 / 4.7 / 5.x: <think> reasoning, <tool_call>NAME<arg_key>…<arg_value>… calls",
    make_parser=make_parser,
    aliases=("glm45", "glm4.5", "glm-4.6", "glm46", "glm47", "glm-4.7", "glm-5", "glm5", "glm", "glm4-moe"),
    model_patterns=(r"glm-?4\.[567]", r"glm-?5"),
    stop_tokens=("<|observation|>", "<|user|>"),
    special_tokens=(
        "[gMASK]",
        "<sop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
    ),
    grammar=GRAMMAR,
)
