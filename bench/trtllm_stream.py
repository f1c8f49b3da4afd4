"""The TensorRT-LLM adapter's per-step cost, against reading the result directly in the same run.

    python bench/trtllm_stream.py            # 256 streams x 2000 steps
    python bench/trtllm_stream.py --quick    # smoke run

Each step of `_TrtStream` reads the next `GenerationResult` output in the consumer's own task (an
abort's grace timer cancels that read; no task or future per step), then maps it to a `Step`. The
baseline iterates the same stand-in results and does nothing else, so the difference is what the
adapter adds per token and stream. TensorRT-LLM itself spends milliseconds per iteration; the added
microseconds are printed as a share of a 10 ms decode step too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentserve.config import WorkerConfig
from agentserve.worker.engines.trtllm import TrtLlmEngine, _TrtStream


class _Out:
    __slots__ = ("finish_reason", "text_diff", "token_ids", "token_ids_diff")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.token_ids_diff: list[int] = []
        self.text_diff = ""
        self.finish_reason: str | None = None


class _Result:
    """A streaming result shaped like TensorRT-LLM's: yields itself once per token."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.outputs = [_Out()]
        self.finished = False
        self.cached_tokens = 0

    def abort(self) -> None:
        pass

    def __aiter__(self) -> AsyncIterator[_Result]:
        return self._run()

    async def _run(self) -> AsyncIterator[_Result]:
        out = self.outputs[0]
        for i in range(self.steps):
            await asyncio.sleep(0)  # one executor response per event-loop turn
            out.token_ids.append(i)
            out.token_ids_diff, out.text_diff = [i], "x"
            if i == self.steps - 1:
                out.finish_reason, self.finished = "length", True
            yield self


async def _baseline(streams: int, steps: int) -> float:
    async def one() -> None:
        async for _ in _Result(steps):
            pass

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    return time.perf_counter() - t0


async def _adapter(streams: int, steps: int) -> float:
    engine = TrtLlmEngine(WorkerConfig(engine="trtllm", model_path="/m"))

    async def one(i: int) -> None:
        stream = _TrtStream(engine, f"r{i}", _Result(steps), 100)
        engine._requests[stream.request_id] = stream
        async for _ in stream:
            pass

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(streams)))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    streams, steps = (32, 200) if args.quick else (256, 2000)
    base, adapted = [], []
    for _ in range(3):  # interleaved, best of three each (the machine is shared)
        base.append(asyncio.run(_baseline(streams, steps)))
        adapted.append(asyncio.run(_adapter(streams, steps)))
    tokens = streams * steps
    b, a = min(base), min(adapted)
    added_us = (a - b) / tokens * 1e6
    print(f"{streams} streams x {steps} steps ({tokens} tokens)")
    print(f"  baseline (read results only): {b / tokens * 1e6:7.2f} us/token")
    print(f"  adapter (_TrtStream):         {a / tokens * 1e6:7.2f} us/token   ratio {a / b:.2f}x")
    print(f"  added per token and stream:   {added_us:7.2f} us = {added_us / 10_000:.3%} of a 10 ms step")


if __name__ == "__main__":
    main()
