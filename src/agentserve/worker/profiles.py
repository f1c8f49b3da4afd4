"""Engine profiles: a timing model with what it describes, how it was obtained and its evidence.

A profile is a small YAML file (docs/worker.md, "Engine profiles"):

    format: agentserve-profile/1
    name: h200-qwen3-30b-a3b-pytorch
    description: one line
    hardware: {accelerator: NVIDIA H200, count: 1, host_link: PCIe gen5 x16}
    engine: {name: pytorch, version: ...}
    model: {name: Qwen3-30B-A3B, dtype: bf16, ...}
    obtained: {method: measured | estimate, by: ..., date: ..., reference: ...}
    timing: {base_s: ..., ...}           # the TimingModel's fields except its name
    measurements:                        # what the timing was fitted to (measured profiles)
      - label: decode B=64 C=8192
        seconds: 0.0519
        steps: [{decode: [[64, 8192]]}]  # one iteration: 64 sequences at context 8192
      - label: prefill 16384 in 2 chunks
        seconds: 0.799
        steps: [{prefill: [[0, 8192]]}, {prefill: [[8192, 8192]]}]
    held_out: []                         # measured like the above but not fitted: the model's check

Shipped profiles live in `agentserve/data/profiles/<name>.yaml` and load by name; any other file
loads by path. The sim runs under one (`--sim-profile`), the planner predicts with one
(`agentserve.planner`), and `agentserve profile` writes one from a live worker.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from agentserve.worker.timing import StepWork, TimingModel

FORMAT = "agentserve-profile/1"
DEFAULT_PROFILE = "b200-qwen3-30b-a3b-estimate"
METHODS = ("measured", "estimate")

Facts = Mapping[str, str | int | float]


class ProfileError(ValueError):
    """A profile that cannot be read or is not well formed (says which and where)."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured duration and the iterations it spans (a chunked prefill spans several)."""

    label: str
    seconds: float
    steps: tuple[StepWork, ...]

    def predicted(self, timing: TimingModel) -> float:
        return sum(timing.step_seconds(step) for step in self.steps)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    timing: TimingModel
    obtained: Facts
    hardware: Facts = field(default_factory=dict)
    engine: Facts = field(default_factory=dict)
    model: Facts = field(default_factory=dict)
    measurements: tuple[Measurement, ...] = ()
    held_out: tuple[Measurement, ...] = ()  # measured, not fitted: how well the model generalises

    @property
    def label(self) -> str:
        """How benchmarks name the profile they ran under: name (method)."""
        return f"{self.name} ({self.obtained.get('method', '?')})"

    def errors(self, held_out: bool = False) -> list[tuple[Measurement, float]]:
        """Each measurement (or held-out one) with the model's relative error on it (predicted /
        measured − 1)."""
        chosen = self.held_out if held_out else self.measurements
        return [(m, m.predicted(self.timing) / m.seconds - 1.0) for m in chosen]


# -- YAML -------------------------------------------------------------------------------------------

_TIMING_FIELDS = {f.name: f for f in fields(TimingModel) if f.name != "name"}


def profile_from_dict(data: object, where: str = "profile") -> Profile:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: a profile is a mapping (format: {FORMAT})")
    if data.get("format") != FORMAT:
        raise ProfileError(f"{where}: format must be {FORMAT!r}, not {data.get('format')!r}")
    known = {
        "format",
        "name",
        "description",
        "hardware",
        "engine",
        "model",
        "obtained",
        "timing",
        "measurements",
        "held_out",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown keys {unknown} (known: {sorted(known)})")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{where}: name must be a non-empty string")
    obtained = _facts(data.get("obtained"), f"{where}: obtained")
    if obtained.get("method") not in METHODS:
        raise ProfileError(f"{where}: obtained.method must be one of {list(METHODS)}")
    raw_timing = data.get("timing")
    if not isinstance(raw_timing, Mapping):
        raise ProfileError(f"{where}: timing must be a mapping of coefficients")
    unknown = sorted(set(raw_timing) - set(_TIMING_FIELDS))
    if unknown:
        raise ProfileError(
            f"{where}: timing: unknown coefficients {unknown} (known: {sorted(_TIMING_FIELDS)})"
        )
    values: dict[str, Any] = {}
    for key, value in raw_timing.items():
        want = int if _TIMING_FIELDS[key].type in ("int", int) else float
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{where}: timing.{key} must be a number")
        values[key] = want(value)
    try:
        timing = TimingModel(name=name, **values)
    except TypeError as exc:  # a required coefficient is missing
        raise ProfileError(f"{where}: timing: {exc}") from exc
    except ValueError as exc:
        raise ProfileError(f"{where}: {exc}") from exc
    measurements = _measurements(data.get("measurements"), f"{where}: measurements")
    held_out = _measurements(data.get("held_out"), f"{where}: held_out")
    return Profile(
        name=name,
        description=str(data.get("description", "")),
        timing=timing,
        obtained=obtained,
        hardware=_facts(data.get("hardware"), f"{where}: hardware"),
        engine=_facts(data.get("engine"), f"{where}: engine"),
        model=_facts(data.get("model"), f"{where}: model"),
        measurements=measurements,
        held_out=held_out,
    )


