"""Fold a stream of OutputEvents into the assistant turn it describes.

Shared by the non-streaming builders (they render a finished turn) and by whoever needs the turn as
a `Message` (the call memory, traces). Encoders for streams keep their own state; this is the
reference of what a turn *is*: ordered reasoning segments, text runs, dispatched calls and failed
calls, then the finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentserve.api.signing import Signer
from agentserve.conversation import (
    Finish,
    Message,
    OutputEvent,
    Part,
    Reasoning,
    ReasoningDelta,
    ReasoningEnd,
    Text,
    TextDelta,
    TokenProb,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)


@dataclass(frozen=True, slots=True)
class FailedCall:
    """A call that started but was never dispatched; `raw` is the model's text for it."""

    id: str
    name: str
    raw: str
    reason: str
    message: str = ""


TurnItem = Reasoning | Text | ToolCall | FailedCall


class TurnAccumulator:
    __slots__ = ("_calls", "_items", "_logprobs", "_open", "_parts", "finish", "text_logprobs")

    def __init__(self) -> None:
        self._items: list[TurnItem] = []
        self._open: str | None = None  # "reasoning" | "text" while a run is being collected
        self._parts: list[str] = []
        self._logprobs: list[TokenProb] | None = None  # the open text run's, when carried
        # Per `Text` item of `items`, in order: its tokens' log-probabilities (None: not asked for).
        self.text_logprobs: list[tuple[TokenProb, ...] | None] = []
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self.finish: Finish | None = None

    def _close_run(self) -> None:
        if self._open is not None:
            text = "".join(self._parts)
            if text:
                self._items.append(Reasoning(text) if self._open == "reasoning" else Text(text))
                if self._open == "text":
                    logprobs = self._logprobs
                    self.text_logprobs.append(None if logprobs is None else tuple(logprobs))
            self._open = None
            self._parts = []
            self._logprobs = None

    def _run(self, kind: str, text: str) -> None:
        if self._open != kind:
            self._close_run()
            self._open = kind
        self._parts.append(text)

    def feed(self, event: OutputEvent) -> None:
        match event:
            case ReasoningDelta(text):
                self._run("reasoning", text)
            case ReasoningEnd():
                if self._open == "reasoning":
                    self._close_run()
            case TextDelta(text, logprobs):
                self._run("text", text)
                if logprobs is not None:
                    self._logprobs = [*(self._logprobs or ()), *logprobs]
            case ToolCallStart(index, call_id, name):
                self._close_run()
                self._calls[index] = (call_id, name, [])
            case ToolCallArgsDelta(index, fragment):
                if index in self._calls:
                    self._calls[index][2].append(fragment)
            case ToolCallEnd(index, arguments):
                self._close_run()
                call_id, name, _ = self._calls.pop(index, ("", "", []))
                self._items.append(ToolCall(call_id, name, arguments))
            case ToolCallError(index, reason, raw, message):
                self._close_run()
                call_id, name, _ = self._calls.pop(index, ("", "", []))
                self._items.append(FailedCall(call_id, name, raw, reason, message))
            case Finish():
                self._close_run()
                # Calls still open at the end were cut off: never dispatched.
                for call_id, name, fragments in self._calls.values():
                    self._items.append(FailedCall(call_id, name, "".join(fragments), "truncated"))
                self._calls.clear()
                self.finish = event

    def feed_all(self, events: list[OutputEvent]) -> TurnAccumulator:
        for e in events:
            self.feed(e)
        return self

    @property
    def items(self) -> list[TurnItem]:
        self._close_run()
        return self._items

    def message(self, signer: Signer | None = None) -> Message:
        """The turn as the assistant Message a client sends back.

        Each text run and each failed call's raw text is its own Text part, as each is its own block
        (Anthropic) or item (Responses) on the wire.
        """
        parts: list[Part] = []
        for item in self.items:
            if isinstance(item, FailedCall):
                if not item.raw:
                    continue
                item = Text(item.raw)
            elif isinstance(item, Reasoning) and signer is not None:
                item = Reasoning(item.text, signer.sign_thinking(item.text))
            parts.append(item)
        return Message("assistant", tuple(parts))
