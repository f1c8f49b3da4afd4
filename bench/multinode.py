"""One replica over two nodes, or two replicas of one node each? An agent trace on the sim's clock.

Same GPUs, same agent trace (bench/planner.py's: sessions with shared system+tools prefixes, tool loops
of growing prompts), three fleets:

- `2 × 1 node`: two workers, each the profile's replica (the baseline);
- `1 × 2 nodes (link)`: one worker tensor-parallel over two such nodes (`timing.spanning_nodes`):
  compute per GPU halved, twice the KV, every layer's all-reduces over the inter-node link —
  InfiniBand NDR and XDR.

Prints TTFT and ITL percentiles, SLA attainment and the ratios against the baseline measured in the same
run. A spanning replica decodes each step faster (lower ITL) but runs one batch instead of two, and pays
the link on every iteration; which wins depends on load and link (docs/kubernetes.md, Workers spanning
nodes). Model shape for the link cost: the profile's `model` (layers, query heads × head dim).

    PYTHONPATH=src python bench/multinode.py [--profile NAME] [--rate SESSIONS_PER_MIN] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.planner.decide import PlannerConfig  # noqa: E402
from agentserve.worker.profiles import load_profile  # noqa: E402
from agentserve.worker.timing import INTERCONNECTS, spanning_nodes  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_planner", ROOT / "bench" / "planner.py")
assert _spec is not None and _spec.loader is not None
planner_bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_planner"] = planner_bench
_spec.loader.exec_module(planner_bench)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h200-qwen3-30b-a3b-pytorch", help="one node's replica")
    ap.add_argument("--rate", type=float, default=10.0, help="new agent sessions per minute")
    ap.add_argument("--kv-blocks", type=int, default=20_000, help="KV blocks of one node's replica")
    ap.add_argument("--ttft-target", type=float, default=3.0)
    ap.add_argument("--itl-target", type=float, default=0.1)
    ap.add_argument("--quick", action="store_true", help="a 10-minute trace")
    args = ap.parse_args()

    profile = load_profile(args.profile)
    minutes = 10.0 if args.quick else 20.0
    trace = planner_bench.Trace(minutes=minutes, base_rate=args.rate, peak_rate=args.rate, waves=())
    model = profile.model
    layers = int(model.get("layers") or 0)
    hidden = int(
        model.get("hidden_size") or int(model.get("query_heads") or 0) * int(model.get("head_dim") or 0)
    )
    gpus = int((profile.hardware or {}).get("count") or 1)
    targets = (args.ttft_target, args.itl_target)
    print(
        f"profile {profile.label}: one node's replica ({gpus} GPU(s)); trace {minutes:.0f} min at "
        f"{args.rate:g} sessions/min; model {layers} layers, hidden {hidden}",
        flush=True,
    )

    def run(name: str, workers: int, timing_profile: object, kv_blocks: int) -> dict[str, float]:
        config = PlannerConfig(
            min_workers=workers,
            max_workers=workers,
            ttft_target_s=args.ttft_target,
            itl_target_s=args.itl_target,
            kv_blocks_per_worker=kv_blocks,
        )
        result = planner_bench.simulate(
            trace,
            timing_profile,
            name=name,
            fixed=workers,
            config=config,
            interval=10.0,
            progress=lambda line: print(line, flush=True),
        )
        return dict(planner_bench.report(result, targets))

    results = {"2 × 1 node": run("2 × 1 node", 2, profile, args.kv_blocks)}
    for link in ("infiniband-ndr", "infiniband-xdr"):
        timing = spanning_nodes(
            profile.timing, 2, INTERCONNECTS[link], layers=layers, hidden=hidden, gpus_per_node=gpus
        )
        results[f"1 × 2 nodes ({link})"] = run(
            f"1 × 2 nodes ({link})", 1, replace(profile, timing=timing), 2 * args.kv_blocks
        )
    base = results["2 × 1 node"]
    print()
    print(
        f"{'fleet':28} {'SLA':>6} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'ITL p90':>8}   ratios vs 2 × 1 node"
    )
    for name, r in results.items():
        ratios = (
            f"TTFT p50 ×{r['ttft_p50'] / base['ttft_p50']:.2f}, p99 ×{r['ttft_p99'] / base['ttft_p99']:.2f}, "
            f"ITL p90 ×{r['itl_p90'] / base['itl_p90']:.2f}"
        )
        print(
            f"{name:28} {100 * r['attainment']:5.1f}% {r['ttft_p50']:8.2f}s {r['ttft_p90']:6.2f}s "
            f"{r['ttft_p99']:6.2f}s {1000 * r['itl_p90']:6.0f}ms   {ratios}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
