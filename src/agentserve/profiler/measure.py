"""Measure a running worker through the worker API (the I/O edge of `agentserve profile`).

Engine-agnostic: prompts are random token ids (300..4999, inside every vocabulary), outputs are
`ignore_eos` token runs, and every duration is read on the client's clock from the step stream, so
the same code profiles the sim, TensorRT-LLM or any engine behind `agentserve worker`. A sim at
`--sim-speedup S` reports `time_scale` S on /info; durations are scaled back to simulated seconds.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentserve.profiler.plan import UNIQUE_TOKENS, Plan, WorkerFacts, prefill_steps
from agentserve.worker.client import WorkerClient
from agentserve.worker.engine import GenerateRequest, Hints, SamplingParams
from agentserve.worker.profiles import Measurement
from agentserve.worker.timing import StepWork

TOKEN_IDS = (300, 5000)
RTT_SAMPLES = 15
WARMUP_STEPS = 4  # decode steps skipped before a steady window
# Hints let the sim skip decoding the prompt (real engines ignore them): profiling measures the
# engine's iterations, not the sim's text policy.
_HINTS = Hints(turn=1, last_user_message="profile", last_message="profile")


class ProfileRunError(RuntimeError):
    """The worker cannot be profiled (says why)."""


@dataclass(slots=True)
class _Trace:
    """Arrival times (perf_counter) and token counts of one stream's steps."""

    sent: float = 0.0
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cached: int = 0


async def worker_facts(client: WorkerClient) -> tuple[WorkerFacts, dict[str, object]]:
    info = await client.info()
    load = await client.load()
    scale = float(info.get("time_scale", 1.0) or 0.0)
    if scale <= 0:
        raise ProfileRunError(
            "the worker's engine does not wait (a sim at --sim-speedup 0): its times are not measurable; "
            "run it at --sim-speedup 1 (or any finite value)"
        )
    facts = WorkerFacts(
        block_size=int(info["block_size"]),
        kv_tokens=load.kv_blocks_total * int(info["block_size"]),
        max_num_tokens=int(info.get("max_num_tokens") or 8192),
        max_batch_size=int(info.get("max_batch_size") or 256),
        chunked_prefill=bool(info.get("chunked_prefill", True)),
        time_scale=scale,
    )
    return facts, info


