"""Streaming output parsers: µs per 4-character chunk, per family, against a re-parse baseline.

For every registered family (`agentserve.families.FAMILIES`) a long mixed output is built from the
family's own corpus (`tests/unit/families/corpus/<family>.yaml`): the cases with tool calls that
parse cleanly and still give twice the calls when repeated back to back are the units; their
string arguments, reasoning and text are inflated with filler words (kept only where the inflated
unit still parses to the inflated expectation), and the units are cycled until the output reaches
~1K and ~64K characters (whole units: the printed sizes are the real ones).

Measured, in the same run:
- ours: feed the output 4 characters at a time through one parser (best of several repetitions);
- re-parse: what a parser without incremental state does, on every chunk a fresh parser is fed the
  whole accumulated text and its events are diffed against those already emitted. At 64K it is
  measured on the last 200 chunks of the output only (fewer if they overrun a time budget, at
  least 20; the count is printed): each re-parses ~64K characters, the cost at that length.

Run from the repository root: `PYTHONPATH=src python bench/parsers.py [--family NAME ...]`.
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
try:
    import agentserve  # noqa: F401
except ModuleNotFoundError:  # a checkout that is not installed: use its own sources
    sys.path.insert(0, str(ROOT / "src"))

from agentserve.conversation import OutputEvent, ReasoningDelta, TextDelta, ToolCallArgsDelta  # noqa: E402
from agentserve.families import FAMILIES, Family  # noqa: E402
from agentserve.parsing import OutputParser, ParserOptions, sequential_call_id  # noqa: E402
from agentserve.parsing.events import merge_deltas, summarize  # noqa: E402

CORPUS = ROOT / "tests" / "unit" / "families" / "corpus"
CHUNK = 4
SIZES = (1_000, 64_000)
# Plain words are valid inside every format's strings, reasoning and text (no markup, no escapes).
FILLER = " lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"
INFLATE_TO = 240  # characters of filler added to each inflated string
SLICE = 256  # chunks per timed slice of a streaming run
MIN_REPEAT, MAX_REPEAT = 5, 30
_PLAIN = re.compile(r"[\w .,:/-]{3,}")  # strings safe to find and grow in raw text

# Acceptance targets (issue 2)
MEDIAN_US, MAX_US, GROWTH, SPEEDUP = 3.0, 6.0, 1.5, 10.0


def options(family: Family, starts: bool | None = None) -> ParserOptions:
    s = family.starts_in_reasoning if starts is None else starts
    return ParserOptions(starts_in_reasoning=s, id_factory=sequential_call_id)


def parse(family: Family, text: str, starts: bool) -> list[dict[str, Any]] | None:
    """The summary of `text`, or None if its events break an invariant."""
    parser = family.parser(options(family, starts))
    try:
        return summarize(merge_deltas(parser.feed(text) + parser.close()))
    except AssertionError:
        return None


def _grow(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_grow(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _grow(v, old, new) for k, v in value.items()}
    return value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def _calls(summary: list[dict[str, Any]]) -> int:
    return sum(1 for seg in summary if "call" in seg)


def units_for(family: Family) -> list[str]:
    """Corpus outputs with calls that parse cleanly and compose, each inflated where it can be."""
    path = CORPUS / f"{family.name}.yaml"
    if not path.exists():
        return []
    starts = family.starts_in_reasoning
    units: list[str] = []
    for case in yaml.safe_load(path.read_text(encoding="utf-8")):
        raw: str = case["raw"]
        if case.get("starts_in_reasoning", starts) != starts:
            continue  # the output is parsed with the family's default start state
        summary = parse(family, raw, starts)
        if summary is None or summary != case["expect"] or any("error" in s for s in summary):
            continue
        # Must compose: parsed twice back to back it gives twice the calls (start-only syntaxes don't).
        twice = parse(family, raw + "\n" + raw, starts)
        if twice is None or _calls(twice) != 2 * _calls(summary) or not _calls(summary):
            continue
        texts = {
            s for seg in summary for key in ("reasoning", "text", "args") for s in _strings(seg.get(key))
        }
        for s in sorted(texts, key=len, reverse=True):
            if not _PLAIN.fullmatch(s) or s not in raw:
                continue
            grown = s + (FILLER * (INFLATE_TO // len(FILLER) + 1))[:INFLATE_TO].rstrip()
            candidate = raw.replace(s, grown)
            if parse(family, candidate, starts) == _grow(summary, s, grown):
                raw, summary = candidate, _grow(summary, s, grown)
        units.append(raw)
    return units


def mixed_output(units: Sequence[str], size: int) -> str:
    """The units cycled, as many as bring the output closest to `size` characters (at least one)."""
    parts: list[str] = []
    length = 0
    while length < size:
        part = units[len(parts) % len(units)]
        if parts and length + len(part) + 1 - size > size - length:
            break
        parts.append(part)
        length += len(part) + 1
    return "\n".join(parts)


def chunks_of(text: str) -> list[str]:
    return [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)]


def timed_slices(family: Family, opts: ParserOptions, chunks: Sequence[str]) -> list[int]:
    """One streaming run: wall ns of each slice of SLICE chunks (the last slice includes close())."""
    times: list[int] = []
    clock = time.perf_counter_ns
    parser = family.parser(opts)
    t0 = clock()
    for k, c in enumerate(chunks, 1):
        parser.feed(c)
        if k % SLICE == 0:
            t1 = clock()
            times.append(t1 - t0)
            t0 = t1
    parser.close()
    times.append(clock() - t0)
    return times


def ours_us_per_chunk(family: Family, texts: Sequence[str], budget_ns: int) -> list[float]:
    """µs per chunk for each text, best of several streaming runs.

    The machines are shared and noisy: runs of the texts are interleaved so they see the same load,
    and "best" is taken per slice of SLICE chunks (each slice's fastest run), so one preemption
    spoils one slice of one run, not the whole 64K measurement.
    """
    opts = options(family)
    all_chunks = [chunks_of(t) for t in texts]
    best: list[list[int] | None] = [None] * len(texts)
    spent = 0
    for rep in range(MAX_REPEAT):
        for k, chunks in enumerate(all_chunks):
            gc.collect()
            gc.disable()
            times = timed_slices(family, opts, chunks)
            gc.enable()
            spent += sum(times)
            prev = best[k]
            best[k] = times if prev is None else [min(x, y) for x, y in zip(prev, times, strict=True)]
        if rep + 1 >= MIN_REPEAT and spent > budget_ns:
            break
    return [sum(b or [0]) / len(c) / 1000 for b, c in zip(best, all_chunks, strict=True)]


class ReparseParser:
    """The naive baseline: every chunk re-parses the whole accumulated text and diffs the events."""

    def __init__(self, family: Family, opts: ParserOptions, prefix: str = "") -> None:
        self._family = family
        self._opts = opts
        self._text = prefix
        self._emitted: list[OutputEvent] = merge_deltas(self._fresh().feed(prefix)) if prefix else []

    def _fresh(self) -> OutputParser:
        return self._family.parser(self._opts)

    def feed(self, chunk: str) -> list[OutputEvent]:
        self._text += chunk
        events = merge_deltas(self._fresh().feed(self._text))
        old = self._emitted
        new: list[OutputEvent] = []
        # Everything before the last emitted event is final; that one may be a delta that grew.
        k = len(old)
        if old and k <= len(events) and events[k - 1] != old[k - 1]:
            new.append(_tail(old[k - 1], events[k - 1]))
        new.extend(events[k:])
        self._emitted = events
        return new


def _tail(before: OutputEvent, after: OutputEvent) -> OutputEvent:
    if isinstance(before, TextDelta) and isinstance(after, TextDelta):
        return TextDelta(after.text[len(before.text) :])
    if isinstance(before, ReasoningDelta) and isinstance(after, ReasoningDelta):
        return ReasoningDelta(after.text[len(before.text) :])
    if isinstance(before, ToolCallArgsDelta) and isinstance(after, ToolCallArgsDelta):
        return ToolCallArgsDelta(after.index, after.fragment[len(before.fragment) :])
    return after


def reparse_ns_per_chunk(family: Family, text: str, max_chunks: int, budget_ns: int) -> tuple[float, int]:
    """Best ns per chunk of the re-parse baseline over the last chunks of `text` (count returned).

    Those chunks all cost about the same (a re-parse of ~64K characters; the first of them is the
    shortest), so the fastest is the cost without preemption, as the per-slice best is for ours.
    """
    chunks = chunks_of(text)
    count = min(max_chunks, len(chunks))
    prefix = "".join(chunks[: len(chunks) - count])
    baseline = ReparseParser(family, options(family), prefix)
    times: list[int] = []
    gc.collect()
    gc.disable()
    for c in chunks[len(chunks) - count :]:
        t0 = time.perf_counter_ns()
        baseline.feed(c)
        times.append(time.perf_counter_ns() - t0)
        if len(times) >= 20 and sum(times) > budget_ns:
            break
    gc.enable()
    return min(times), len(times)


@dataclass(frozen=True)
class Row:
    family: str
    chars: tuple[int, int]
    us_1k: float
    us_64k: float
    reparse_us_64k: float
    reparse_chunks: int
    mix: str  # what the 64K output holds: calls / reasoning segments / text segments

    @property
    def growth(self) -> float:
        return self.us_64k / self.us_1k

    @property
    def speedup(self) -> float:
        return self.reparse_us_64k / self.us_64k


def measure(family: Family) -> Row | None:
    units = units_for(family)
    if not units:
        return None
    texts = [mixed_output(units, size) for size in SIZES]
    per_chunk = ours_us_per_chunk(family, texts, 800_000_000)
    reparse_ns, reparse_chunks = reparse_ns_per_chunk(family, texts[1], 200, 1_000_000_000)
    summary = parse(family, texts[1], family.starts_in_reasoning) or []
    kinds = [next(iter(seg)) for seg in summary]
    mix = f"{kinds.count('call')}/{kinds.count('reasoning')}/{kinds.count('text')}"
    return Row(
        family.name,
        (len(texts[0]), len(texts[1])),
        per_chunk[0],
        per_chunk[1],
        reparse_ns / 1000,
        reparse_chunks,
        mix,
    )


def report(rows: Sequence[Row], skipped: Sequence[str]) -> bool:
    head = (
        f"{'family':<14} {'chars 1K/64K':>14} {'µs/chunk 1K':>12} {'µs/chunk 64K':>13} "
        f"{'64K/1K':>7} {'re-parse µs 64K':>16} {'speedup':>8}  {'64K calls/reasoning/text':>24}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.family:<14} {f'{r.chars[0]}/{r.chars[1]}':>14} {r.us_1k:>12.2f} {r.us_64k:>13.2f} "
            f"{r.growth:>7.2f} {r.reparse_us_64k:>16.0f} {r.speedup:>7.0f}×  {r.mix:>24}"
        )
    for name in skipped:
        print(f"{name:<14} (no composable corpus cases with tool calls: not measured)")
    if not rows:
        return False
    worst = [max(r.us_1k, r.us_64k) for r in rows]
    median, top = statistics.median(worst), max(worst)
    growth = max(r.growth for r in rows)
    speedup = min(r.speedup for r in rows)
    checks = [
        (f"median µs per 4-char chunk {median:.2f} <= {MEDIAN_US}", median <= MEDIAN_US),
        (f"max µs per 4-char chunk {top:.2f} <= {MAX_US}", top <= MAX_US),
        (f"worst 64K/1K per-chunk cost {growth:.2f} <= {GROWTH}", growth <= GROWTH),
        (f"least speedup over re-parse at 64K {speedup:.0f}× >= {SPEEDUP:.0f}×", speedup >= SPEEDUP),
    ]
    print()
    print("(per family the larger of its 1K and 64K per-chunk costs counts against the targets;")
    least = min(r.reparse_chunks for r in rows)
    print(f" re-parse at 64K: fastest of the last {least} or more chunks of the 64K output)")
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")
    return all(ok for _, ok in checks)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    args = ap.parse_args(argv)
    families = [f for f in FAMILIES if not args.family or f.name in args.family]
    rows: list[Row] = []
    skipped: list[str] = []
    t0 = time.perf_counter()
    for family in families:
        row = measure(family)
        if row is None:
            skipped.append(family.name)
        else:
            rows.append(row)
    report(rows, skipped)
    print(f"\n{time.perf_counter() - t0:.1f} s, {CHUNK}-character chunks, Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
