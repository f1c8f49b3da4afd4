"""Shared test helpers: OutputEvent builders, an SSE parser, and SDK clients over a mock transport."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import anthropic
import httpx2
import openai

from agentserve.conversation import (
    Finish,
    FinishReason,
    OutputEvent,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
    Usage,
)


def chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [text]


def turn(
    *segments: tuple[Any, ...],
    finish: FinishReason = "stop",
    usage: Usage | None = None,
    size: int = 3,
    finished: bool = True,
) -> list[OutputEvent]:
    """OutputEvents for a turn written as segments:

    ("r", text) reasoning segment, ("t", text) text, ("call", id, name, args) a dispatched call,
    ("bad", id, name, partial_args, raw) a call that fails, ("cut", id, name, partial_args) a call still
    open at the end. Deltas are split into `size`-character chunks.
    """
    out: list[OutputEvent] = []
    index = 0
    for seg in segments:
        kind = seg[0]
        if kind == "r":
            out += [ReasoningDelta(c) for c in chunks(seg[1], size)] + [ReasoningEnd()]
        elif kind == "t":
            out += [TextDelta(c) for c in chunks(seg[1], size)]
        elif kind in ("call", "bad", "cut"):
            out.append(ToolCallStart(index, seg[1], seg[2]))
            out += [ToolCallArgsDelta(index, c) for c in chunks(seg[3], size)]
            if kind == "call":
                out.append(ToolCallEnd(index, seg[3]))
            elif kind == "bad":
                out.append(ToolCallError(index, "malformed", seg[4], "bad json"))
            index += 1
        else:
            raise ValueError(kind)
    if finished:
        out.append(Finish(finish, usage or Usage(100, 20, 60, 5)))
    return out


def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) per frame; data "[DONE]" stays a string."""
    frames: list[tuple[str | None, Any]] = []
    text = raw.decode("utf-8")
    assert text.endswith("\n\n") or not text, "every frame ends with a blank line"
    for block in text.split("\n\n"):
        if not block:
            continue
        name = None
        data_lines = []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data_lines.append(value)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        if not data_lines:
            continue
        payload = "\n".join(data_lines)
        frames.append((name, payload if payload == "[DONE]" else json.loads(payload)))
    return frames


Handler = Callable[[httpx2.Request], httpx2.Response]


class Recorder:
    """A mock transport handler that answers with canned bodies and keeps the requests' JSON."""

    def __init__(self, *bodies: bytes | dict[str, Any], status: int = 200) -> None:
        self.bodies = list(bodies)
        self.status = status
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(json.loads(request.content) if request.content else {})
        self.headers.append(dict(request.headers))
        body = self.bodies.pop(0) if self.bodies else b""
        if isinstance(body, dict):
            return httpx2.Response(self.status, json=body)
        return httpx2.Response(
            self.status, content=body, headers={"content-type": "text/event-stream; charset=utf-8"}
        )


def anthropic_client(handler: Handler) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://agentserve.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def openai_client(handler: Handler) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="test",
        base_url="http://agentserve.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def encode_all(encoder: Any, events: Iterable[OutputEvent]) -> bytes:
    return b"".join(encoder.feed(e) for e in events)
