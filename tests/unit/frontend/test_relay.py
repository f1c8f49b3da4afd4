"""`Relay`: engine steps → SSE chunks. Coalescing joins whole frames, in order, and never waits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from agentserve.api.errors import ApiError
from agentserve.api.memory import CallMemory
from agentserve.api.responses import ResponseStore
from agentserve.api.signing import Signer
from agentserve.config import ApiName
from agentserve.conversation import Finish, OutputEvent, ToolCallEnd, Usage
from agentserve.families import get_family
from agentserve.frontend.generate import Generation
from agentserve.frontend.relay import Relay
from agentserve.frontend.surfaces import SURFACES, Context, StreamWriter
from agentserve.parsing import ParserOptions, sequential_call_id
from agentserve.worker.engine import Step

pytestmark = pytest.mark.anyio

CTX = Context(signer=Signer(b"k" * 32), memory=CallMemory(8), store=ResponseStore(8), dispatch=True)
BODIES: dict[ApiName, dict[str, Any]] = {
    "anthropic": {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "chat": {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    },
    "responses": {"model": "m", "stream": True, "input": "hi"},
}
# The frame that dispatches a call, per API.
DISPATCH = {
    "anthropic": b"event: content_block_stop",
    "chat": b"event: tool_call_dispatch",
    "responses": b"event: response.output_item.done",
}
CALL = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
# Engine steps of a qwen3 turn: single tokens, merged steps, and a call that closes mid-step.
SCRIPT = [
    "<think>",
    "\nplan",
    " it\n</think>\n\n",
    "Hello",
    " there,",
    " listing.",
    CALL[:20],
    CALL[20:] + "\nDone",
    " now.",
    " Bye",
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Steps:
    """A scripted engine stream that notes, each time the next step is asked for, how many bytes
    had been written: the relay must never wait for a step with frames still unwritten."""

    def __init__(self, pieces: Sequence[str], written: list[bytes], *, finish: str = "stop") -> None:
        self.pieces = pieces
        self.written = written
        self.finish = finish
        self.asked: list[int] = []  # bytes written when each step was asked for
        self.closed = False

    def __aiter__(self) -> AsyncIterator[Step]:
        return self._steps()

    async def _steps(self) -> AsyncIterator[Step]:
        for i, piece in enumerate(self.pieces):
            self.asked.append(sum(map(len, self.written)))
            last = i == len(self.pieces) - 1
            yield Step([i], piece, 0 if i == 0 else None, self.finish if last else None)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        self.closed = True


class SpyWriter:
    """The API's writer, recording every frame it returns with the number of engine steps asked
    for by then: the bytes of the stream written frame by frame as produced (no coalescing)."""

    def __init__(self, inner: StreamWriter, steps: Steps) -> None:
        self.inner = inner
        self.steps = steps
        self.stamped: list[tuple[int, bytes]] = []
        self.dispatches: list[bytes] = []  # the frames of each ToolCallEnd

    @property
    def frames(self) -> list[bytes]:
        return [f for _, f in self.stamped]

    def _note(self, frame: bytes) -> bytes:
        if frame:
            self.stamped.append((len(self.steps.asked), frame))
        return frame

    def opening(self) -> bytes:
        return self._note(self.inner.opening())

    def started(self, usage: Usage) -> bytes:
        return self._note(self.inner.started(usage))

    def feed(self, event: OutputEvent) -> bytes:
        frame = self._note(self.inner.feed(event))
        if type(event) is ToolCallEnd:
            self.dispatches.append(frame)
        return frame

    def finish(self, finish: Finish, stop_sequence: str | None) -> bytes:
        return self._note(self.inner.finish(finish, stop_sequence))

    def error(self, error: ApiError) -> bytes:
        return self._note(self.inner.error(error))

    def ping(self) -> bytes:
        return self._note(self.inner.ping())


class Trace:
    def __init__(self) -> None:
        self.first = 0
        self.steps: list[list[OutputEvent]] = []

    def first_token(self, t: float | None = None) -> None:
        self.first += 1

    def on_events(
        self, events: Sequence[OutputEvent], t: float | None = None, *, output_tokens: int | None = None
    ) -> None:
        self.steps.append(list(events))


async def relay(
    api: ApiName, pieces: Sequence[str], stops: tuple[str, ...] = ()
) -> tuple[Relay, SpyWriter, Steps, list[bytes], Trace]:
    written: list[bytes] = []

    async def write(chunk: bytes) -> None:
        assert chunk, "the relay writes no empty chunk"
        written.append(chunk)

    steps = Steps(pieces, written)
    surface = SURFACES[api]
    writer = SpyWriter(surface.writer(surface.decode(BODIES[api], CTX, ""), CTX, "m"), steps)
    parser = get_family("qwen3").parser(ParserOptions(id_factory=sequential_call_id))
    gen = Generation(steps, parser, prompt_tokens=8, stops=stops)
    trace = Trace()
    r = Relay(gen, writer, trace, write)
    await r.run()
    return r, writer, steps, written, trace


def boundaries(frames: Sequence[bytes]) -> set[int]:
    out, pos = {0}, 0
    for frame in frames:
        pos += len(frame)
        out.add(pos)
    return out


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_coalesced_bytes_are_the_frames_in_order(api: ApiName) -> None:
    r, writer, steps, written, trace = await relay(api, SCRIPT)
    wire = [*written, b"".join(r.pending)]
    # Byte-identical to writing each frame as it is produced.
    assert b"".join(wire) == b"".join(writer.frames)
    # Every chunk is whole frames: each boundary between chunks is a boundary between frames.
    ends = boundaries(writer.frames)
    pos = 0
    for chunk in wire:
        pos += len(chunk)
        assert pos in ends
    # Fewer writes than frames: a step's frames (and the last step's with the tail) go together.
    assert len(wire) < len(writer.frames)
    assert any(type(e) is Finish for e in r.events) and steps.closed
    assert trace.first == 1 and sum(map(len, trace.steps)) == len(r.events)


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_nothing_waits_for_the_next_step(api: ApiName) -> None:
    """A lone token goes out at once: whenever the next engine step is asked for, every frame
    produced before is already on the wire."""
    _, writer, steps, _, _ = await relay(api, SCRIPT)
    for k, written in enumerate(steps.asked):
        assert written == sum(len(f) for asked, f in writer.stamped if asked <= k)
    assert steps.asked[-1] > steps.asked[0]
    assert (steps.asked[0] > 0) is (api != "anthropic")  # Anthropic's stream opens at the first step


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_a_dispatch_point_ends_a_chunk(api: ApiName) -> None:
    """The call closes in a step that goes on with text ("Done"): the call's frames end a chunk,
    written before the text after them is encoded."""
    r, writer, _, written, _ = await relay(api, SCRIPT)
    [dispatch] = writer.dispatches
    assert DISPATCH[api] in dispatch
    [chunk] = [c for c in written if c.endswith(dispatch)]
    assert b"Done" not in chunk
    after = b"".join([*written[written.index(chunk) + 1 :], *r.pending])
    assert b"Done" in after


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_the_last_step_goes_out_with_the_tail(api: ApiName) -> None:
    r, _, _, written, _ = await relay(api, ["Hello", " world", " and bye"])
    last = b"".join(r.pending)
    assert b"bye" in last and b"bye" not in b"".join(written)
    end = {"anthropic": b"message_stop", "chat": b"[DONE]", "responses": b"response.completed"}[api]
    assert last.endswith(b"\n\n") and end in last


async def test_a_stop_string_ends_the_stream_at_its_step() -> None:
    r, _, steps, written, _ = await relay("chat", ["Hello", " wor", "ld STOP", " never"], stops=("STOP",))
    assert steps.closed and len(steps.asked) == 3  # the engine was not asked for the step after it
    assert b"never" not in b"".join([*written, *r.pending])
    assert b"ld" in b"".join(r.pending) and b'"finish_reason":"stop"' in b"".join(r.pending)
