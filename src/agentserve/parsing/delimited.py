"""Streaming the arguments of a call that ends at a marker (special-token formats).

Kimi K2, DeepSeek and gpt-oss close a call with a token of their own (`<|tool_call_end|>`,
`<｜tool▁call▁end｜>`, `<|call|>`), so the arguments are simply the text up to that token: no JSON
heuristic decides where they end (vLLM#48342), and a malformed object cannot swallow the rest of the
turn. The text is validated once, at dispatch, by `ToolCalls.end`.

Formatting around the object (the newline before the end token, DeepSeek V3's closing code fence)
is not part of the arguments: leading whitespace is dropped and a trailing run of `tail` characters
is held until more text shows it was inside the arguments. Whatever is still held at the end marker
is dropped, so the fragments concatenate to the same text however the stream was chunked.
"""

from __future__ import annotations

from agentserve.conversation import OutputEvent
from agentserve.parsing.toolcalls import ToolCalls

WHITESPACE = " \t\r\n"


class DelimitedArgs:
    __slots__ = ("_calls", "_pending", "_started", "_tail")

    def __init__(self, calls: ToolCalls, tail: str = WHITESPACE) -> None:
        self._calls = calls
        self._tail = tail
        self._started = False
        self._pending: list[str] = []  # the held tail (a list: a long run is not re-copied per chunk)

    def reset(self) -> None:
        """Start the arguments of the next call (drops a held tail)."""
        self._started = False
        self._pending.clear()

    def write(self, text: str, out: list[OutputEvent]) -> None:
        if not text:
            return
        if not self._started:
            text = text.lstrip()
            if not text:
                return
            self._started = True
        body = text.rstrip(self._tail)
        pending = self._pending
        if not body:
            pending.append(text)
            return
        if pending:
            fragment = "".join(pending) + body
            pending.clear()
        else:
            fragment = body
        if len(body) < len(text):
            pending.append(text[len(body) :])
        self._calls.args(fragment, out)
