"""Constrained decoding's costs (issue 22), each against a baseline taken in the same run.

    PYTHONPATH=src python bench/constrained.py            # full run (~1 min)
    PYTHONPATH=src python bench/constrained.py --quick    # smoke run

1. **Compile** (`constraints.engine.GrammarEngine.check`): per tool schema of a Claude-Code-shaped
   tool list and per hypothesis-generated schema, the grammar of a request forcing that tool (qwen3
   syntax), compiled cold (a fresh engine, its tokenizer built beforehand) and again (the cache);
   p50 / p90 / max ms. Target: p50 ≤ 50 ms cold, ~0 cached.
2. **Mask cost in the sim worker**: a zero-time `SimEngine`, N concurrent requests (1 / 64 / 256) of
   the same output length, CPU per generated token with and without a constraint, same run:
   `follow` — the script obeys the grammar (tool_choice required, the script's own call: its tokens
   are validated and consumed in bulk, no mask is computed); `steer` — the script is prose and the
   grammar forces a call (the call's syntax comes from llguidance's forced tokens and bytes, a mask
   only where a token must be chosen, the prose goes on inside the thought or the argument); each
   with the sim's memo of steered plans off (`uncached`: every request steered anew) and on
   (`memoized`: the default; a prose request draws seeded choices, so its plan is its own). Then
   the steering alone (`constrained_plan` per request, memo off): µs per output token and vocabulary
   masks per request. Target: the added CPU ≤ 5 % of the sim's per-token CPU at 64 streams.
3. **End to end**: `agentserve up`'s app in process (frontend, router, 2 zero-time sim workers, via
   httpx's ASGI transport), N concurrent Chat requests, tokens/s with `tool_choice: required` vs
   `auto` on the same script, the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.api.options import GenerationOptions, ToolChoice  # noqa: E402
from agentserve.constraints.build import build  # noqa: E402
from agentserve.constraints.engine import GrammarEngine  # noqa: E402
from agentserve.conversation import ToolSpec  # noqa: E402
from agentserve.families import get_family  # noqa: E402
from agentserve.families.grammar import Markers  # noqa: E402
from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER, HFTokenizer  # noqa: E402

TOKENIZER = HFTokenizer.from_file(EMBEDDED_TOKENIZER)
FAMILY = get_family("qwen3")
EOS = (TOKENIZER.encode("<|im_end|>")[0],)


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


S = {"type": "string"}
# The shapes of a coding agent's tools (names and field types as such harnesses send them).
AGENT_TOOLS: dict[str, dict[str, Any]] = {
    "Bash": _obj(
        {"command": S, "timeout": {"type": "number", "maximum": 600000}, "description": S,
         "run_in_background": {"type": "boolean"}}, ["command"]),
    "Read": _obj({"file_path": S, "offset": {"type": "number"}, "limit": {"type": "number"}}, ["file_path"]),
    "Write": _obj({"file_path": S, "content": S}, ["file_path", "content"]),
    "Edit": _obj({"file_path": S, "old_string": S, "new_string": S, "replace_all": {"type": "boolean"}},
                 ["file_path", "old_string", "new_string"]),
    "MultiEdit": _obj({"file_path": S, "edits": {"type": "array", "minItems": 1, "items": _obj(
        {"old_string": S, "new_string": S, "replace_all": {"type": "boolean"}},
        ["old_string", "new_string"])}}, ["file_path", "edits"]),
    "Glob": _obj({"pattern": S, "path": S}, ["pattern"]),
    "Grep": _obj({"pattern": S, "path": S, "glob": S, "output_mode": {"type": "string", "enum": [
        "content", "files_with_matches", "count"]}, "-i": {"type": "boolean"}, "-n": {"type": "boolean"},
        "head_limit": {"type": "number"}, "multiline": {"type": "boolean"}}, ["pattern"]),
    "Task": _obj({"description": S, "prompt": S, "subagent_type": S},
                 ["description", "prompt", "subagent_type"]),
    "TodoWrite": _obj({"todos": {"type": "array", "items": _obj(
        {"content": {"type": "string", "minLength": 1}, "status": {"type": "string", "enum": [
            "pending", "in_progress", "completed"]}, "activeForm": {"type": "string", "minLength": 1}},
        ["content", "status", "activeForm"])}}, ["todos"]),
    "WebFetch": _obj({"url": {"type": "string", "format": "uri"}, "prompt": S}, ["url", "prompt"]),
    "WebSearch": _obj({"query": {"type": "string", "minLength": 2}, "allowed_domains": {
        "type": "array", "items": S}, "blocked_domains": {"type": "array", "items": S}}, ["query"]),
    "NotebookEdit": _obj({"notebook_path": S, "cell_id": S, "new_source": S, "cell_type": {
        "type": "string", "enum": ["code", "markdown"]}, "edit_mode": {"type": "string", "enum": [
            "replace", "insert", "delete"]}}, ["notebook_path", "new_source"]),
    "BashOutput": _obj({"bash_id": S, "filter": S}, ["bash_id"]),
    "KillShell": _obj({"shell_id": S}, ["shell_id"]),
    "ExitPlanMode": _obj({"plan": S}, ["plan"]),
    "SlashCommand": _obj({"command": S}, ["command"]),
}  # fmt: skip


def generated_schemas(count: int, seed: int) -> list[dict[str, Any]]:
    """Hypothesis-generated object schemas (the property test's strategy, tests/unit/constraints)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    sys.path.insert(0, str(ROOT / "tests" / "unit" / "constraints"))
    from test_constraints import SCHEMAS

    out: list[dict[str, Any]] = []

    @settings(max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(SCHEMAS)
    def collect(schema: dict[str, Any]) -> None:
        out.append(schema)

    random.seed(seed)
    collect()
    _ = st  # the strategy module is the test's; nothing else is drawn here
    return out[:count]


def named_grammar(name: str, schema: dict[str, Any], markers: Markers) -> str:
    tools = (ToolSpec(name, "", schema),)
    options = GenerationOptions("m", tool_choice=ToolChoice("named", name))
    constraint = build(options, tools, FAMILY.grammar, markers, family="qwen3")
    assert constraint is not None
    return constraint.grammar


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def compile_times(label: str, schemas: list[tuple[str, dict[str, Any]]]) -> None:
    tokenizer_json = TOKENIZER.to_json()
    probe = GrammarEngine(tokenizer_json)
    assert FAMILY.grammar is not None
    markers = Markers(probe.specials(FAMILY.grammar.marker_strings))
    cold: list[float] = []
    cached: list[float] = []
    failed = 0
    for name, schema in schemas:
        grammar = named_grammar(name, schema, markers)
        engine = GrammarEngine(tokenizer_json)
        engine.tokenizer(EOS)  # built once per deployment, not per schema
        t0 = time.perf_counter()
        error = engine.check(grammar, EOS)
        t1 = time.perf_counter()
        engine.matcher(grammar, EOS) if error is None else None
        t2 = time.perf_counter()
        failed += error is not None
        cold.append((t1 - t0) * 1000)
        cached.append((t2 - t1) * 1000)
    print(
        f"  {label:<34} n={len(schemas):4}  cold p50 {statistics.median(cold):6.2f} ms  p90 "
        f"{pct(cold, 0.9):6.2f}  max {max(cold):7.2f}   cached p50 {statistics.median(cached) * 1000:5.1f} µs"
        f"  (refused: {failed})"
    )


# -- 2. the sim worker ------------------------------------------------------------------------------


async def sim_cpu(streams: int, tokens: int, mode: str, constrained: bool, memo: bool) -> tuple[float, int]:
    """CPU µs per generated token, and the tokens generated, for N concurrent sim requests (after one
    warm-up request: the grammar is compiled and the tokenizer built, as in a running worker).
    Every prompt has its own length (its own seed). `memo` False: the sim's memo of steered plans
    is off, so every request is steered anew (the per-token cost of the masks themselves)."""
    from agentserve.worker import constrained as steering

    saved = steering.PLAN_CACHE
    steering.PLAN_CACHE = saved if memo else 0
    steering._plans.clear()
    try:
        return await _sim_cpu(streams, tokens, mode, constrained)
    finally:
        steering.PLAN_CACHE = saved


async def _sim_cpu(streams: int, tokens: int, mode: str, constrained: bool) -> tuple[float, int]:
    from agentserve.worker.engine import GenerateRequest, SamplingParams
    from agentserve.worker.engines.sim import SimConfig, SimEngine
    from agentserve.worker.outputs import OutputContext

    arguments = {"command": " ".join(["word"] * (tokens // 2))}
    call = f'<tool_call>\n{{"name": "Bash", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    prose = " ".join(["word"] * tokens)
    script = call if mode == "follow" else prose

    class Fixed:
        def respond(self, ctx: OutputContext) -> str:
            return script

    engine = SimEngine(SimConfig(speedup=0), TOKENIZER, Fixed())
    constraint = None
    if constrained:
        assert FAMILY.grammar is not None
        markers = Markers(GrammarEngine(TOKENIZER.to_json()).specials(FAMILY.grammar.marker_strings))
        tools = (ToolSpec("Bash", "", AGENT_TOOLS["Bash"]),)
        constraint = build(
            GenerationOptions("m", tool_choice=ToolChoice("required")), tools, FAMILY.grammar, markers,
            family="qwen3",
        )  # fmt: skip
    await engine.start()
    sampling = SamplingParams(max_tokens=tokens + 64, stop_token_ids=EOS, include_stop=True)
    prompts = [[1000 + (i * 7919 + j) % 4000 for j in range(64 + i)] for i in range(streams)]

    async def one(i: int, prompt: list[int]) -> int:
        request = GenerateRequest(f"r{i}", prompt, sampling, constraint=constraint)
        return sum([len(s.token_ids) async for s in engine.generate(request)])

    await one(-1, [999] * 32)  # warm-up
    t0 = time.process_time()
    counts = await asyncio.gather(*(one(i, prompts[i]) for i in range(streams)))
    cpu = time.process_time() - t0
    await engine.stop()
    total = sum(counts)
    return cpu * 1e6 / max(total, 1), total


def steering_alone(mode: str, tokens: int, requests: int) -> tuple[float, float, float]:
    """µs per output token of `constrained_plan` (memo off), masks and seeded draws per request."""
    from agentserve.worker import constrained as steering
    from agentserve.worker.engine import SamplingParams
    from agentserve.worker.tokenizer import token_pieces

    assert FAMILY.grammar is not None
    engine = steering.grammar_engine(TOKENIZER)
    markers = Markers(engine.specials(FAMILY.grammar.marker_strings))
    tools = (ToolSpec("Bash", "", AGENT_TOOLS["Bash"]),)
    options = GenerationOptions("m", tool_choice=ToolChoice("required"))
    constraint = build(options, tools, FAMILY.grammar, markers, family="qwen3")
    assert constraint is not None
    arguments = {"command": " ".join(["word"] * (tokens // 2))}
    call = f'<tool_call>\n{{"name": "Bash", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    ids = TOKENIZER.encode(call if mode == "follow" else " ".join(["word"] * tokens))
    pieces = token_pieces(TOKENIZER, ids)
    sampling = SamplingParams(max_tokens=tokens + 64, stop_token_ids=EOS, include_stop=True)
    saved, steering.PLAN_CACHE = steering.PLAN_CACHE, 0
    steering._plans.clear()
    try:
        steering.constrained_plan(
            TOKENIZER, constraint, script=ids, pieces=pieces, sampling=sampling, need=tokens + 64, seed=0
        )  # warm-up
        emitted = 0
        t0 = time.process_time()
        for seed in range(requests):
            plan = steering.constrained_plan(
                TOKENIZER, constraint, script=ids, pieces=pieces, sampling=sampling, need=tokens + 64,
                seed=seed,
            )  # fmt: skip
            emitted += len(plan.token_ids)
        cpu = time.process_time() - t0
    finally:
        steering.PLAN_CACHE = saved
    masks = draws = 0
    for seed in range(requests):
        matcher = engine.matcher(constraint.grammar, EOS)
        steered = engine.steer(
            matcher, constraint.grammar, ids, eos=EOS, max_tokens=tokens + 64, rng=random.Random(seed),
            stop_ids=EOS,
        )  # fmt: skip
        masks += steered.masks
        draws += steered.random_choices
    return cpu * 1e6 / max(emitted, 1), masks / requests, draws / requests


# -- 3. end to end ----------------------------------------------------------------------------------


async def end_to_end(streams: int, tokens: int) -> tuple[float, float]:
    """Completion tokens/s through the app, tool_choice required vs auto, same script."""
    import tempfile

    import httpx

    from agentserve.config import UpConfig
    from agentserve.frontend.up import build_up

    arguments = {"command": " ".join(["word"] * tokens)}
    call = f'<tool_call>\n{{"name": "Bash", "arguments": {json.dumps(arguments)}}}\n</tool_call><|im_end|>'
    path = Path(tempfile.mkdtemp()) / "constrained.json"
    path.write_text(json.dumps({"rules": [], "default": call}))
    config = UpConfig.model_validate({"workers": 2, "sim_speedup": 0, "script": str(path), "port": 0})
    app, backend = build_up(config)
    await backend.start()
    tool = {"type": "function", "function": {"name": "Bash", "parameters": AGENT_TOOLS["Bash"]}}
    rates: dict[str, float] = {}
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=300) as client:
            for choice in ("auto", "required", "auto", "required"):  # alternate: warm-up effects cancel

                async def one(i: int, choice: str = choice) -> int:
                    body = {
                        "model": "m",
                        "messages": [{"role": "user", "content": f"run {i}"}],
                        "tools": [tool],
                        "tool_choice": choice,
                        "max_tokens": tokens + 64,
                    }
                    r = await client.post("/v1/chat/completions", json=body)
                    r.raise_for_status()
                    return int(r.json()["usage"]["completion_tokens"])

                t0 = time.perf_counter()
                done = await asyncio.gather(*(one(i) for i in range(streams)))
                rates[choice] = max(rates.get(choice, 0.0), sum(done) / (time.perf_counter() - t0))
    finally:
        await backend.stop()
    return rates["auto"], rates["required"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    generated = 60 if args.quick else 300

    print("1. compile time per schema (a request forcing that tool, qwen3 syntax, llguidance)")
    compile_times("coding-agent tools", list(AGENT_TOOLS.items()))
    compile_times(
        "hypothesis-generated schemas", [(f"t{i}", s) for i, s in enumerate(generated_schemas(generated, 7))]
    )
    everything = [ToolSpec(n, "", s, strict=True) for n, s in AGENT_TOOLS.items()]
    probe = GrammarEngine(TOKENIZER.to_json())
    assert FAMILY.grammar is not None
    markers = Markers(probe.specials(FAMILY.grammar.marker_strings))
    constraint = build(GenerationOptions("m", tool_choice=ToolChoice("required")), everything, FAMILY.grammar,
                       markers, family="qwen3")  # fmt: skip
    assert constraint is not None
    probe.tokenizer(EOS)
    t0 = time.perf_counter()
    assert probe.check(constraint.grammar, EOS) is None
    t1 = time.perf_counter()
    probe.check(constraint.grammar, EOS)
    t2 = time.perf_counter()
    cold_ms, cached_us = (t1 - t0) * 1000, (t2 - t1) * 1e6
    print(f"  all {len(everything)} tools strict, required: cold {cold_ms:.1f} ms, cached {cached_us:.1f} µs")

    print("\n2. sim worker CPU per generated token (zero-time sim), constrained vs not, same run")
    tokens = 128 if args.quick else 512
    for mode in ("follow", "steer"):
        for memo in (False, True):
            for streams in (1, 64, 256):
                if args.quick and streams == 256:
                    continue
                base, n0 = asyncio.run(sim_cpu(streams, tokens, mode, False, memo))
                cons, n1 = asyncio.run(sim_cpu(streams, tokens, mode, True, memo))
                share = (cons - base) / cons * 100
                kind = "memoized" if memo else "uncached"
                print(
                    f"  {mode:<6} {kind:<8} {streams:4} streams: unconstrained {base:6.1f} µs/token "
                    f"({n0} tok), constrained {cons:6.1f} µs/token ({n1} tok): ×{cons / base:4.2f}, "
                    f"constraint share {share:5.1f} %"
                )

    for mode in ("follow", "steer"):
        per_token, masks, draws = steering_alone(mode, tokens, 64)
        print(
            f"  {mode:<6} steering alone (constrained_plan, memo off, 64 requests): {per_token:5.2f} "
            f"µs/token, {masks:4.1f} masks and {draws:3.1f} seeded draws per request"
        )

    print("\n3. end to end (in-process app, Chat, non-streamed): tool_choice required vs auto, same script")
    for streams in (1, 64) if args.quick else (1, 64, 256):
        auto, required = asyncio.run(end_to_end(streams, 64 if args.quick else 256))
        ratio = required / auto
        print(f"  {streams:4} streams: auto {auto:8.0f} tok/s, required {required:8.0f} tok/s, ×{ratio:4.2f}")


if __name__ == "__main__":
    main()
