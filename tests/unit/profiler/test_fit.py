"""The fit recovers a timing model from measurements shaped like `agentserve profile`'s."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from agentserve.profiler.fit import fit_timing
from agentserve.profiler.plan import FULL, UNIQUE_TOKENS, prefill_steps
from agentserve.worker.profiles import Measurement, load_profile
from agentserve.worker.timing import LINEAR_TERMS, StepWork, TimingModel

H200 = load_profile("h200-qwen3-30b-a3b-pytorch").timing
B200 = load_profile("b200-qwen3-30b-a3b-estimate").timing
CHUNK = 8192


def sweep(model: TimingModel, noise: float = 0.0, seed: int = 0) -> list[Measurement]:
    """What the full plan measures on an engine that follows `model` exactly (± `noise`)."""
    rng = random.Random(seed)

    def measured(label: str, steps: tuple[StepWork, ...]) -> Measurement:
        true = sum(model.step_seconds(s) for s in steps)
        return Measurement(label, true * (1 + rng.uniform(-noise, noise)), steps)

    out = [measured(f"prefill {n}", prefill_steps(0, n, CHUNK)) for n in FULL.prompt_lengths]
    out += [measured(f"cached {s} + {n}", prefill_steps(s, s + n, CHUNK)) for s, n in FULL.cached]
    out += [
        measured(f"decode B={b} C={c}", (StepWork(decode=[c + UNIQUE_TOKENS + 24] * b),))
        for b, c in FULL.decode
    ]
    out += [
        measured(f"mixed P={p}", (StepWork(prefill=[(s, p)], decode=[c + UNIQUE_TOKENS + 40] * b),))
        for p, s, b, c in FULL.mixed
    ]
    return out


def blank(model: TimingModel) -> TimingModel:
    return replace(model, prefill_floor_s=0.0, **dict.fromkeys(LINEAR_TERMS, 0.0))


@pytest.mark.parametrize("model", [H200, B200], ids=["h200", "b200"])
def test_exact_measurements_give_back_the_model(model: TimingModel) -> None:
    fit = fit_timing(sweep(model), blank(model))
    for name in (*LINEAR_TERMS, "prefill_floor_s"):
        assert getattr(fit.timing, name) == pytest.approx(getattr(model, name), rel=1e-3, abs=1e-12), name
    assert fit.worst < 1e-6


def test_the_launch_floor_is_found_only_where_short_prefills_are_bound_by_it() -> None:
    assert fit_timing(sweep(H200), blank(H200)).timing.prefill_floor_s == pytest.approx(H200.prefill_floor_s)
    assert fit_timing(sweep(B200), blank(B200)).timing.prefill_floor_s == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_noisy_measurements_give_a_model_within_the_stated_tolerance(seed: int) -> None:
    # ±3 % per measurement (a quiet machine); the dominant terms come back within 15 %, and the
    # model predicts the true engine within 6 % on everything the sweep covers.
    fit = fit_timing(sweep(H200, noise=0.03, seed=seed), blank(H200))
    for name in ("base_s", "moe_expert_s", "kv_read_per_token_s", "prefill_per_token_s",
                 "prefill_attn_per_token_ctx_s"):  # fmt: skip
        assert getattr(fit.timing, name) == pytest.approx(getattr(H200, name), rel=0.15), name
    for m in sweep(H200):
        assert m.predicted(fit.timing) == pytest.approx(m.seconds, rel=0.06), m.label


def test_the_model_facts_of_the_template_are_kept() -> None:
    template = replace(blank(H200), kv_bytes_per_token=12345, host_to_gpu_bytes_per_s=1e9, model_load_s=7.0)
    fitted = fit_timing(sweep(H200), template).timing
    assert (fitted.kv_bytes_per_token, fitted.host_to_gpu_bytes_per_s, fitted.model_load_s) == (
        12345,
        1e9,
        7.0,
    )


def test_nothing_to_fit_is_an_error() -> None:
    with pytest.raises(ValueError):
        fit_timing([], H200)
