"""Tool calls written as Python calls: `[get_weather(city="Paris"), get_time(tz="CET")]`.

`PythonCallsBlock` follows strings (single, double, triple-quoted, escapes) and bracket nesting
incrementally, so each character is looked at once. A call starts (ToolCallStart) the moment
`name(` is seen; at its closing paren that one call's arguments are parsed with `ast` (literals
only) and sent as one JSON fragment, then dispatched. A call that is not literal keyword arguments
is reported malformed and the calls after it still parse. A list that is not calls (`[1, 2]`,
`[see above]`) is given back as text.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from typing import Any

from agentserve.conversation import OutputEvent
from agentserve.parsing.stream import BlockContext

_WS = " \t\r\n"
NAME_START = re.compile(r"[^\W\d]")  # a letter or `_`
NAME_RUN = re.compile(r"[\w.\-]+")  # MCP names may carry `-`; the name is never given to `ast`
_CODE_RUN = re.compile(r"[^'\"()\[\]{}]+")
_STRING_RUN = {'"': re.compile(r'[^"\\]+'), "'": re.compile(r"[^'\\]+")}
_CLOSERS = {")": "(", "]": "[", "}": "{"}
# JSON literals some models (Olmo 3) write instead of Python's
_JSON_NAMES: dict[str, Any] = {"true": True, "false": False, "null": None}

# States of PythonCallsBlock
_PRE, _NAME_OR_END, _NAME, _ARGS, _AFTER, _POST = range(6)


class NotLiteralError(ValueError):
    pass


def literal(node: ast.expr) -> Any:
    """The JSON value of a Python literal expression; anything else raises NotLiteralError."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = literal(node.operand)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.List | ast.Tuple):
        return [literal(e) for e in node.elts]
    elif isinstance(node, ast.Dict):
        result: dict[str, Any] = {}
        for key, value_node in zip(node.keys, node.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                raise NotLiteralError("dict keys must be strings")
            result[key.value] = literal(value_node)
        return result
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise NotLiteralError(f"not a literal: {ast.dump(node)[:80]}")


def call_arguments(args_text: str) -> str:
    """JSON object text of the keyword arguments written between a call's parens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes (`"\\d"`) warn; the value is still a literal
        tree = ast.parse("_(" + args_text + ")", mode="eval")
    call = tree.body
    if not isinstance(call, ast.Call) or call.args:
        raise NotLiteralError("arguments must be keyword arguments")
    result: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None or kw.arg in result:
            raise NotLiteralError("arguments must be distinct keyword arguments")
        result[kw.arg] = literal(kw.value)
    return json.dumps(result, ensure_ascii=False, allow_nan=False)


class PythonCallsBlock:
    """A list of Python calls, from just after its opener (if any) to just after its end.

    `bracketed`: True for `[…]` (its first character is the `[`); None when either `[…]` or calls
    one after another (separated by commas or newlines, Olmo 3) may follow the opener; those end at
    `close` or at the first other text. `close` is the optional end marker (`<|python_end|>`).
    """

    __slots__ = (
        "_args",
        "_bracketed",
        "_close",
        "_committed",
        "_ctx",
        "_escape",
        "_name",
        "_pending",
        "_quote",
        "_quote_run",
        "_stack",
        "_state",
        "done",
        "fallback",
    )

    def __init__(self, ctx: BlockContext, *, bracketed: bool | None = True, close: str = "") -> None:
        self._ctx = ctx
        self._bracketed = bracketed
        self._close = close
        self._state = _PRE
        self._committed = False  # a call of this block has started
        # Model text not part of a started call: given back as text if no call follows.
        self._pending: list[str] = [ctx.opener]
        self._name: list[str] = []
        self._args: list[str] = []
        self._stack: list[str] = []  # open brackets of the current call, its `(` first
        self._quote = ""  # the open string's quote: '"', "'", '"""' or "'''"; "" outside strings
        self._quote_run = 0  # consecutive quote characters seen that may open or close a string
        self._escape = False
        self.done = False
        self.fallback = ""

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _ARGS:
                i = self._scan_args(buf, i, out)
                continue
            if state == _NAME:
                run = NAME_RUN.match(buf, i)
                if run is not None:
                    self._name.append(run.group())
                    self._pending.append(run.group())
                    i = run.end()
                    continue
                if buf[i] != "(":
                    return self._give_up(i)
                self._start_call(out)
                i += 1
                continue
            c = buf[i]
            if c in _WS:
                self._pending.append(c)
                i += 1
                continue
            if state == _PRE:
                if c == "[":
                    self._bracketed = True
                    self._pending.append(c)
                    self._state = _NAME_OR_END
                    i += 1
                elif self._bracketed is None and NAME_START.match(c):
                    self._bracketed = False
                    self._begin_name()
                else:
                    return self._give_up(i)
            elif state == _NAME_OR_END:
                if NAME_START.match(c):
                    self._begin_name()
                elif c == "]" and self._committed:  # `[f(), ]`
                    i = self._end_list(i)
                else:
                    return self._give_up(i)
            elif state == _AFTER:
                if c == ",":
                    self._pending.append(c)
                    self._state = _NAME_OR_END
                    i += 1
                elif self._bracketed:
                    if c != "]":
                        return self._give_up(i)
                    i = self._end_list(i)
                elif NAME_START.match(c):
                    self._begin_name()  # the next call on its own line
                else:
                    self._state = _POST
            else:  # _POST: the end marker, if any, then the block is over
                close = self._close
                if close and buf.startswith(close, i):
                    self.done = True
                    return i + len(close)
                if close and close.startswith(buf[i:]):
                    return i  # maybe the end marker, split across chunks: wait for more
                self.done = True
                return i
        return i

    def _begin_name(self) -> None:
        self._name = []
        self._state = _NAME

    def _end_list(self, i: int) -> int:
        self._pending = []
        self._state = _POST
        if not self._close:
            self.done = True
        return i + 1

    def _start_call(self, out: list[OutputEvent]) -> None:
        self._ctx.calls.start("".join(self._name), out)
        self._committed = True
        self._pending = []
        self._args = []
        self._stack = ["("]
        self._quote = ""
        self._quote_run = 0
        self._escape = False
        self._state = _ARGS

    def _scan_args(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        """Consume call text up to and including its closing paren; returns where it stopped."""
        n = len(buf)
        start = i
        stack = self._stack
        while i < n:
            quote = self._quote
            c = buf[i]
            if self._quote_run and len(quote) != 3:
                # Quotes opening a string: one is a string, two an empty string, three a triple quote.
                q = quote or c
                if c == q and self._quote_run < 3:
                    self._quote_run += 1
                    i += 1
                    if self._quote_run == 3:
                        self._quote, self._quote_run = q * 3, 0
                    else:
                        self._quote = q
                    continue
                self._quote = q if self._quote_run == 1 else ""
                self._quote_run = 0
                continue
            if quote:
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                run = _STRING_RUN[quote[0]].match(buf, i)
                if run is not None:
                    self._quote_run = 0
                    i = run.end()
                    continue
                i += 1
                if c == "\\":
                    self._escape = True
                    self._quote_run = 0
                elif c != quote[0]:
                    self._quote_run = 0  # the other quote character, inside this string
                elif len(quote) == 1:
                    self._quote = ""
                else:
                    self._quote_run += 1
                    if self._quote_run == 3:
                        self._quote, self._quote_run = "", 0
                continue
            run = _CODE_RUN.match(buf, i)
            if run is not None:
                i = run.end()
                continue
            i += 1
            if c in "'\"":
                self._quote, self._quote_run = c, 1
            elif c in "([{":
                stack.append(c)
            else:
                opened = stack.pop()
                if opened != _CLOSERS[c]:
                    self._args.append(buf[start:i])
                    self._finish_call(out, "mismatched brackets")
                    return i
                if not stack:
                    self._args.append(buf[start : i - 1])
                    self._finish_call(out)
                    return i
        self._args.append(buf[start:i])
        return i

    def _finish_call(self, out: list[OutputEvent], error: str = "") -> None:
        calls = self._ctx.calls
        args_text = "".join(self._args)
        self._state = _AFTER
        if not error:
            try:
                arguments = call_arguments(args_text)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                error = str(exc) or type(exc).__name__
            else:
                calls.args(arguments, out)
                calls.end(out)
                return
            args_text += ")"
        calls.raw("".join(self._name) + "(" + args_text)
        calls.fail("malformed", out, f"not a call with literal keyword arguments: {error}")

    def _give_up(self, i: int) -> int:
        """What was read since the last call is not a call: it goes back as text."""
        self.done = True
        self.fallback = "".join(self._pending)
        return i

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        self.done = True
        if self._state == _ARGS:
            self._ctx.calls.raw("".join(self._name) + "(" + "".join(self._args))
            self._ctx.calls.fail("truncated", out, "output ended inside the tool call")
        elif self._state != _POST:
            self.fallback = "".join(self._pending)
