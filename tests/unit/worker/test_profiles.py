"""Engine profiles: the format, loading by name and file, and the shipped profiles against the
measurements they come from."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from agentserve.profiler.fit import fit_timing
from agentserve.worker.profiles import (
    DEFAULT_PROFILE,
    ProfileError,
    default_timing,
    load_profile,
    profile_from_dict,
    profile_to_yaml,
    shipped_profiles,
)
from agentserve.worker.timing import LINEAR_TERMS, StepWork

H200 = "h200-qwen3-30b-a3b-pytorch"
B200 = "b200-qwen3-30b-a3b-estimate"
# Measured by this project's own bench/gpu_step_times.py on an H200 (the reference note's shapes
# fitted, other shapes held out).
H200_GRAPHS = "h200-qwen3-30b-a3b-torch-graphs"

# The measurements of shared/reference/gpu-h200.md (2026-11-27), typed here from the note's tables —
# not read from the profile file — so the shipped coefficients are checked against the source.
PREFILL_MS = {1024: 88, 4096: 164, 16384: 799, 52000: 4456, 53000: 4597}
WARM_MS = ((52000, 1000), 166)  # 1,000 new tokens on a 52,000-token cached prefix
DECODE_MS = {
    (1, 2048): 12.4, (1, 8192): 13.0, (4, 2048): 16.6, (16, 2048): 26.7, (16, 8192): 29.1,
    (64, 2048): 38.0, (64, 8192): 51.9, (256, 2048): 55.7,
}  # fmt: skip
# Mixed iteration: chunk of P on a 32,000-token context, 64 decodes at 8,192: (chunk alone, mixed).
MIXED_MS = {512: (85.2, 107.6), 2048: (237.7, 255.7), 8192: (942.6, 960.2)}
MIXED_DECODE_ALONE_MS = 51.8


def note_points() -> list[tuple[str, StepWork, float]]:
    points = [(f"prefill {n}", StepWork(prefill=[(0, n)]), ms) for n, ms in PREFILL_MS.items()]
    (start, n), ms = WARM_MS
    points.append(("warm", StepWork(prefill=[(start, n)]), ms))
    points += [(f"decode {b}x{c}", StepWork(decode=[c] * b), ms) for (b, c), ms in DECODE_MS.items()]
    points.append(("mixed decode alone", StepWork(decode=[8192] * 64), MIXED_DECODE_ALONE_MS))
    for p, (alone, mixed) in MIXED_MS.items():
        points.append((f"chunk {p}", StepWork(prefill=[(32000, p)]), alone))
        points.append((f"mixed {p}", StepWork(prefill=[(32000, p)], decode=[8192] * 64), mixed))
    return points


@pytest.mark.parametrize(("label", "work", "ms"), note_points(), ids=[p[0] for p in note_points()])
def test_the_h200_profile_predicts_every_measured_point_of_the_note_within_10_percent(
    label: str, work: StepWork, ms: float
) -> None:
    predicted = load_profile(H200).timing.step_seconds(work) * 1000
    assert abs(predicted / ms - 1) <= 0.10, f"{label}: modelled {predicted:.1f} ms, measured {ms} ms"


def test_the_h200_profile_carries_the_note_as_its_measurements() -> None:
    profile = load_profile(H200)
    assert len(profile.measurements) == len(note_points())
    assert {round(1000 * m.seconds, 1) for m in profile.measurements} == {
        round(ms, 1) for _, _, ms in note_points()
    }
    assert profile.obtained["method"] == "measured"
    assert "gpu-h200.md" in str(profile.obtained["reference"])
    assert "upper bound" in profile.description


def test_the_shipped_h200_coefficients_are_the_fit_of_its_measurements() -> None:
    profile = load_profile(H200)
    refit = fit_timing(profile.measurements, profile.timing).timing
    for name in (*LINEAR_TERMS, "prefill_floor_s"):
        shipped, fitted = getattr(profile.timing, name), getattr(refit, name)
        assert fitted == pytest.approx(shipped, rel=0.01, abs=1e-9), name


def test_the_decode_term_saturates_with_the_experts_a_batch_touches() -> None:
    timing = load_profile(H200).timing
    # Uniform top-8 routing over 128 experts: 8, 29, 83, 126, 128 experts per layer (the note).
    touched = [timing.experts_touched(b) for b in (1, 4, 16, 64, 256)]
    assert [round(t) for t in touched] == pytest.approx([8, 29, 83, 126, 128], abs=1)
    # Per-sequence cost falls as the batch grows: linear-in-B would be off by up to 25 %.
    per_seq = [timing.step_seconds(StepWork(decode=[2048] * b)) / b for b in (1, 4, 16, 64, 256)]
    assert per_seq == sorted(per_seq, reverse=True)


def test_a_prefill_chunk_inflates_the_decode_batch_as_measured() -> None:
    timing = load_profile(H200).timing
    alone = timing.step_seconds(StepWork(decode=[8192] * 64))
    for p, (_, mixed_ms) in MIXED_MS.items():
        mixed = timing.step_seconds(StepWork(prefill=[(32000, p)], decode=[8192] * 64))
        measured_inflation = mixed_ms / MIXED_DECODE_ALONE_MS
        assert mixed / alone == pytest.approx(measured_inflation, rel=0.10), p


@pytest.mark.parametrize("name", [H200, H200_GRAPHS])
def test_every_measured_profile_is_the_fit_of_its_measurements(name: str) -> None:
    profile = load_profile(name)
    assert profile.obtained["method"] == "measured" and profile.measurements
    refit = fit_timing(profile.measurements, profile.timing).timing
    for term in (*LINEAR_TERMS, "prefill_floor_s"):
        shipped, fitted = getattr(profile.timing, term), getattr(refit, term)
        assert fitted == pytest.approx(shipped, rel=0.01, abs=1e-9), term


def test_a_model_fitted_on_the_notes_shapes_predicts_held_out_shapes_of_the_same_gpu() -> None:
    # Same implementation, same card, one run: fitted on the note's 20 shapes, checked on 17 others
    # (decode up to B=512 and C=16384, mixed and chunked prefills at other positions).
    profile = load_profile(H200_GRAPHS)
    assert len(profile.held_out) >= 15
    errors = sorted(abs(e) for _, e in profile.errors(held_out=True))
    assert errors[len(errors) // 2] <= 0.05  # median (measured 2.1 %)
    assert errors[-1] <= 0.15  # worst (measured 13.5 %: decode B=32 at C=16384)
    assert max(abs(e) for _, e in profile.errors()) <= 0.05  # the fitted shapes (measured 3.9 %)
    labels = {m.label for m in profile.measurements} & {m.label for m in profile.held_out}
    assert not labels, "a held-out shape must not be fitted"


def test_shipped_profiles_load_by_name_and_say_how_they_were_obtained() -> None:
    assert {H200, B200, H200_GRAPHS} <= set(shipped_profiles())
    assert DEFAULT_PROFILE == B200
    estimate = load_profile(B200)
    assert estimate.obtained["method"] == "estimate" and "estimate" in estimate.label
    assert estimate.measurements == ()
    assert default_timing() == estimate.timing
    # The estimate keeps the coefficients the sim always had.
    t = estimate.timing
    assert (t.base_s, t.decode_per_seq_s, t.kv_read_per_token_s) == (4.0e-3, 25e-6, 17.6e-9)
    assert (t.prefill_per_token_s, t.prefill_attn_per_token_ctx_s) == (15e-6, 0.87e-9)
    assert t.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_a_profile_loads_from_a_file_and_survives_a_yaml_round_trip(tmp_path: Path) -> None:
    profile = load_profile(H200)
    path = tmp_path / "mine.yaml"
    path.write_text(profile_to_yaml(replace(profile, name="mine")))
    again = load_profile(str(path))
    assert again.name == "mine" and again.timing.name == "mine"
    for key, value in asdict(profile.timing).items():
        if key != "name":
            assert getattr(again.timing, key) == pytest.approx(value, rel=1e-3), key
    assert [(m.label, m.seconds, m.steps) for m in again.measurements] == [
        (m.label, m.seconds, m.steps) for m in profile.measurements
    ]
    assert again.hardware == profile.hardware and again.obtained == profile.obtained
    graphs = load_profile(H200_GRAPHS)
    path.write_text(profile_to_yaml(graphs))
    assert [m.steps for m in load_profile(str(path)).held_out] == [m.steps for m in graphs.held_out]


def _raw() -> dict[str, object]:
    return dict(yaml.safe_load(profile_to_yaml(load_profile(H200))))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "agentserve-profile/9"}, "format must be"),
        ({"timing": {"base_s": 0.01}}, "timing"),
        ({"timing": {**_raw()["timing"], "base_ms": 1}}, "unknown coefficients"),  # type: ignore[dict-item]
        ({"timing": {**_raw()["timing"], "base_s": -1.0}}, "must not be negative"),  # type: ignore[dict-item]
        ({"timing": {**_raw()["timing"], "base_s": "fast"}}, "must be a number"),  # type: ignore[dict-item]
        ({"obtained": {"method": "guessed"}}, "obtained.method"),
        ({"measurements": [{"label": "x", "seconds": 0.1, "steps": [{}]}]}, "computes nothing"),
        ({"measurements": [{"label": "x", "seconds": -1, "steps": [{"decode": [[1, 2]]}]}]}, "positive"),
        ({"measurements": [{"label": "x", "seconds": 1, "steps": [{"decode": "many"}]}]}, "a step has"),
        ({"extra": 1}, "unknown keys"),
        ({"held_out": {"label": "x"}}, "held_out must be a list"),
    ],
)
def test_a_malformed_profile_is_refused_with_the_reason(change: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        profile_from_dict({**_raw(), **change}, "test")


def test_an_unknown_profile_names_the_shipped_ones() -> None:
    with pytest.raises(ProfileError, match=B200):
        load_profile("no-such-profile")


def test_the_worker_and_up_run_the_sim_under_the_profile_they_are_given(tmp_path: Path) -> None:
    from agentserve.config import ConfigError, UpConfig, WorkerConfig, config_from_args
    from agentserve.frontend.up import load_pipeline, sim_engines
    from agentserve.worker.engines.sim import SimEngine
    from agentserve.worker.main import build_engine

    engine = build_engine(WorkerConfig(sim_profile=H200))
    assert isinstance(engine, SimEngine) and engine.config.timing == load_profile(H200).timing
    assert build_engine(WorkerConfig()).config.timing == load_profile(B200).timing  # type: ignore[attr-defined]
    path = tmp_path / "p.yaml"
    path.write_text(profile_to_yaml(replace(load_profile(H200), name="from-file")))
    assert build_engine(WorkerConfig(sim_profile=str(path))).config.timing.name == "from-file"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="sim_profile"):
        build_engine(WorkerConfig(sim_profile="nope"))
    import argparse

    from agentserve.config import add_config_flags

    parser = argparse.ArgumentParser()
    add_config_flags(parser, UpConfig)
    up = config_from_args(UpConfig, parser.parse_args(["--sim-profile", H200, "--workers", "1"]))
    engines = sim_engines(up, load_pipeline(up))
    assert [e.config.timing.name for e in engines.values()] == [H200]  # type: ignore[attr-defined]
