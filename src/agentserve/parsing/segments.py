"""Writing text and reasoning segments with their edges trimmed.

Model output puts formatting whitespace around structure (`</think>\\n\\n`, newlines between tool
calls). Chat templates put that whitespace back when history is re-rendered, so a segment's own
text is what lies between its first and last non-whitespace character. Trailing whitespace is held
until more text shows it was inside the segment, which keeps the result independent of chunking.
"""

from __future__ import annotations

from agentserve.conversation import OutputEvent, ReasoningDelta, ReasoningEnd, TextDelta


class SegmentWriter:
    __slots__ = ("_pending", "_reasoning", "started")

    def __init__(self, reasoning: bool) -> None:
        self._reasoning = reasoning
        self.started = False
        self._pending: list[str] = []  # trailing whitespace held until more text shows it is inside

    def write(self, text: str, out: list[OutputEvent]) -> None:
        if not text:
            return
        if not self.started:
            text = text.lstrip()
            if not text:
                return
            self.started = True
        body = text.rstrip()
        pending = self._pending
        if not body:
            pending.append(text)  # a list: a long whitespace run must not be re-copied per chunk
            return
        if pending:
            chunk = "".join(pending) + body
            pending.clear()
        else:
            chunk = body
        if len(body) < len(text):
            pending.append(text[len(body) :])
        out.append(ReasoningDelta(chunk) if self._reasoning else TextDelta(chunk))

    def end(self, out: list[OutputEvent]) -> None:
        """Close the segment: drop trailing whitespace; a non-empty reasoning segment gets its boundary."""
        if self.started and self._reasoning:
            out.append(ReasoningEnd())
        self.started = False
        self._pending.clear()
