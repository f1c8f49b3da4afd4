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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "unit" / "prompt"), str(ROOT / "tests" / "unit" / "families")]

from fidelity_loop import VARIANTS, run  # noqa: E402
from prompt_cases import FAMILY_NAMES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", action="append", choices=FAMILY_NAMES)
    args = parser.parse_args()
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
