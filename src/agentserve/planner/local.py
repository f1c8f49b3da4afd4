"""The planner over in-process sim workers (`agentserve up --autoscale MIN:MAX`): the I/O edge.

Every interval it reads each engine's `Load` (counters since start, running and waiting requests,
KV blocks in use and retained for sessions), turns the counters' growth since the last reading into
the demand (`Demand`: requests finished per second, their uncached and cached prompt tokens, output
tokens), calls `decide`, and applies the decision: new sim workers start with the profile's model
load time before the router sees them; the workers `choose_removals` picks leave the router at once
and stop once their running requests end. Decisions go to the log and to `/metrics`.

With the frontend's metrics (`FrontendReadings`) it also reads the window's observed TTFT and ITL
(p90 of the requests finished since the last reading, from the histograms' bucket growth), new
sessions per second and turns per session, so the model is corrected by what clients saw and a wave
of new sessions scales up before their turns pile up.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import Counter, Histogram

from agentserve.eventloop import cancel_and_wait
from agentserve.frontend.backend import EngineBackend
from agentserve.planner.decide import Decision, PlannerConfig, Sample, WorkerState, choose_removals, decide
from agentserve.planner.metrics import PlannerMetrics
from agentserve.planner.readings import Buckets, Reading, SampleBuilder, session_blocks
from agentserve.telemetry.metrics import FrontendMetrics
from agentserve.worker.engine import Engine, Load
from agentserve.worker.timing import TimingModel

log = logging.getLogger("agentserve.planner")
HISTORY = 720  # samples kept (an hour at 5 s)


class FrontendReadings:
    """What the planner reads from the frontend's own metrics (same process)."""

    def __init__(self, metrics: FrontendMetrics) -> None:
        self.metrics = metrics

    def read(self) -> Reading:
        m = self.metrics
        return Reading(_buckets(m.ttft), _buckets(m.itl), _total(m.requests), _total(m.session_starts))


def _buckets(histogram: Histogram) -> Buckets:
    """A labelled histogram's buckets summed over its label sets."""
    summed: dict[float, float] = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                summed[le] = summed.get(le, 0.0) + sample.value
    return sorted(summed.items())


def _total(counter: Counter) -> float:
    """A labelled counter's total over its label sets."""
    return float(sum(s.value for f in counter.collect() for s in f.samples if s.name.endswith("_total")))


class LocalPlanner:
    def __init__(
        self,
        backend: EngineBackend,
        make_engine: Callable[[], Engine],
        config: PlannerConfig,
        timing: TimingModel,
        *,
        interval_s: float = 5.0,
        metrics: PlannerMetrics | None = None,
        time_scale: float = 1.0,
        frontend: FrontendReadings | None = None,
    ) -> None:
        """`interval_s` and every duration the planner reasons about (its config's delay, the demand
        per second) are on the engines' clock: a sim at `--sim-speedup S` runs `time_scale` S, so
        the planner wakes every `interval_s / S` wall seconds and reads time as wall × S."""
        self.backend = backend
        self.make_engine = make_engine
        self.config = config
        self.timing = timing
        self.interval_s = interval_s
        self.metrics = metrics
        if not 0 < time_scale < float("inf"):
            raise ValueError("the planner needs engines that keep time (a finite, positive time scale)")
        self.time_scale = time_scale
        self.frontend = frontend
        self.readings = SampleBuilder(interval_s, time_scale)
        self.readings.prime(frontend.read() if frontend is not None else None)
        self.history: list[Sample] = []
        self.decisions: list[Decision] = []
        self.desired = len(backend.engines)
        self._loading: set[str] = set()
        self._draining: set[str] = set()
        self._names = itertools.count(len(backend.engines))
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval_s / self.time_scale)
                await self.step()
        finally:
            await cancel_and_wait(self._tasks)

    async def step(self) -> Decision:
        sample = self.sample()
        self.history = [*self.history[-(HISTORY - 1) :], sample]
        decision = decide(
            self.history, self.config, self.timing, current=self.desired, previous=self.decisions
        )
        self.decisions = [*self.decisions[-(HISTORY - 1) :], decision]
        if decision.desired != self.desired:
            log.info(
                "planner: %d -> %d workers (%s; predicted TTFT %.0f ms, ITL %.0f ms)",
                self.desired,
                decision.desired,
                decision.reason,
                decision.predicted.ttft_s * 1e3,
                decision.predicted.itl_s * 1e3,
            )
        self.desired = decision.desired
        self.apply(decision)
        self._export(decision)
        return decision

    # -- reading ----------------------------------------------------------------------------------

    def serving(self) -> list[str]:
        return [w for w in self.backend.engines if w not in self._loading and w not in self._draining]

    def sample(self) -> Sample:
        now = time.monotonic() * self.time_scale
        loads = {w: e.load() for w, e in self.backend.engines.items()}
        frontend = self.frontend.read() if self.frontend is not None else None
        return self.readings.build(now, loads, len(self.serving()), frontend=frontend)

    # -- acting -----------------------------------------------------------------------------------

    def apply(self, decision: Decision) -> None:
        serving = self.serving()
        have = len(serving) + len(self._loading)
        if decision.desired > have:
            for _ in range(decision.desired - have):
                self._spawn(self._add(f"sim-{next(self._names)}"))
        elif decision.desired < len(serving):
            loads: dict[str, Load] = {w: self.backend.engines[w].load() for w in serving}
            states = [WorkerState(w, session_blocks(x), x.running + x.waiting) for w, x in loads.items()]
            for worker in choose_removals(states, len(serving) - decision.desired):
                self._spawn(self._remove(worker))

    async def _add(self, worker: str) -> None:
        self._loading.add(worker)
        try:
            await self.backend.add_engine(worker, self.make_engine())
        finally:
            self._loading.discard(worker)
        log.info("planner: %s is ready", worker)

    async def _remove(self, worker: str) -> None:
        self._draining.add(worker)
        try:
            await self.backend.remove_engine(worker)
        finally:
            self._draining.discard(worker)
        log.info("planner: %s drained and stopped", worker)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _export(self, decision: Decision) -> None:
        if self.metrics is not None:
            self.metrics.export(
                decision,
                ready=len(self.serving()),
                loading=len(self._loading),
                draining=len(self._draining),
            )
