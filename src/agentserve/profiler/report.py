"""A profile's measurements against its model: a table (text) and a plot (PNG, needs matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentserve.worker.profiles import Measurement, Profile


def error_table(profile: Profile) -> str:
    """One row per measurement: measured, modelled, relative error; then the worst and the median;
    the same for the held-out measurements (measured, not fitted) when the profile has some."""
    lines: list[str] = []
    for held_out in (False, True):
        rows = profile.errors(held_out)
        if held_out and not rows:
            break
        title = "held out (not fitted)" if held_out else "measurement"
        width = max([len(m.label) for m, _ in rows] + [len(title)])
        lines.append(f"{title:<{width}}  {'measured':>10}  {'modelled':>10}  {'error':>7}")
        for m, err in rows:
            modelled = 1000 * m.predicted(profile.timing)
            lines.append(
                f"{m.label:<{width}}  {1000 * m.seconds:>8.1f}ms  {modelled:>8.1f}ms  {100 * err:>+6.1f}%"
            )
        if not rows:
            lines.append("no measurements (an estimate)")
            continue
        errors = sorted(abs(e) for _, e in rows)
        what = "held-out measurements" if held_out else "measurements"
        lines.append(
            f"worst |error| {100 * errors[-1]:.1f} %, median {100 * errors[len(errors) // 2]:.1f} % "
            f"over {len(rows)} {what}"
        )
    return "\n".join(lines) + "\n"


def _kind(m: Measurement) -> str:
    head = m.label.split(" ", 1)[0]
    return head if head in ("prefill", "cached", "decode", "mixed") else "other"


def plot(profile: Profile, path: Path) -> None:
    """Measured vs modelled: each measurement's time by kind, and modelled ÷ measured. Raises
    ImportError without matplotlib (`pip install matplotlib`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    markers = {"prefill": "o", "cached": "s", "decode": "^", "mixed": "D", "other": "x"}
    for kind, marker in markers.items():
        for held_out in (False, True):
            ms = [m for m in (profile.held_out if held_out else profile.measurements) if _kind(m) == kind]
            if not ms:
                continue
            measured = [1000 * m.seconds for m in ms]
            modelled = [1000 * m.predicted(profile.timing) for m in ms]
            ratios = [b / a for a, b in zip(measured, modelled, strict=True)]
            if held_out:  # hollow red markers: not fitted
                style: dict[str, Any] = {"facecolors": "none", "edgecolors": "C3"}
                left.scatter(measured, modelled, marker=marker, label=f"{kind} (held out)", **style)
                right.scatter(measured, ratios, marker=marker, **style)
            else:
                left.scatter(measured, modelled, marker=marker, label=kind, alpha=0.8)
                right.scatter(measured, ratios, marker=marker, alpha=0.8)
    everything = profile.measurements + profile.held_out
    if everything:
        lo = min(1000 * m.seconds for m in everything) * 0.8
        hi = max(1000 * m.seconds for m in everything) * 1.25
        left.plot([lo, hi], [lo, hi], "k--", linewidth=1)
    left.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="modelled (ms)")
    left.set_title(f"{profile.name}: iteration times")
    left.legend(fontsize=8)
    right.axhline(1.0, color="black", linewidth=1)
    for band in (0.9, 1.1):
        right.axhline(band, color="grey", linestyle=":", linewidth=1)
    right.set(xscale="log", xlabel="measured (ms)", ylabel="modelled ÷ measured", ylim=(0.7, 1.3))
    right.set_title("model error (dotted: ±10 %)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
