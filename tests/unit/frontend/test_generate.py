"""`Generation`: engine steps → stop strings → the family parser → events and usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from agentserve.conversation import (
    Finish,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEnd,
    Usage,
)
from agentserve.families import get_family
from agentserve.frontend.generate import Generation
from agentserve.parsing import ParserOptions, sequential_call_id
from agentserve.worker.engine import Step

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Steps:
    """A scripted engine stream: each step one text piece of one token; records being closed."""

    def __init__(
        self,
        pieces: Sequence[str],
        *,
        cached: int = 0,
        finish: str | None = "stop",
        usage: Usage | None = None,
    ) -> None:
        self.pieces = list(pieces)
        self.cached = cached
        self.finish = finish
        self.usage = usage
        self.closed = False

    def __aiter__(self) -> AsyncIterator[Step]:
        return self._steps()

    async def _steps(self) -> AsyncIterator[Step]:
        for i, piece in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            yield Step(
                [i],
                piece,
                self.cached if i == 0 else None,
                self.finish if last else None,  # type: ignore[arg-type]
                self.usage if last else None,
            )

    async def aclose(self) -> None:
        self.closed = True


def qwen3() -> object:
    return get_family("qwen3").parser(ParserOptions(id_factory=sequential_call_id))


async def collect(gen: Generation) -> list[OutputEvent]:
    out: list[OutputEvent] = []
    async for batch in gen.batches():
        out += batch
    return out


async def test_events_usage_and_reasoning_tokens() -> None:
    pieces = ["<think>", "\nplan", " it\n", "</think>", "\n\n", "Hello", " there"]
    steps = Steps(pieces, cached=32, usage=Usage(100, 7, 32))
    gen = Generation(steps, qwen3(), prompt_tokens=100)  # type: ignore[arg-type]
    events = await collect(gen)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert (reasoning, text) == ("plan it", "Hello there")
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "stop"
    assert finish.usage.input_tokens == 100 and finish.usage.cached_tokens == 32
    assert finish.usage.output_tokens == 7
    assert 2 <= finish.usage.reasoning_tokens <= 4  # the think block's tokens, not the answer's
    assert steps.closed


async def test_a_stop_string_ends_the_turn_and_aborts_the_engine() -> None:
    steps = Steps(["Hello ", "wor", "ld STOP", " never"], finish="stop")
    gen = Generation(steps, qwen3(), prompt_tokens=10, stops=("STOP",))  # type: ignore[arg-type]
    events = await collect(gen)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello world"
    assert gen.stop_sequence == "STOP" and steps.closed
    assert isinstance(events[-1], Finish) and events[-1].reason == "stop"
    assert events[-1].usage.output_tokens == 3  # the tokens received before the stop


async def test_held_stop_prefix_is_released_at_the_end() -> None:
    gen = Generation(Steps(["answer ST"]), qwen3(), prompt_tokens=5, stops=("STOP",))  # type: ignore[arg-type]
    events = await collect(gen)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "answer ST"
    assert gen.stop_sequence is None


async def test_a_stream_that_ends_without_a_finish_step_was_aborted() -> None:
    gen = Generation(Steps(["partial"], finish=None), qwen3(), prompt_tokens=5)  # type: ignore[arg-type]
    events = await collect(gen)
    assert isinstance(events[-1], Finish) and events[-1].reason == "abort"


async def test_discarded_output_is_a_prefill_only_turn() -> None:
    gen = Generation(Steps(["x"], finish="length"), qwen3(), prompt_tokens=5, discard_output=True)  # type: ignore[arg-type]
    events = await collect(gen)
    assert events == [Finish("length", Usage(5, 0, 0, 0))]


async def test_tool_calls_are_parsed_and_token_ids_kept_for_drift() -> None:
    raw = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    pieces = [raw[i : i + 5] for i in range(0, len(raw), 5)]
    gen = Generation(Steps(pieces), qwen3(), prompt_tokens=5, keep_token_ids=True)  # type: ignore[arg-type]
    events = await collect(gen)
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert [e.arguments for e in ends] == ['{"path": "."}']
    assert gen.generated == list(range(len(pieces)))
    assert gen.started and gen.cached_tokens == 0
