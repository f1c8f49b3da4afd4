"""Turn `bench/gpu_step_times.py --shapes both` results into an engine profile (no GPU, no torch).

The reference note's shapes become the profile's `measurements` (fitted); the other shapes its
`held_out` measurements (not fitted: the check of how well the fitted model generalises).

    PYTHONPATH=src python bench/gpu_profile.py bench/results/gpu-step-times-h200-2026-11-27.json \
        -o src/agentserve/data/profiles/h200-qwen3-30b-a3b-torch-graphs.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.profiler.fit import fit_timing  # noqa: E402
from agentserve.profiler.report import error_table  # noqa: E402
from agentserve.worker.profiles import Profile, load_profile, profile_from_dict, profile_to_yaml  # noqa: E402

NAME = "h200-qwen3-30b-a3b-torch-graphs"
NOTE_SHAPES = 20  # `note_plan()` comes first in a `--shapes both` run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="gpu_step_times.json of a --shapes both run")
    ap.add_argument("-o", "--output", type=Path, help="profile YAML to write (default: stdout)")
    args = ap.parse_args()
    run = json.loads(args.results.read_text())
    rows = [m for m in run["measurements"] if "seconds" in m]
    # The model facts (experts, KV bytes, copy bandwidths) are the note's profile's: same card, same shape.
    facts = load_profile("h200-qwen3-30b-a3b-pytorch")
    draft = profile_from_dict(
        {
            "format": "agentserve-profile/1",
            "name": NAME,
            "description": "Qwen3-30B-A3B shape (BF16, random weights) on one H200 in plain PyTorch "
            "(grouped-GEMM experts, SDPA flash attention with native GQA; decode, chunks and mixed "
            "iterations replayed from CUDA graphs, whole prefills eager); an upper bound on a fused engine",
            "hardware": {"accelerator": run["gpu"], "count": 1},
            "engine": {
                "name": f"bench/gpu_step_times.py (moe: {run['moe_path']}; attention: {run['attention']})",
                "version": f"torch {run['torch']}",
            },
            "model": dict(facts.model),
            "obtained": {
                "method": "measured",
                "by": "bench/gpu_step_times.py --shapes both on the device lent to this task, one run, "
                "medians of 10 (5 over 500 ms); fitted to the reference note's shapes by "
                "agentserve.profiler.fit, the other shapes held out",
                "date": run["date"][:10],
                "reference": str(args.results),
            },
            "timing": {k: v for k, v in vars_of(facts.timing).items() if k != "name"},
            "measurements": [_row(m) for m in rows[:NOTE_SHAPES]],
            "held_out": [_row(m) for m in rows[NOTE_SHAPES:]],
        },
        str(args.results),
    )
    fit = fit_timing(draft.measurements, draft.timing)
    profile = Profile(**{**vars_of(draft), "timing": fit.timing})
    text = profile_to_yaml(profile)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    sys.stderr.write(error_table(profile))
    return 0


def _row(m: dict[str, object]) -> dict[str, object]:
    return {"label": f"{m['label']} ({m['mode']})", "seconds": m["seconds"], "steps": m["steps"]}


def vars_of(obj: object) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
