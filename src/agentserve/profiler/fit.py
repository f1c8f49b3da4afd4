"""Fit a timing model to measurements (pure).

Every coefficient of `TimingModel` but the launch floor enters an iteration's time linearly once the
model facts are fixed (experts per layer and per token shape the MoE term), so a fit is a
non-negative least-squares problem over the measurements, each row the sum of its iterations'
terms. Rows are weighted by 1/measured: the fit minimises relative error, so a 12 ms decode step
counts as much as a 4 s prefill.

The launch floor is not linear: an iteration that prefills takes at least `prefill_floor_s`. When a
short single-iteration prefill (under 1.5 × the shortest) is more than 10 % slower than the linear fit
predicts, the engine is launch-bound there: the floor is the slowest such measurement, the
measurements the floor dominates (under 1.5 × the floor) leave the linear fit, and the fit runs again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from agentserve.profiler.nnls import nnls
from agentserve.worker.profiles import Measurement
from agentserve.worker.timing import LINEAR_TERMS, TimingModel

FLOOR_EXCESS = 1.10  # the shortest prefill this much above the linear model: a launch floor
FLOOR_BAND = 1.5  # measurements below this multiple of the floor say nothing about the linear terms


@dataclass(frozen=True, slots=True)
class Fit:
    timing: TimingModel
    used: tuple[Measurement, ...]  # in the linear fit (the rest only set the floor)
    worst: float  # largest |relative error| over all measurements


def fit_timing(measurements: Sequence[Measurement], template: TimingModel) -> Fit:
    """The template's linear coefficients and floor refitted to `measurements`; its other fields
    (name, KV bytes, MoE shape, copy bandwidths, load time) are kept."""
    if not measurements:
        raise ValueError("no measurements to fit")
    shape = _with(replace(template, prefill_floor_s=0.0), dict.fromkeys(LINEAR_TERMS, 0.0))
    used = list(measurements)
    timing = _linear(shape, used)
    prefills = [m for m in measurements if len(m.steps) == 1 and m.steps[0].prefill]
    if prefills:
        shortest = min(m.seconds for m in prefills)
        launch_bound = [
            m.seconds
            for m in prefills
            if m.seconds < FLOOR_BAND * shortest and m.seconds > FLOOR_EXCESS * m.predicted(timing)
        ]
        if launch_bound:
            floor = max(launch_bound)
            used = [m for m in measurements if not (m in prefills and m.seconds < FLOOR_BAND * floor)]
            timing = replace(_linear(shape, used or list(measurements)), prefill_floor_s=floor)
    worst = max(abs(m.predicted(timing) / m.seconds - 1.0) for m in measurements)
    return Fit(timing, tuple(used), worst)


def _linear(shape: TimingModel, measurements: Sequence[Measurement]) -> TimingModel:
    rows: list[list[float]] = []
    targets: list[float] = []
    for m in measurements:
        row = [0.0] * len(LINEAR_TERMS)
        for step in m.steps:
            terms = shape.terms(step)
            for i, name in enumerate(LINEAR_TERMS):
                row[i] += terms[name]
        # Host-tier copies are not fitted: their known time comes off the target.
        copy = sum(
            s.onboard_tokens * shape.kv_bytes_per_token / shape.host_to_gpu_bytes_per_s for s in m.steps
        )
        rows.append([v / m.seconds for v in row])
        targets.append(max(m.seconds - copy, 0.0) / m.seconds)
    coefficients = nnls(rows, targets)
    return _with(shape, dict(zip(LINEAR_TERMS, coefficients, strict=True)))


def _with(model: TimingModel, coefficients: dict[str, float]) -> TimingModel:
    return replace(model, **coefficients)  # type: ignore[arg-type]  # float fields only (LINEAR_TERMS)