def _measurements(value: object, where: str) -> tuple[Measurement, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ProfileError(f"{where} must be a list")
    return tuple(_measurement(m, f"{where}[{i}]") for i, m in enumerate(value))


def _facts(value: object, where: str) -> dict[str, str | int | float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in value.items()
    ):
        raise ProfileError(f"{where} must map names to strings or numbers")
    return dict(value)


def _measurement(value: object, where: str) -> Measurement:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where} must be a mapping with label, seconds and steps")
    seconds = value.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ProfileError(f"{where}: seconds must be a positive number")
    steps = value.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ProfileError(f"{where}: steps must be a non-empty list of iterations")
    return Measurement(str(value.get("label", "")), float(seconds), tuple(_step(s, where) for s in steps))


def _step(value: object, where: str) -> StepWork:
    if not isinstance(value, Mapping) or set(value) - {"prefill", "decode", "onboard_tokens"}:
        raise ProfileError(f"{where}: a step has prefill [[start, n], ...], decode [[count, context], ...]")
    try:
        prefill = tuple((int(s), int(n)) for s, n in value.get("prefill") or [])
        decode = tuple(int(c) for count, c in value.get("decode") or [] for _ in range(int(count)))
        onboard = int(value.get("onboard_tokens") or 0)
    except (TypeError, ValueError) as exc:
        raise ProfileError(
            f"{where}: a step has prefill [[start, n], ...], decode [[count, context], ...]"
        ) from exc
    step = StepWork(prefill, decode, onboard)
    if step.empty:
        raise ProfileError(f"{where}: a step computes nothing")
    return step


def step_to_dict(step: StepWork) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if step.prefill:
        out["prefill"] = [[start, n] for start, n in step.prefill]
    if step.decode:
        groups: list[list[int]] = []
        for context in step.decode:  # runs of one context → [count, context]
            if groups and groups[-1][1] == context:
                groups[-1][0] += 1
            else:
                groups.append([1, context])
        out["decode"] = groups
    if step.onboard_tokens:
        out["onboard_tokens"] = step.onboard_tokens
    return out


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    timing = {k: v for k, v in asdict(profile.timing).items() if k != "name"}
    return {
        "format": FORMAT,
        "name": profile.name,
        "description": profile.description,
        "hardware": dict(profile.hardware),
        "engine": dict(profile.engine),
        "model": dict(profile.model),
        "obtained": dict(profile.obtained),
        "timing": {k: _round(v) for k, v in timing.items()},
        "measurements": [_measurement_dict(m) for m in profile.measurements],
        **({"held_out": [_measurement_dict(m) for m in profile.held_out]} if profile.held_out else {}),
    }


def _measurement_dict(m: Measurement) -> dict[str, Any]:
    return {"label": m.label, "seconds": _round(m.seconds), "steps": [step_to_dict(s) for s in m.steps]}


def _round(value: float | int) -> float | int:
    return value if isinstance(value, int) else float(f"{value:.4g}")


class _Flow(dict[str, Any]):
    """A mapping dumped on one line (a measurement)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)


def profile_to_yaml(profile: Profile) -> str:
    """The profile as YAML, one line per measurement."""
    data = profile_to_dict(profile)
    for key in ("measurements", "held_out"):
        if key in data:
            data[key] = [_Flow(m) for m in data[key]]
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=110)


# -- loading ----------------------------------------------------------------------------------------


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with agentserve."""
    root = resources.files("agentserve") / "data" / "profiles"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


@functools.cache
def _shipped(name: str) -> Profile:
    resource = resources.files("agentserve") / "data" / "profiles" / f"{name}.yaml"
    return profile_from_dict(yaml.safe_load(resource.read_text()), f"profile {name}")


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name, else a profile file by path (ProfileError says which exist)."""
    if name_or_path in shipped_profiles():
        return _shipped(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ProfileError(
            f"{name_or_path!r} is neither a shipped profile ({', '.join(shipped_profiles())}) nor a file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc
    return profile_from_dict(data, str(path))


def default_timing() -> TimingModel:
    return load_profile(DEFAULT_PROFILE).timing
