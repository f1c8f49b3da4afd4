"""One dispatched request: engine steps → stop strings → the family's parser → OutputEvents.

The hot path of the frontend. Per engine step: match stop strings (only when the request has any),
feed the text to the family's parser (the one owner of reasoning and tool parsing), count tokens,
hand the events to the caller. At the end: what the stop matcher held, the parser's `close()`, and
`Finish` with the usage the APIs report (prompt tokens, the first step's prefix-cache hits, output
and reasoning tokens).

Reasoning tokens: a step's tokens go to reasoning in proportion to the reasoning characters among
the content characters its events carry (a step may hold many tokens when the consumer lags); a
step whose text the parser held back counts for the kind of output in progress.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from agentserve.conversation import (
    Finish,
    FinishReason,
    OutputEvent,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from agentserve.frontend.logprobs import AnswerLogprobs
from agentserve.frontend.stops import StopMatcher
from agentserve.parsing.stream import OutputParser
from agentserve.worker.engine import Step


class StepSource(Protocol):
    """Engine steps of one request (a router's `DispatchedStream`); closing it aborts the request."""

    def __aiter__(self) -> AsyncIterator[Step]: ...

    async def aclose(self) -> None: ...


class Generation:
    """One request's steps → events. The caller iterates `steps()` in one task, `feed`s each step,
    stops after the step that `ended` the turn, then calls `release()` and `close()` (the tail).
    `batches()` does exactly that, one batch per step."""

    __slots__ = (
        "_discard",
        "_engine_output",
        "_in_reasoning",
        "_keep_ids",
        "_logprobs",
        "_parser",
        "_reason",
        "_steps",
        "_stops",
        "cached_tokens",
        "ended",
        "finish",
        "generated",
        "output_tokens",
        "prompt_tokens",
        "reasoning_tokens",
        "started",
        "stop_sequence",
        "stream",
    )

    def __init__(
        self,
        stream: StepSource,
        parser: OutputParser,
        *,
        prompt_tokens: int,
        starts_in_reasoning: bool = False,
        stops: tuple[str, ...] = (),
        discard_output: bool = False,
        keep_token_ids: bool = False,
        logprobs: AnswerLogprobs | None = None,
    ) -> None:
        self.stream = stream
        self._steps = stream.__aiter__()
        self._parser = parser
        self._stops = StopMatcher(stops) if stops else None
        self._discard = discard_output  # max_tokens 0: prefill (warm the cache), answer nothing
        self._keep_ids = keep_token_ids
        self._logprobs = logprobs  # the request asked for log-probabilities of the answer
        self._in_reasoning = starts_in_reasoning
        self._reason: FinishReason = "abort"  # a stream that ends without a finish step was cut off
        self._engine_output: int | None = None
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self.generated: list[int] = []  # output token ids, for the session's drift detector
        self.started = False  # the first engine step arrived (prefill is done)
        self.ended = False  # the last step was fed (finish reason or stop string): read no further
        self.stop_sequence: str | None = None
        self.finish: Finish | None = None

    async def aclose(self) -> None:
        """Stop generating (client gone): aborts the engine request. Safe from another task."""
        await self.stream.aclose()

    def steps(self) -> AsyncIterator[Step]:
        """The engine steps, to iterate in one task (the one that calls `release`)."""
        return self._steps

    async def release(self) -> None:
        """Finalise the step iterator now rather than at GC, and close the engine stream (which
        aborts the request if it still runs). Idempotent; call from the task that iterated."""
        close = getattr(self._steps, "aclose", None)  # an async generator (a `DispatchedStream`'s)
        if close is not None:
            await close()
        await self.stream.aclose()

    def feed(self, step: Step) -> list[OutputEvent]:
        """The events of one engine step (possibly none: the parser may hold text back); sets
        `ended` at the turn's last step."""
        if not self.started:
            self.started = True
            self.cached_tokens = step.cached_tokens or 0
        ids = step.token_ids
        if self._keep_ids:
            self.generated.extend(ids)
        self.output_tokens += len(ids)
        if step.finish_reason is not None:
            self.ended = True
            self._reason = step.finish_reason
            if step.usage is not None:
                self._engine_output = step.usage.output_tokens
        if self._discard:
            return []
        answer = self._logprobs  # None unless the request asked for log-probabilities
        if answer is not None and step.logprobs:
            answer.tokens(step.logprobs)
        text = step.text
        stops = self._stops
        if stops is not None:
            text, hit = stops.feed(text)
            if hit is not None:
                self.ended = True
                self.stop_sequence = hit
                self._reason = "stop"
        events = self._parser.feed(text) if text else []
        self._count(len(ids), events)
        return events if answer is None else self._attach(events)

    def close(self) -> list[OutputEvent]:
        """The end of the turn, after the last step: what the stop matcher held, the parser's
        `close()`, and `Finish` with the usage the APIs report."""
        if self._engine_output is not None and self.stop_sequence is None:
            self.output_tokens = self._engine_output
        tail: list[OutputEvent] = []
        stops = self._stops
        if not self._discard:
            if stops is not None and self.stop_sequence is None:
                held = stops.flush()
                if held:
                    tail += self._parser.feed(held)
            tail += self._parser.close()
            if self._logprobs is not None:
                tail = self._attach(tail)
        usage = Usage(
            input_tokens=self.prompt_tokens,
            output_tokens=0 if self._discard else self.output_tokens,
            cached_tokens=min(self.cached_tokens, self.prompt_tokens),
            reasoning_tokens=min(self.reasoning_tokens, self.output_tokens),
        )
        self.finish = Finish("length" if self._discard else self._reason, usage)
        tail.append(self.finish)
        return tail

    async def batches(self) -> AsyncGenerator[list[OutputEvent], None]:
        """The events of each engine step; the last batch ends with `Finish`. Raises
        `WorkerLostError` when the worker fails mid-stream."""
        try:
            async for step in self._steps:
                yield self.feed(step)
                if self.ended:
                    break
        finally:
            await self.release()
        yield self.close()

    def _attach(self, events: list[OutputEvent]) -> list[OutputEvent]:
        """Answer text with the log-probabilities of the tokens it completes (`AnswerLogprobs`)."""
        lp = self._logprobs
        assert lp is not None
        out: list[OutputEvent] = []
        for event in events:
            kind = type(event)
            if kind is TextDelta:
                assert isinstance(event, TextDelta)
                event = TextDelta(event.text, lp.content(event.text, answer=True))
            elif kind is ReasoningDelta:
                assert isinstance(event, ReasoningDelta)
                lp.content(event.text, answer=False)
            elif kind is ToolCallArgsDelta:
                assert isinstance(event, ToolCallArgsDelta)
                lp.content(event.fragment, answer=False)
            out.append(event)
        return out

    def _count(self, tokens: int, events: list[Any]) -> None:
        if not events:
            if self._in_reasoning:
                self.reasoning_tokens += tokens
            return
        reasoning = other = 0
        for event in events:
            kind = type(event)
            if kind is ReasoningDelta:
                reasoning += len(event.text)
                self._in_reasoning = True
            elif kind is TextDelta:
                other += len(event.text)
                self._in_reasoning = False
            elif kind is ToolCallArgsDelta:
                other += len(event.fragment)
            elif kind is ReasoningEnd or kind is ToolCallStart:
                self._in_reasoning = False
        if reasoning:
            self.reasoning_tokens += tokens if not other else round(tokens * reasoning / (reasoning + other))
