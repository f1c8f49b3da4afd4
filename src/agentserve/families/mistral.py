"""Mistral / Mixtral / Ministral / Devstral / Magistral: `[TOOL_CALLS]` calls, `[THINK]` reasoning.

Raw output, by tokenizer version::

    [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "neg", "arguments": {"x": 2}}]</s>
    [TOOL_CALLS]add{"a": 1}[TOOL_CALLS]neg{"x": 2}</s>                                  (v11+)
    [TOOL_CALLS]add[ARGS]{"a": 1}                                                      (newer)
    [TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}                                    (newer)

Magistral thinks in `[THINK]…[/THINK]`; a `[TOOL_CALLS]` inside the thought ends it. `</s>` and
an optional `[/TOOL_CALLS]` after calls carry no content (elsewhere `[/TOOL_CALLS]` is
text). A native `[CALL_ID]` is kept as the call's id.
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
    name_then_arguments,
    repeat,
)
from agentserve.parsing.jsonblock import JsonCallsBlock
from agentserve.parsing.jsonstream import JsonValueScanner
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

TOOL_CALLS = "[TOOL_CALLS]"
ARGS, CALL_ID = "[ARGS]", "[CALL_ID]"
TOOL_CALLS_END = "[/TOOL_CALLS]"  # optional after calls; elsewhere text
END_OF_TURN = ("</s>",)

_WS = " \t\r\n"
_NAME_RUN = re.compile(r"[\w.\-]+")
_ID_RUN = re.compile(r"\w+")

# States of MistralCallBlock
_LEAD, _NAME, _GAP, _MARK, _ID, _ARGS_LEAD, _ARGS, _JSON_FORM = range(8)


class MistralCallBlock:
    """What follows one `[TOOL_CALLS]`: a JSON array/object of calls (pre-v11), or one `NAME{json}`
    call with optional `[CALL_ID]id` and `[ARGS]` before the JSON (v11+)."""

    __slots__ = (
        "_call_id",
        "_ctx",
        "_inner",
        "_name",
        "_raw",
        "_scanner",
        "_state",
        "done",
        "fallback",
        "reparse",
    )

    def __init__(self, ctx: BlockContext) -> None:
        self._ctx = ctx
        self._state = _LEAD
        self._raw: list[str] = [ctx.opener]  # given back as text if this is not a call after all
        self._name: list[str] = []
        self._call_id: list[str] = []
        self._inner: JsonCallsBlock | None = None
        self._scanner = JsonValueScanner()
        self.done = False
        self.fallback = ""
        self.reparse = ""  # text after a broken call, for the driver to parse again

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _JSON_FORM:
                return self._feed_inner(buf, i, out)
            if state == _ARGS:
                return self._feed_args(buf, i, out)
            if state in (_NAME, _ID):
                run = (_NAME_RUN if state == _NAME else _ID_RUN).match(buf, i)
                if run is not None:
                    (self._name if state == _NAME else self._call_id).append(run.group())
                    self._raw.append(run.group())
                    i = run.end()
                    continue
                self._state = _GAP
                continue
            c = buf[i]
            if c in _WS and state in (_LEAD, _GAP, _ARGS_LEAD):
                self._raw.append(c)
                i += 1
                continue
            if state == _LEAD:
                if c in "[{":
                    return self._start_json_form(buf, i, out)
                if _NAME_RUN.match(c) is None:
                    return self._give_up(i)
                self._state = _NAME
            elif state == _GAP:  # after the name or the id
                if c == "{":
                    self._start_call(out)
                    self._state = _ARGS
                elif c == "[":
                    self._state = _MARK
                else:
                    return self._give_up(i)
            elif state == _MARK:
                if buf.startswith(ARGS, i):
                    self._raw.append(ARGS)
                    self._start_call(out)
                    self._state = _ARGS_LEAD
                    i += len(ARGS)
                elif buf.startswith(CALL_ID, i) and not self._call_id:
                    self._raw.append(CALL_ID)
                    self._state = _ID
                    i += len(CALL_ID)
                elif ARGS.startswith(buf[i:]) or CALL_ID.startswith(buf[i:]):
                    return i  # a marker split across chunks: wait for the rest
                else:
                    return self._give_up(i)
            else:  # _ARGS_LEAD: the arguments must be an object
                if c != "{":
                    self._ctx.calls.fail("malformed", out, "arguments are not a JSON object")
                    self.done = True
                    return i
                self._state = _ARGS
        return i

    def _start_json_form(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        inner = JsonCallsBlock(self._ctx)
        self._inner = inner
        self._state = _JSON_FORM
        lead = "".join(self._raw[1:])  # whitespace after the opener: the inner block keeps its own text
        if lead:
            inner.feed(lead, 0, out)
        return self._feed_inner(buf, i, out)

    def _feed_inner(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        inner = self._inner
        assert inner is not None
        i = inner.feed(buf, i, out)
        self._sync(inner)
        return i

    def _sync(self, inner: JsonCallsBlock) -> None:
        self.done = inner.done
        self.fallback = inner.fallback

    def _start_call(self, out: list[OutputEvent]) -> None:
        call_id = "".join(self._call_id) or None
        self._ctx.calls.start("".join(self._name), out, call_id)
        self._raw = []

    def _feed_args(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        scanner = self._scanner
        j = scanner.scan(buf, i)
        self._ctx.calls.args(buf[i:j], out)
        if scanner.done:
            self._ctx.calls.end(out)
            self.done = True
        return j

    def _give_up(self, i: int) -> int:
        """Not a call: everything since the opener goes back as text."""
        self.done = True
        self.fallback = "".join(self._raw)
        return i

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        if self._inner is not None:
            self._inner.close(out)
            self._sync(self._inner)
            return
        self.done = True
        calls = self._ctx.calls
        if calls.open:
            # The JSON never closed. A `[TOOL_CALLS]` inside it (a literal one inside a string would
            # have let it close) means it was broken, not cut off: report it malformed up to there
            # and parse the calls after it again, instead of letting them be swallowed.
            streamed = calls.streamed
            at = streamed.find(TOOL_CALLS)
            if at >= 0:
                calls.fail(
                    "malformed", out, "arguments not closed before the next [TOOL_CALLS]", streamed[:at]
                )
                self.reparse = streamed[at:]
            else:
                calls.finish(out)
        else:
            self.fallback = "".join(self._raw)


def _tool_calls(ctx: BlockContext) -> ToolBlock:
    return MistralCallBlock(ctx)


SYNTAX = Syntax(
    think_open="[THINK]",
    think_close="[/THINK]",
    tool_blocks={TOOL_CALLS: _tool_calls},
    swallow=END_OF_TURN,
    tails={TOOL_CALLS: TOOL_CALLS_END},
)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: `[TOOL_CALLS]NAME[ARGS]{json}` per call (the current tokenizers' form)."""
    bodies = name_then_arguments(tools, m.tok("[ARGS]"))
    return "\n".join(
        (
            f"calls: {repeat('call', '', count)}",
            f"call: {m.tok('[TOOL_CALLS]')} call_body",
            f"call_body: {bodies}",
        )
    )


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("[THINK]", "[/THINK]"),
    markers=("[TOOL_CALLS]", "[ARGS]"),
    tool_names=_NAME_RUN.pattern,
)

FAMILY = Family(
    name="mistral",
    description="Mistral/Mixtral/Devstral/Magistral: [TOOL_CALLS] calls (JSON array or NAME{json}), "
    "[THINK] reasoning",
    make_parser=make_parser,
    aliases=("magistral", "devstral", "mixtral", "ministral"),
    model_patterns=(r"mistral", r"mixtral", r"magistral", r"devstral", r"ministral"),
    stop_tokens=("</s>",),
    special_tokens=(
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[THINK]",
        "[/THINK]",
    ),
    grammar=GRAMMAR,
)
