"""Issue 18's fidelity measurement: a scripted 10-turn tool loop per family × API (the model writing
its own whitespace, the client asking for reasoning), with and without exact replay.

Prints a markdown table: append-only turns, turns whose order came back intact, turns with deviant
whitespace, and whether thinking was on whenever an effort was asked for. The loop and the in-process
server are the unit tests' (`tests/unit/prompt/fidelity_loop.py`, `api_harness.py`); this only runs
them for every combination. `PYTHONPATH=src python bench/fidelity.py [--family NAME ...]` (~20 s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "unit" / "prompt"), str(ROOT / "tests" / "unit" / "families")]

from fidelity_loop import VARIANTS, run  # noqa: E402
from prompt_cases import FAMILY_NAMES  # noqa: E402

from agentserve.prompt.pipeline import PromptPipeline, render_prompt  # noqa: E402
from agentserve.prompt.splice import Produced, splice  # noqa: E402


def cost(repeat: int = 30) -> None:
    """What exact replay adds to a request: `splice` on a ~22K-token Claude-Code-shaped next turn,
    next to rendering that prompt (fastest of `repeat`, warm piece cache, one core)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from prompt import claude_code_request, next_turn

    pipeline = PromptPipeline.for_family("qwen3")
    request = claude_code_request()
    first = render_prompt(request, pipeline)
    raw = (
        "<think>\nCheck the tree.\n</think>\n<tool_call>\n"
        '{"name": "Bash", "arguments": {"command": "git status"}}\n</tool_call><|im_end|>'
    )
    generated = pipeline.tokenizer.encode(raw)
    produced = Produced.of(first.text, first, generated, raw)
    following = next_turn(request, 0)
    timings: dict[str, float] = {"render": float("inf"), "splice": float("inf")}
    spliced = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        second = render_prompt(following, pipeline)
        t1 = time.perf_counter()
        spliced = splice(second, produced, pipeline)
        t2 = time.perf_counter()
        timings["render"] = min(timings["render"], t1 - t0)
        timings["splice"] = min(timings["splice"], t2 - t1)
    assert spliced is not None
    previous = [*first.token_ids, *generated]
    assert list(spliced.token_ids[: len(previous)]) == previous
    share = 100 * timings["splice"] / timings["render"]
    print(
        f"next turn of {len(spliced.token_ids)} tokens: render {timings['render'] * 1e3:.2f} ms, "
        f"splice {timings['splice'] * 1e3:.2f} ms ({share:.0f} % of render)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", action="append", choices=FAMILY_NAMES)
    parser.add_argument("--cost", action="store_true", help="only time splice against render")
    args = parser.parse_args()
    if args.cost:
        cost()
        return
    families = args.family or list(FAMILY_NAMES)
    print(
        "| family | API | append-only (before → with exact replay) | tokens not reused (before → with) "
        "| order kept | deviant turns | thinking on |"
    )
    print("|---|---|---|---|---|---|---|")
    totals = [0, 0, 0]
    for family in families:
        for variant in VARIANTS:
            before = run(family, variant, exact_replay=False)
            after = run(family, variant, exact_replay=True)
            totals[0] += before.append_only
            totals[1] += after.append_only
            totals[2] += after.turns
            thinking = "n/a" if after.thinking_on is None else "yes" if after.thinking_on else "NO"
            print(
                f"| {family} | {variant.name} | {before.append_only}/{before.turns} → "
                f"{after.append_only}/{after.turns} | {before.lost_tokens} → {after.lost_tokens} | "
                f"{after.order_kept}/{after.turns} | "
                f"{after.deviated}/{after.turns} | {thinking} |"
            )
    print(
        f"\nappend-only turns: {totals[0]}/{totals[2]} ({100 * totals[0] / totals[2]:.1f} %) without exact "
        f"replay, {totals[1]}/{totals[2]} ({100 * totals[1] / totals[2]:.1f} %) with it"
    )


if __name__ == "__main__":
    main()
