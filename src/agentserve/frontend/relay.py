"""One stream's engine steps → SSE frames on the wire: the per-token path of a streaming request.

Per engine step: the family's parser (through `Generation.feed`), one trace call, the API's encoder,
then one write. Frames are coalesced per stream, never by waiting:

- an engine step's frames go out in one write. A step already carries everything the engine
  produced since the consumer last asked (the sim and the network client merge pending tokens), so
  this is one write per event-loop tick per stream;
- the last step's frames wait for the turn's tail (held stop-string text, the parser's close, the
  API's closing events): the caller sends them with the end of the body, one write;
- a dispatch point ends a chunk: the frame that closes a tool call (Anthropic `content_block_stop`,
  Chat `tool_call_dispatch`, Responses `response.output_item.done`) is written before anything after
  it in the same step is encoded.

Chunks are whole frames, in order: the bytes on the wire are exactly the frames the encoder
produced, one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agentserve.conversation import Finish, OutputEvent, ToolCallEnd, Usage
from agentserve.frontend.generate import Generation
from agentserve.frontend.http import ChunkWriter
from agentserve.frontend.surfaces import StreamWriter


class StepTrace(Protocol):
    """What the relay reports to the request's telemetry (`RequestTelemetry`)."""

    def first_token(self, t: float | None = None) -> None: ...

    def on_events(
        self, events: Sequence[OutputEvent], t: float | None = None, *, output_tokens: int | None = None
    ) -> None: ...


class Relay:
    __slots__ = ("_gen", "_trace", "_write", "_writer", "events", "pending")

    def __init__(self, gen: Generation, writer: StreamWriter, trace: StepTrace, write: ChunkWriter) -> None:
        self._gen = gen
        self._writer = writer
        self._trace = trace
        self._write = write
        self.events: list[OutputEvent] = []  # the turn's events, in order
        self.pending: list[bytes] = []  # frames encoded and not written: they end the body

    async def run(self) -> None:
        """Write the opening and one chunk per engine step but the last; leave the last step's
        frames and the turn's tail in `pending`. Raises what the steps, the parser or the encoder
        raise (`WorkerLostError` when the worker fails mid-stream), with what was encoded by then
        in `pending`."""
        gen = self._gen
        writer = self._writer
        trace = self._trace
        write = self._write
        feed = writer.feed
        events = self.events
        out = self.pending
        opening = writer.opening()
        if opening:
            await write(opening)
        first = True
        try:
            async for step in gen.steps():
                batch = gen.feed(step)
                if first:  # the first engine step: prefill is done, the prompt's usage is known
                    first = False
                    trace.first_token()
                    head = writer.started(Usage(gen.prompt_tokens, 0, gen.cached_tokens))
                    if head:
                        out.append(head)
                if batch:
                    trace.on_events(batch, output_tokens=gen.output_tokens)
                    events += batch
                    for event in batch:
                        frame = feed(event)
                        if frame:
                            out.append(frame)
                            if type(event) is ToolCallEnd:  # a dispatch point ends a chunk
                                await write(b"".join(out))
                                out.clear()
                if gen.ended:
                    break  # no step follows: this one's frames go out with the tail
                if out:
                    await write(b"".join(out))
                    out.clear()
        finally:
            await gen.release()  # a stop string ended the turn: abort the engine before the tail
        tail = gen.close()
        trace.on_events(tail, output_tokens=gen.output_tokens)
        events += tail
        for event in tail:
            out.append(writer.finish(event, gen.stop_sequence) if type(event) is Finish else feed(event))
