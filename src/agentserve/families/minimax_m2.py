"""MiniMax M2 / M2.1 / M2.5 / M2.7: output starts inside reasoning; `<invoke>` tool calls.

The prompt ends `]~b]ai\\n<think>\\n`, so output begins mid-thought. Raw output::

    Check weather for both cities.
    </think>

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    <invoke name="get_weather">
    <parameter name="city">Rome</parameter>
    </invoke>
    </minimax:tool_call>

- Parallel calls are several `<invoke>` in one wrapper; each is dispatched at its own `</invoke>`.
- Values are raw text exactly as the template wrote them, typed by the tool's schema (`xmlargs`);
  strings stream as they arrive. A value also ends where the next `<parameter name=`, `</invoke>`
  or the wrapper's end begins.
- A malformed `<invoke>` is reported and skipped; the calls after it still parse. An `<invoke>`
  without a usable name never becomes a (nameless) call: its text is given back as text.
- Text in the wrapper that is not an `<invoke>` ends the block and stays text; so does a wrapper
  that holds no call at all.
- `[e~[` (end of message) carries no content.
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
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock
from agentserve.parsing.xmlblock import NAME_LIMIT, VALID_NAME, XmlCallBlock, is_partial, skip_ws, tags

WRAPPER = "<minimax:tool_call>"
WRAPPER_END = "</minimax:tool_call>"
INVOKE = "<invoke"
INVOKE_END = "</invoke>"
PARAMETER = "<parameter"
# A value ends where the next parameter begins; the name attribute makes that unambiguous.
NEXT_PARAMETER = "<parameter name="
PARAMETER_END = "</parameter>"
END_OF_MESSAGE = ("[e~[",)

_BODY = tags(PARAMETER, INVOKE_END, WRAPPER_END)
_VALUE_ENDS = tags(PARAMETER_END, NEXT_PARAMETER, INVOKE_END, WRAPPER_END)
_CALL_ENDS = tags(INVOKE_END, WRAPPER_END)
_BETWEEN = (INVOKE, WRAPPER_END)
_TAG_RUN = re.compile(r"[^<>\n]*")
KEYS = r'[^<>"\n]+'  # a parameter's `name="…"` the tag's `_TAG_RUN` and `_ATTR` read back whole
# A tag's attributes after `<invoke` / `<parameter`: just the name, double-quoted, single-quoted or bare.
_ATTR = re.compile(r"\s+name\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'>]+))\s*")

# States
_WRAP, _INVOKE_TAG, _NAMELESS, _BODY_S, _PARAM_TAG, _VALUE, _SKIP = range(7)


def _attr_name(tag: str) -> str | None:
    m = _ATTR.fullmatch(tag)
    if m is None:
        return None
    name = next(g for g in m.groups() if g is not None).strip()
    return name or None


class MiniMaxBlock(XmlCallBlock):
    """From `<minimax:tool_call>` to its end: any number of `<invoke>` calls."""

    __slots__ = ("_nameless", "_started", "_state", "_tag")

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx)
        self._state = _WRAP
        self._tag: list[str] = []  # text of the tag being read (`<invoke name=…>`, `<parameter name=…>`)
        self._started = False  # a call started in this wrapper: the wrapper itself is structure
        self._nameless: list[str] = []  # text of invokes without a usable name (given back as text)

    def _run(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _VALUE:
                i, marker = self._stream_value(buf, i, _VALUE_ENDS, out)
                if marker == PARAMETER_END:
                    self._state = _BODY_S
                elif marker == NEXT_PARAMETER:
                    self._tag = [NEXT_PARAMETER[len(PARAMETER) :]]
                    self._state = _PARAM_TAG
                elif marker:
                    i = self._end_call(marker, i, out)
            elif state == _BODY_S:
                i, marker = self._skip_to(buf, i, _BODY)
                if marker == PARAMETER:
                    self._tag = []
                    self._state = _PARAM_TAG
                elif marker:
                    i = self._end_call(marker, i, out)
            elif state == _PARAM_TAG:
                j, tag = self._read_tag(buf, i)
                self._raw.append(buf[i:j])
                if tag is None:
                    return n
                key = _attr_name(tag) if j < n and buf[j] == ">" else None
                if key is None:
                    self._set_malformed("malformed <parameter> tag")
                    self._state = _SKIP
                    i = j
                else:
                    self._raw.append(">")
                    self._begin_value(key, out)
                    self._state = _VALUE
                    i = j + 1
            elif state == _SKIP:
                i, marker = self._skip_to(buf, i, _CALL_ENDS)
                if marker:
                    i = self._end_call(marker, i, out)
            elif state == _INVOKE_TAG:
                i = self._read_invoke(buf, i, out)
            elif state == _NAMELESS:
                j = self._skip_nameless(buf, i)
                if j < n and self._state == _NAMELESS:
                    return j  # a possible tag start: the driver holds it
                i = j
            else:  # _WRAP: between calls, only whitespace and our tags may follow
                j = skip_ws(buf, i)
                if not self._started:
                    self._pending.append(buf[i:j])
                if j == n:
                    return n
                if buf.startswith(INVOKE, j):
                    self._tag = []
                    self._state = _INVOKE_TAG
                    i = j + len(INVOKE)
                elif buf.startswith(WRAPPER_END, j):
                    i = self._wrapper_end(j)
                elif is_partial(buf, j, _BETWEEN):
                    return j  # maybe one of our tags, split across chunks
                else:
                    i = self._give_up(j)
        return i

    def _read_tag(self, buf: str, i: int) -> tuple[int, str | None]:
        """Read a tag's attribute text up to `>` (or a character that cannot be in it): (where it
        stopped, the text) or (len(buf), None) when it goes on in the next chunk."""
        m = _TAG_RUN.match(buf, i)
        j = m.end() if m is not None else i
        self._tag.append(buf[i:j])
        tag = "".join(self._tag)
        if j == len(buf) and len(tag) <= NAME_LIMIT:
            return j, None
        return j, tag if len(tag) <= NAME_LIMIT else ""

    def _read_invoke(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        j, tag = self._read_tag(buf, i)
        if tag is None:
            return j
        name = _attr_name(tag) if j < len(buf) and buf[j] == ">" else None
        if name is not None and VALID_NAME.fullmatch(name):
            self._start_call(name, INVOKE + tag + ">", out)
            # From the first call on, the wrapper is structure: only nameless invokes go back.
            self._pending = self._nameless
            self._started = True
            self._state = _BODY_S
            return j + 1
        # No usable name: never a nameless call; its text goes back as text.
        self._keep_nameless(INVOKE + "".join(self._tag))
        self._state = _NAMELESS
        return j

    def _skip_nameless(self, buf: str, i: int) -> int:
        m = _CALL_ENDS.search(buf, i)
        if m is None:
            hold = _CALL_ENDS.hold_from(buf, i)
            self._keep_nameless(buf[i:hold])
            return hold  # the driver holds a possible tag start
        if m.group() == INVOKE_END:
            self._keep_nameless(buf[i : m.end()])
            self._state = _WRAP
            return m.end()
        self._keep_nameless(buf[i : m.start()])
        return self._wrapper_end(m.start())

    def _keep_nameless(self, text: str) -> None:
        self._nameless.append(text)
        if not self._started:  # (once started, `_pending` is `_nameless`)
            self._pending.append(text)

    def _wrapper_end(self, j: int) -> int:
        if not self._started:  # a wrapper without calls is text, close tag and all
            self._pending.append(WRAPPER_END)
        return self._give_up(j + len(WRAPPER_END))

    def _end_call(self, marker: str, i: int, out: list[OutputEvent]) -> int:
        self._finish_call(out)
        self._state = _WRAP
        if marker == WRAPPER_END:
            return self._give_up(i)  # gives back the text of nameless invokes, if any
        return i

    def _between_arguments(self) -> bool:
        return self._state == _BODY_S

    def _close_uncommitted(self, out: list[OutputEvent]) -> None:
        tag = INVOKE + "".join(self._tag) if self._state == _INVOKE_TAG else ""
        self.fallback = "".join(self._pending) + tag


def _block(ctx: BlockContext) -> ToolBlock:
    return MiniMaxBlock(ctx)


SYNTAX = Syntax(tool_blocks={WRAPPER: _block}, swallow=END_OF_MESSAGE)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


VALUES = ValueSyntax(
    raw="mvalue",
    closer='"</parameter>"',
    key="MKEY",
    keys=KEYS,
    ends=(NEXT_PARAMETER, INVOKE_END, WRAPPER_END),
)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: one `<minimax:tool_call>` wrapper of `<invoke name="…">` calls."""

    def param(key: str, value: str) -> str:
        return f'"<parameter name=\\"" {key} "\\">" {value} WS?'

    def invoke(tool: GrammarTool) -> str:
        head = lit(f'<invoke name="{tool.name}">')
        params = xml_parameters(tool, param, VALUES, values)
        return f'{head} WS? {params} "</invoke>"'

    values: list[str] = []  # rules of values that need their own (`raw_value`)
    rules = [
        f"calls: {m.tok(WRAPPER)} WS? {repeat('invoke', 'WS?', count)} WS? {m.tok(WRAPPER_END)}",
        *per_tool_rules("invoke", tools, invoke),
        *values,
    ]
    # A raw value runs to its closing tag, which it holds (a lazy lexeme: see qwen3_coder).
    rules += ["mvalue[lazy]: /(.|\\n)*<\\/parameter>/", f"MKEY: /{KEYS}/"]
    return "\n".join(rules)


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("<think>", "</think>"),
    markers=(WRAPPER, WRAPPER_END),
    tool_names=VALID_NAME.pattern,
)

FAMILY = Family(
    name="minimax-m2",
    description="MiniMax M2 / M2.1 / M2.5 / M2.7: output starts in <think>, "
    "<minimax:tool_call><invoke name=…><parameter name=…> calls",
    make_parser=make_parser,
    aliases=("minimax_m2", "minimax", "minimax-m2.1", "minimax-m2.5", "minimax-m2.7"),
    model_patterns=(r"minimax-?m2",),
    stop_tokens=("[e~[",),
    special_tokens=("]~!b[", "]~b]", "[e~[", WRAPPER, WRAPPER_END, "<think>", "</think>"),
    starts_in_reasoning=True,
    grammar=GRAMMAR,
)
