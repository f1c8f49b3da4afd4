"""Qwen3-Coder, Qwen3.5, Qwen3-Next, Nemotron 3 and Step-3.5: `<think>` reasoning, XML tool calls.

Raw output::

    <tool_call>
    <function=write_file>
    <parameter=path>
    src/app.py
    </parameter>
    <parameter=content>
    print("hi")
    </parameter>
    </function>
    </tool_call>

- The template writes `<parameter=k>\\n{v}\\n</parameter>`: exactly one leading and one trailing
  newline of a value are formatting and are dropped (the trailing one is held while streaming).
- Values are raw text typed by the tool's schema (`xmlargs`); strings stream as they arrive.
- A value also ends where the next `<parameter=`, `</function>` or `</tool_call>` begins (a model
  that forgets `</parameter>` still dispatches, as in vLLM); the call is dispatched at `</function>`
  (or at `</tool_call>` when `</function>` is missing).
- `<tool_call>` without `<function=` is text; a bare `<function=…>` without `<tool_call>` is a call
  (Dynamo's back-off) once a `<parameter=` or `</function>` follows it, so prose that mentions the
  tag stays text; a Hermes JSON object inside `<tool_call>` is parsed as JSON (some Qwen
  checkpoints mix the formats).
- `<tool_call>` inside reasoning ends the reasoning (Qwen3.5 opens calls without closing `</think>`).
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
    xml_parameters,
)
from agentserve.families.tokens import CHATML
from agentserve.parsing.jsonblock import JsonCallsBlock
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock
from agentserve.parsing.xmlblock import NAME_LIMIT, VALID_NAME, XmlCallBlock, is_partial, skip_ws, tags

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
END_OF_TURN = ("<|im_end|>", "<|endoftext|>")

_BODY = tags(PARAMETER, FUNCTION_END, TOOL_CALL_END)
_VALUE_ENDS = tags(PARAMETER_END, PARAMETER, FUNCTION_END, TOOL_CALL_END)
_CALL_ENDS = tags(FUNCTION_END, TOOL_CALL_END)
_AFTER = (TOOL_CALL_END, FUNCTION)
_FIRST_IN_BODY = (PARAMETER, FUNCTION_END)
_NAME_RUN = re.compile(r"[\w.:/ -]*")
_KEY_RUN = re.compile(r"[^<>\n]*")
KEYS = r"[^<>\n]+"  # the parameter names `_KEY_RUN` reads back whole

# States
_PRE, _NAME, _CONFIRM, _BODY_S, _KEY, _VALUE, _SKIP, _AFTER_S, _JSON = range(9)


class Qwen3CoderBlock(XmlCallBlock):
    """From `<tool_call>` (or a bare `<function=`) to the end of its call(s)."""

    STRIP_NEWLINES = True

    __slots__ = ("_function", "_json", "_key", "_name", "_state", "_wrapped")

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self._wrapped = ctx.opener == TOOL_CALL
        self._state = _PRE if self._wrapped else _NAME
        self._function = ""  # a bare call's name, until its first tag confirms it
        self._name: list[str] = []
        self._key: list[str] = []
        self._json: JsonCallsBlock | None = None

    def _run(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _VALUE:
                i, marker = self._stream_value(buf, i, _VALUE_ENDS, out)
                if marker:
                    i = self._after_value(marker, i, out)
            elif state == _BODY_S:
                i, marker = self._skip_to(buf, i, _BODY)
                if marker == PARAMETER:
                    self._key = []
                    self._state = _KEY
                elif marker:
                    i = self._end_call(marker, i, out)
            elif state == _KEY:
                i = self._read_key(buf, i, out)
            elif state == _SKIP:
                i, marker = self._skip_to(buf, i, _CALL_ENDS)
                if marker:
                    i = self._end_call(marker, i, out)
            elif state == _NAME:
                i = self._read_name(buf, i, out)
            elif state == _CONFIRM:
                j = skip_ws(buf, i)
                self._pending.append(buf[i:j])
                if j == n:
                    return n
                if buf.startswith(_FIRST_IN_BODY, j):
                    self._start_call(self._function, "".join(self._pending), out)
                    self._state = _BODY_S
                    i = j
                elif is_partial(buf, j, _FIRST_IN_BODY):
                    return j  # maybe the tag, split across chunks
                else:
                    return self._give_up(j)
            elif state == _JSON:
                return self._feed_json(buf, i, out)
            else:  # _PRE or _AFTER_S: outside a call, only whitespace and our tags may follow
                j = skip_ws(buf, i)
                if state == _PRE:
                    self._pending.append(buf[i:j])
                if j == n:
                    return n
                if buf.startswith(FUNCTION, j):
                    if state == _AFTER_S:
                        self._pending = []
                    self._pending.append(FUNCTION)
                    self._name = []
                    self._state = _NAME
                    i = j + len(FUNCTION)
                elif state == _AFTER_S and buf.startswith(TOOL_CALL_END, j):
                    self.done = True
                    return j + len(TOOL_CALL_END)
                elif is_partial(buf, j, _AFTER if state == _AFTER_S else (FUNCTION,)):
                    return j  # maybe one of our tags, split across chunks
                elif state == _PRE and buf[j] == "{":
                    ctx = self._ctx
                    opener = "".join(self._pending)
                    self._json = JsonCallsBlock(BlockContext(ctx.calls, ctx.tools, opener), TOOL_CALL_END)
                    self._state = _JSON
                    i = j
                else:
                    return self._give_up(j)
        return i

    def _read_name(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        m = _NAME_RUN.match(buf, i)
        j = m.end() if m is not None else i
        self._name.append(buf[i:j])
        size = sum(len(p) for p in self._name)
        if size > NAME_LIMIT:
            self._pending += self._name
            return self._give_up(j)
        if j == len(buf):
            return j
        name = "".join(self._name)
        self._pending.append(name)
        stripped = name.strip()
        if buf[j] != ">" or VALID_NAME.fullmatch(stripped) is None:
            return self._give_up(j)
        if not self._wrapped:
            # A bare `<function=…>` may be prose about the format: it is a call once a parameter
            # or the end of the function follows.
            self._pending.append(">")
            self._function = stripped
            self._state = _CONFIRM
            return j + 1
        self._start_call(stripped, "".join(self._pending) + ">", out)
        self._state = _BODY_S
        return j + 1

    def _read_key(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        m = _KEY_RUN.match(buf, i)
        j = m.end() if m is not None else i
        self._key.append(buf[i:j])
        self._raw.append(buf[i:j])
        key = "".join(self._key)
        if len(key) > NAME_LIMIT:
            return self._bad_key("parameter name too long", j)
        if j == len(buf):
            return j
        if buf[j] != ">":
            return self._bad_key("parameter tag not closed", j)
        key = key.strip()
        if not key:
            return self._bad_key("empty parameter name", j)
        self._raw.append(">")
        self._begin_value(key, out)
        self._state = _VALUE
        return j + 1

    def _bad_key(self, message: str, j: int) -> int:
        self._set_malformed(message)
        self._state = _SKIP
        return j

    def _after_value(self, marker: str, i: int, out: list[OutputEvent]) -> int:
        if marker == PARAMETER_END:
            self._state = _BODY_S
        elif marker == PARAMETER:
            self._key = []
            self._state = _KEY
        else:
            i = self._end_call(marker, i, out)
        return i

    def _end_call(self, marker: str, i: int, out: list[OutputEvent]) -> int:
        self._finish_call(out)
        if marker == TOOL_CALL_END:
            self.done = True
        else:
            self._state = _AFTER_S
        return i

    def _feed_json(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        block = self._json
        assert block is not None
        i = block.feed(buf, i, out)
        if block.done:
            self.done = True
            self.fallback = block.fallback
        return i

    def _between_arguments(self) -> bool:
        return self._state == _BODY_S

    def _close_uncommitted(self, out: list[OutputEvent]) -> None:
        if self._state == _JSON and self._json is not None:
            self._json.close(out)
            self.fallback = self._json.fallback
        elif self._state == _NAME:
            self.fallback = "".join(self._pending) + "".join(self._name)
        else:
            super()._close_uncommitted(out)


def _block(ctx: BlockContext) -> ToolBlock:
    return Qwen3CoderBlock(ctx)


SYNTAX = Syntax(tool_blocks={TOOL_CALL: _block, FUNCTION: _block}, swallow=END_OF_TURN)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


VALUES = ValueSyntax(
    raw="pvalue",
    closer='"</parameter>"',
    key="PKEY",
    keys=KEYS,
    pad='"\\n"?',
    ends=(PARAMETER, FUNCTION_END, TOOL_CALL_END),
)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: `<tool_call>` + `<function=NAME>` + `<parameter=K>` raw values (docs: module)."""

    def param(key: str, value: str) -> str:
        return f'"<parameter=" {key} ">" {value} WS?'

    def function(tool: GrammarTool) -> str:
        params = xml_parameters(tool, param, VALUES, values)
        return f'{lit(f"<function={tool.name}>")} WS? {params} "</function>"'

    values: list[str] = []  # rules of values that need their own (`raw_value`)
    rules = [
        f"calls: {repeat('call', 'WS?', count)}",
        f"call: {m.tok('<tool_call>')} WS? function WS? {m.tok('</tool_call>')}",
        *per_tool_rules("function", tools, function),
        *values,
    ]
    # A raw value runs to its closing tag, which it holds: a lazy lexeme ends at the tag's first
    # occurrence (a greedy terminal could not end before it; a `stop=` string ends it too, but
    # llguidance's `validate_tokens` does not see past a stop string, and the sim validates).
    rules += ["pvalue[lazy]: /(.|\\n)*<\\/parameter>/", f"PKEY: /{KEYS}/"]
    return "\n".join(rules)


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("<think>", "</think>"),
    markers=("<tool_call>", "</tool_call>", "<function="),
    tool_names=VALID_NAME.pattern,
)

FAMILY = Family(
    name="qwen3-coder",
    description="Qwen3-Coder / Qwen3.5 / Qwen3-Next / Nemotron 3 / Step-3.5: <think> reasoning, "
    "<tool_call><function=…><parameter=…> XML calls",
    make_parser=make_parser,
    aliases=(
        "qwen3_coder",
        "qwen3-xml",
        "qwen3.5",
        "qwen3-next",
        "nemotron-3",
        "nemotron_v3",
        "nemotron3",
        "nemotron-nano",
        "step-3.5",
        "step3.5",
    ),
    model_patterns=(
        r"qwen3-?coder",
        r"qwen3\.5",
        r"qwen3-?next",
        r"nemotron-?3(?![\d.])",
        r"step-?3\.5",
    ),
    stop_tokens=("<|im_end|>",),
    special_tokens=CHATML,
    grammar=GRAMMAR,
)