class Profiler:
    def __init__(
        self,
        client: WorkerClient,
        facts: WorkerFacts,
        *,
        seed: int = 0,
        progress: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.client = client
        self.facts = facts
        self.rng = random.Random(seed)
        self.progress = progress
        self.rtt_s = 0.0
        self._ids = 0

    # -- the sweeps -------------------------------------------------------------------------------

    async def run(self, plan: Plan) -> list[Measurement]:
        self.rtt_s = await self._rtt()
        out: list[Measurement] = []
        done = 0

        def report(m: Measurement) -> None:
            nonlocal done
            done += 1
            out.append(m)
            self.progress(f"[{done}/{plan.size}] {m.label}: {1000 * m.seconds:.1f} ms")

        chunk = self.facts.max_num_tokens
        for n in plan.prompt_lengths:
            times = [await self._ttft(self._prompt(n)) for _ in range(plan.repeats)]
            seconds = statistics.median(t for t, _ in times)
            report(Measurement(f"prefill {n}", seconds, prefill_steps(0, n, chunk)))
        for s, n in plan.cached:
            samples = []
            for _ in range(plan.repeats):
                prefix = self._prompt(s)
                await self._ttft(prefix)  # caches the prefix
                samples.append(await self._ttft(prefix + self._prompt(n)))
            seconds = statistics.median(t for t, _ in samples)
            hit = min(c for _, c in samples)
            report(Measurement(f"cached {s} + {n} new", seconds, prefill_steps(hit, s + n, chunk)))
        for b, c in plan.decode:
            report(await self._decode(b, c, plan.decode_tokens))
        for p, s, b, c in plan.mixed:
            report(await self._mixed(p, s, b, c, plan.decode_tokens))
        return out

    async def _decode(self, batch: int, context: int, tokens: int) -> Measurement:
        prefix = self._prompt(context)
        await self._ttft(prefix)
        traces = await asyncio.gather(
            *(self._collect(prefix + self._prompt(UNIQUE_TOKENS), tokens) for _ in range(batch))
        )
        # The window opens a few steps after the last stream's first token: admitting the batch cost
        # the worker CPU time, and a sim that fell behind catches up with faster steps first.
        start = max(t.times[min(WARMUP_STEPS, len(t.times) - 1)] for t in traces)
        end = min(t.times[-1] for t in traces)
        per_step: list[float] = []
        mid: list[int] = []
        for t in traces:
            window = [(at, n) for at, n in zip(t.times, t.tokens, strict=True) if start < at <= end]
            steps = sum(n for _, n in window)
            if steps >= 2:
                last = window[-1][0]
                per_step.append((last - start) / steps)
                before = sum(n for at, n in zip(t.times, t.tokens, strict=True) if at <= start)
                mid.append(context + UNIQUE_TOKENS + before + steps // 2)
        if not per_step:
            raise ProfileRunError(
                f"decode B={batch} C={context}: the streams never decoded together (the worker admitted "
                "them in different iterations); raise its max_num_tokens or lower the batch"
            )
        seconds = statistics.median(per_step) * self.facts.time_scale
        ctx = int(statistics.median(mid))
        return Measurement(f"decode B={batch} C={context}", seconds, (StepWork(decode=(ctx,) * batch),))

    async def _mixed(
        self, chunk: int, chunk_prefix: int, batch: int, context: int, tokens: int
    ) -> Measurement:
        """A `chunk`-token prefill on a cached `chunk_prefix` while `batch` sequences decode."""
        head = self._prompt(chunk_prefix)
        await self._ttft(head)
        prefix = self._prompt(context)
        await self._ttft(prefix)
        steady = asyncio.Event()
        traces = [_Trace() for _ in range(batch)]

        def watch() -> None:  # a few decode steps after the last decoder's first token
            if all(len(t.times) >= 2 * WARMUP_STEPS for t in traces):
                steady.set()

        decoders = [
            asyncio.ensure_future(self._collect(prefix + self._prompt(UNIQUE_TOKENS), 3 * tokens, t, watch))
            for t in traces
        ]
        try:
            await asyncio.wait_for(steady.wait(), timeout=600)
        except TimeoutError as exc:
            raise ProfileRunError(f"mixed P={chunk}: the decoders never reached a steady state") from exc
        probe = await self._collect(head + self._prompt(chunk), 1)
        await asyncio.gather(*decoders)
        arrived = probe.times[0]
        gaps: list[float] = []
        ctx: list[int] = []
        for t in traces:
            # The decoder step that arrived with the chunk's first token ended the mixed iteration.
            k = min(range(1, len(t.times)), key=lambda i: abs(t.times[i] - arrived))
            gaps.append(t.times[k] - t.times[k - 1])
            ctx.append(context + UNIQUE_TOKENS + sum(t.tokens[:k]))
        seconds = statistics.median(gaps) * self.facts.time_scale
        step = StepWork(
            prefill=((probe.cached, chunk_prefix + chunk - probe.cached),),
            decode=(int(statistics.median(ctx)),) * batch,
        )
        return Measurement(
            f"mixed P={chunk} on {chunk_prefix} + {batch} decodes at {context}", seconds, (step,)
        )

    # -- one request ------------------------------------------------------------------------------

    async def _ttft(self, prompt: Sequence[int]) -> tuple[float, int]:
        """(simulated seconds to the first token, net of the round trip; cached prompt tokens)."""
        trace = await self._collect(prompt, 1)
        wall = max(trace.times[0] - trace.sent - self.rtt_s, 0.0)
        return wall * self.facts.time_scale, trace.cached

    async def _collect(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        trace: _Trace | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> _Trace:
        trace = trace if trace is not None else _Trace()
        self._ids += 1
        request = GenerateRequest(
            request_id=f"profile-{self.rng.getrandbits(48):012x}-{self._ids}",
            prompt_token_ids=list(prompt),
            sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            hints=_HINTS,
        )
        trace.sent = time.perf_counter()
        stream = await self.client.generate(request)
        try:
            async for step in stream:
                now = time.perf_counter()
                if step.cached_tokens is not None:
                    trace.cached = step.cached_tokens
                if step.token_ids:
                    trace.times.append(now)
                    trace.tokens.append(len(step.token_ids))
                    if on_step is not None:
                        on_step()
        finally:
            await stream.aclose()
        if not trace.times:
            raise ProfileRunError("the worker ended a request without a token")
        return trace

    def _prompt(self, n: int) -> list[int]:
        low, high = TOKEN_IDS
        return [self.rng.randrange(low, high) for _ in range(n)]

    async def _rtt(self) -> float:
        samples = []
        for _ in range(RTT_SAMPLES):
            began = time.perf_counter()
            await self.client.load()
            samples.append(time.perf_counter() - began)
        return statistics.median(samples)
