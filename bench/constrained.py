"""Constrained decoding's costs (issue 22), each against a baseline taken in the same run.

    PYTHONPATH=src python bench/constrained.py            # full run (~1 min)
    PYTHONPATH=src python bench/constrained.py --quick    # smoke run
    PYTHONPATH=src python bench/constrained.py --only sim --only worker   # the mask cost parts
    PYTHONPATH=src python bench/constrained.py --family kimi-k2           # another call syntax

1. **Compile** (`constraints.engine.GrammarEngine.check`): per tool schema of a Claude-Code-shaped
   tool list and per hypothesis-generated schema, the grammar of a request forcing that tool (qwen3
   syntax), compiled cold (a fresh engine, its tokenizer built beforehand) and again (the cache);
   p50 / p90 / max ms. Target: p50 ≤ 50 ms cold, ~0 cached.
2. **Mask cost in the sim worker**: a zero-time `SimEngine`, N concurrent requests (1 / 64 / 256) of
   the same output length, CPU per generated token with and without a constraint, same run:
   `follow` — the script obeys the grammar (tool_choice required, the script's own call: its tokens
   are validated in one call, not consumed, no mask is computed); `steer` — the script is prose and
   the grammar forces a call (the call's syntax comes from llguidance's forced tokens and bytes, and
   where a token must be chosen from a few candidates checked with `validate_tokens`, a mask only
   when they do not decide; the prose goes on inside the argument, speculated and verified); each
   with the sim's memos off (`uncached`: every request steered from nothing — neither its memo of
   steered plans nor what llguidance said of the grammar's states, `constraints.states`), with a
   script of its own per request steered anew under a grammar whose states are remembered
   (`anew`: an agent's requests share their tools, not their answers), and on (`memoized`: the
   default; a prose request forced into a call draws no seeded choice, so all share one plan). Then the
   steering alone (`constrained_plan` per request, memo off): µs per output token, vocabulary masks
   and seeded draws per request. Target: the added CPU ≤ 5 % of the sim's per-token CPU at 64 streams.
2b. **Against a real worker's CPU**: a sim worker process as `agentserve worker --engine sim` runs
   it (`WorkerConfig`, `worker.main.run`; a scenario whose every answer is the script), the timing
   profile on (`--speedup 1`, the default: real time, ~1 token per frame as with a real engine),
   64 concurrent streams from a `WorkerClient` over the mux (msgpack frames, one connection, as the
   frontend talks to workers); the worker process's own CPU time (all threads, nanoseconds, from
   /proc/<pid>/task/*/schedstat) per generated token, on twin worker processes serving an
   unconstrained and a constrained batch at the same time (the machine's state moves one batch's
   CPU by ±20 % here: both see the same), the roles swapped every batch, 8 pairs (2 with --quick):
   the minima, the medians and the median of the paired differences, as a share of the
   unconstrained worker's CPU per token; and the worker's own account, which the machine's noise
   does not move: the CPU its constraints took (its /metrics counter
   `agentserve_worker_constraint_cpu_seconds_total`, timed around the steering) per token, as a
   share of the same. Before the clock each twin serves a batch of each kind on scripts the
   measured batches never use (a worker that has served this grammar a while). `follow` and
   `steer`, `uncached` / `anew` / `memoized` as in part 2 (the worker started with its memos set
   so; for `anew` its scenario answers stream k's prompt, `stream k: …`, with a script of its
   own). Only this part: `--only worker`.
Every part writes its constraints in one family's tool-call syntax (`--family`, default qwen3); a
`follow` script in another family's syntax is the call the steering writes for its prose.
3. **End to end**: `agentserve up`'s app in process (frontend, router, 2 zero-time sim workers, via
   httpx's ASGI transport), N concurrent Chat requests, tokens/s with `tool_choice: required` vs
   `auto` on the same script, the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.api.options import GenerationOptions, ToolChoice  # noqa: E402
from agentserve.constraints.build import ConstraintError, build  # noqa: E402
from agentserve.constraints.engine import GrammarEngine  # noqa: E402
from agentserve.constraints.spec import Constraint  # noqa: E402
from agentserve.conversation import ToolSpec  # noqa: E402
from agentserve.families import Family, get_family  # noqa: E402
from agentserve.families.grammar import Markers  # noqa: E402
from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER, HFTokenizer  # noqa: E402

TOKENIZER = HFTokenizer.from_file(EMBEDDED_TOKENIZER)


@dataclasses.dataclass
class _Syntax:
    family: Family  # whose tool-call syntax the constraints and `follow` scripts are written in


SYNTAX = _Syntax(get_family("qwen3"))  # `--family` sets it
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


def constraint_for(tools: tuple[ToolSpec, ...], choice: ToolChoice) -> Constraint:
    """The constraint of a request offering `tools` with `choice`, in `SYNTAX.family`'s syntax."""
    assert SYNTAX.family.grammar is not None
    markers = Markers(_probe().specials(SYNTAX.family.grammar.marker_strings))
    built = build(
        GenerationOptions("m", tool_choice=choice),
        tools,
        SYNTAX.family.grammar,
        markers,
        family=SYNTAX.family.name,
    )
    assert built is not None
    return Constraint(built.grammar, built.json_schema)


def required_bash() -> Constraint:
    """The bench's constraint: a call required, the coding agent's Bash tool offered."""
    return constraint_for((ToolSpec("Bash", "", AGENT_TOOLS["Bash"]),), ToolChoice("required"))


_PROBES: list[GrammarEngine] = []


def _probe() -> GrammarEngine:
    """A grammar engine over the bench's tokenizer, to resolve markers (built once)."""
    if not _PROBES:
        _PROBES.append(GrammarEngine(TOKENIZER.to_json()))
    return _PROBES[0]


def named_grammar(name: str, schema: dict[str, Any]) -> str:
    return constraint_for((ToolSpec(name, "", schema),), ToolChoice("named", name)).grammar


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def compile_times(label: str, schemas: list[tuple[str, dict[str, Any]]]) -> None:
    tokenizer_json = TOKENIZER.to_json()
    cold: list[float] = []
    cached: list[float] = []
    failed = 0
    for name, schema in schemas:
        try:
            grammar = named_grammar(name, schema)
        except ConstraintError:  # a schema the family's syntax cannot enforce (an XML raw value's)
            failed += 1
            continue
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


async def sim_cpu(streams: int, tokens: int, mode: str, constrained: bool, kind: str) -> tuple[float, int]:
    """CPU µs per generated token, and the tokens generated, for N concurrent sim requests (after one
    warm-up request: the grammar is compiled and the tokenizer built, as in a running worker).
    Every prompt has its own length (its own seed). `kind`: `uncached` — every memo off, so every
    request is steered from nothing (the per-token cost of the masks themselves); `anew` — every
    request has a script of its own (prose of its own words), steered anew (no memo of steered
    plans) under a grammar whose states are remembered (`constraints.states`), the scripts
    tokenized before the clock as the sim's plan memo holds a script it has served; `memoized` —
    the defaults, one script for all."""
    with memos(kind == "memoized", states=kind != "uncached"):
        return await _sim_cpu(streams, tokens, mode, constrained, distinct=kind == "anew")


WORDS = [
    "the",
    "file",
    "is",
    "in",
    "a",
    "dir",
    "and",
    "we",
    "list",
    "it",
    "now",
    "then",
    "run",
    "all",
    "tests",
    "on",
    "this",
    "branch",
    "to",
    "see",
    "what",
    "fails",
]


def script_for(mode: str, tokens: int, k: int | None = None) -> str:
    """The sim's script: the grammar's own call (`follow`) or prose where a call is required
    (`steer`); prose of `tokens` words, all "word" (k None) or the k-th seeded sequence of `WORDS`.
    The call holds half the words as its command: written out in qwen3's syntax, and in another
    family's as the steering writes the prose into a call under `required_bash` (so a whole call
    in that family's syntax, whatever it is)."""
    rng = random.Random(k)
    words = ["word"] * tokens if k is None else [rng.choice(WORDS) for _ in range(tokens)]
    if mode != "follow":
        return " ".join(words)
    if SYNTAX.family.name != "qwen3":
        return _steered(" ".join(words[: tokens // 2]), tokens + 64)
    arguments = {"command": " ".join(words[: tokens // 2])}
    return f'<tool_call>\n{{"name": "Bash", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def _steered(prose: str, budget: int) -> str:
    """The answer the steering gives for `prose` under `required_bash`, without its end token."""
    grammar = required_bash().grammar
    engine = _probe()
    ids = TOKENIZER.encode(prose)
    out = engine.steer(
        engine.matcher(grammar, EOS), grammar, ids, eos=EOS, max_tokens=budget, rng=0, stop_ids=EOS
    )
    assert out.complete, f"{SYNTAX.family.name}: the steering left the call open"
    return TOKENIZER.decode([t for t in out.token_ids if t not in EOS])


@contextlib.contextmanager
def memos(on: bool, states: bool | None = None) -> Iterator[None]:
    """The sim's memos on (as configured) or off: its steered plans (`PLAN_CACHE`) and what
    llguidance said of each grammar's states (`MEMO_STATES`; `states` apart when given)."""
    from agentserve.constraints import states as grammar_states
    from agentserve.worker import constrained as steering

    saved = steering.PLAN_CACHE, grammar_states.MEMO_STATES
    if not on:
        steering.PLAN_CACHE = 0
    if not (on if states is None else states):
        grammar_states.MEMO_STATES = 0
    steering._plans.clear()
    try:
        yield
    finally:
        steering.PLAN_CACHE, grammar_states.MEMO_STATES = saved


async def _sim_cpu(
    streams: int, tokens: int, mode: str, constrained: bool, distinct: bool = False
) -> tuple[float, int]:
    from agentserve.worker.engine import GenerateRequest, SamplingParams
    from agentserve.worker.engines.sim import SimConfig, SimEngine
    from agentserve.worker.outputs import OutputContext

    script = script_for(mode, tokens)
    seen: dict[str, int] = {}

    class Fixed:
        def respond(self, ctx: OutputContext) -> str:
            if not distinct:
                return script
            return script_for(mode, tokens, seen.setdefault(ctx.last_message, len(seen)))

    engine = SimEngine(SimConfig(speedup=0), TOKENIZER, Fixed())
    constraint = required_bash() if constrained else None
    await engine.start()
    sampling = SamplingParams(max_tokens=tokens + 64, stop_token_ids=EOS, include_stop=True)
    prompts = [[1000 + (i * 7919 + j) % 4000 for j in range(64 + i)] for i in range(streams)]

    async def one(i: int, prompt: list[int], constrained: bool = True) -> int:
        request = GenerateRequest(f"r{i}", prompt, sampling, constraint=constraint if constrained else None)
        return sum([len(s.token_ids) async for s in engine.generate(request)])

    await one(-1, [999] * 32)  # warm-up
    if distinct:  # each script tokenized, as the sim's plan memo holds a script it has served
        await asyncio.gather(*(one(i, prompts[i], constrained=False) for i in range(streams)))
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

    engine = steering.grammar_engine(TOKENIZER)
    constraint = required_bash()
    ids = TOKENIZER.encode(script_for(mode, tokens))
    pieces = token_pieces(TOKENIZER, ids)
    sampling = SamplingParams(max_tokens=tokens + 64, stop_token_ids=EOS, include_stop=True)
    with memos(False):
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


# -- 2b. a real sim worker process ------------------------------------------------------------------

HOST = "127.0.0.1"


def serve_worker(port: int, events_port: int, script: str, speedup: float, kind: str) -> None:
    """Subprocess mode: `agentserve worker --engine sim` (its config, its serve loop) on the scenario
    file `script`, with the sim's memos as `kind` says (`sim_cpu`)."""
    from agentserve.config import WorkerConfig
    from agentserve.constraints import states
    from agentserve.worker import constrained as steering
    from agentserve.worker.main import run

    if kind != "memoized":
        steering.PLAN_CACHE = 0
    if kind == "uncached":
        states.MEMO_STATES = 0
    config = WorkerConfig(
        host=HOST, port=port, kv_events_port=events_port, sim_script=script, sim_speedup=speedup,
        drain_delay_s=0,
    )  # fmt: skip
    run(config)


class WorkerProcess:
    """A sim worker process on free ports, ready."""

    def __init__(self, scenario: dict[str, Any], speedup: float, kind: str) -> None:
        import os
        import socket
        import subprocess
        import tempfile

        ports = []
        for _ in range(2):
            with socket.socket() as sock:
                sock.bind((HOST, 0))
                ports.append(sock.getsockname()[1])
        self.url = f"http://{HOST}:{ports[0]}"
        path = Path(tempfile.mkdtemp()) / "script.json"
        path.write_text(json.dumps(scenario))
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        argv = [sys.executable, __file__, "--serve-worker", f"{ports[0]},{ports[1]}", "--script", str(path),
                "--speedup", str(speedup), "--memo", kind]  # fmt: skip
        self.proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self, limit_s: float = 60) -> None:
        import urllib.request

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit_s:
            if self.proc.poll() is not None:
                raise RuntimeError("the worker exited")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("the worker did not become ready")

    def cpu(self) -> float:
        """The worker process's CPU seconds, all its threads, to the nanosecond (the first field of
        /proc/<pid>/task/*/schedstat; /proc/<pid>/stat counts 10 ms ticks, ~8 % of a batch). Where
        the kernel keeps no schedstat (gVisor), the ticks of /proc/<pid>/stat."""
        import os

        pid = self.proc.pid
        if not os.path.exists(f"/proc/{pid}/schedstat"):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        return total / 1e9

    def constraint_cpu(self) -> float:
        """The CPU seconds the worker says it spent enforcing constraints (its /metrics counter
        `agentserve_worker_constraint_cpu_seconds_total`, timed around the steering itself)."""
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("agentserve_worker_constraint_cpu_seconds_total"):
                    return float(line.rsplit(" ", 1)[1])
        raise RuntimeError("the worker reports no constraint CPU")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def scenario(mode: str, tokens: int, streams: int, distinct: bool) -> dict[str, Any]:
    """The worker's scenario: every answer `script_for(mode, tokens)`, or (`distinct`) stream k's
    prompt (`stream k: …`) answered with the k-th script of its own."""
    rules = [{"match": f"stream {k}:", "output": script_for(mode, tokens, k)} for k in range(streams)]
    return {"rules": rules if distinct else [], "default": script_for(mode, tokens)}


async def worker_batch(
    worker: WorkerProcess, streams: int, tokens: int, constrained: bool, tag: str, first: int = 0
) -> tuple[float, int, int, float]:
    """The worker's CPU seconds, tokens and frames for N concurrent streams over the mux (msgpack
    frames, one connection, as the frontend's `WorkerClient`), and the CPU seconds it says its
    constraints took; stream k's prompt starts with `stream {first + k}:` (`scenario`)."""
    from agentserve.worker.client import WorkerClient
    from agentserve.worker.engine import GenerateRequest, SamplingParams

    constraint = required_bash() if constrained else None
    sampling = SamplingParams(max_tokens=tokens + 64, stop_token_ids=EOS, include_stop=True)
    prompts = [
        TOKENIZER.encode(f"stream {first + i}: ") + [1000 + (i * 7919 + j) % 4000 for j in range(64 + i)]
        for i in range(streams)
    ]

    async with WorkerClient(worker.url, framing="msgpack", transport="mux") as client:

        async def one(i: int, prompt: list[int]) -> tuple[int, int]:
            request = GenerateRequest(f"{tag}-{i}", prompt, sampling, constraint=constraint)
            got = frames = 0
            async for step in await client.generate(request):
                got += len(step.token_ids)
                frames += 1
            return got, frames

        await one(-1, [999] * 32)  # the connection, and the grammar compiled, before the clock
        s0 = worker.constraint_cpu()  # outside the CPU window: a scrape costs the worker CPU too
        c0 = worker.cpu()
        done = await asyncio.gather(*(one(i, prompts[i]) for i in range(streams)))
        cpu = worker.cpu() - c0
        steering = worker.constraint_cpu() - s0
    return cpu, sum(d[0] for d in done), sum(d[1] for d in done), steering


def worker_cpu(
    mode: str, kind: str, streams: int, tokens: int, speedup: float, reps: int
) -> dict[str, float]:
    """Worker CPU µs per generated token, unconstrained vs constrained, on twin worker processes
    serving their batches at the same time (the machine's state, which moves the CPU of one batch
    by ±20 % here, is the same for both), the roles swapped every batch (one process's own quirks
    cancel): the minimum and the median of each, the median of the paired differences, the median
    of what the constrained worker says its constraints took (`steering`, µs per token: its
    /metrics counter), and tokens per frame. `kind` as `sim_cpu`'s. Before the clock each twin
    serves a batch of each kind on scripts the measured batches never use: what a worker that has
    served this grammar a while holds (llguidance's lexer states, `constraints.states`), while
    every measured script is still new to it."""
    scripts = scenario(mode, tokens, 2 * streams, distinct=kind == "anew")
    twins = (WorkerProcess(scripts, speedup, kind), WorkerProcess(scripts, speedup, kind))
    runs: dict[bool, list[float]] = {False: [], True: []}
    diffs: list[float] = []
    steering: list[float] = []
    per_frame = 0.0

    async def pair(rep: int, first: int = 0) -> list[tuple[float, int, int, float]]:
        plain, steered = twins if rep % 2 == 0 else twins[::-1]
        return list(
            await asyncio.gather(
                worker_batch(plain, streams, tokens, False, f"{mode}-0-{rep}-{first}", first),
                worker_batch(steered, streams, tokens, True, f"{mode}-1-{rep}-{first}", first),
            )
        )

    try:
        for rep in range(2):
            asyncio.run(pair(rep, first=streams))  # the warm-up
        for rep in range(reps):
            (cpu0, got0, _, _), (cpu1, got1, frames1, spent) = asyncio.run(pair(rep))
            base, cons = cpu0 * 1e6 / max(got0, 1), cpu1 * 1e6 / max(got1, 1)
            runs[False].append(base)
            runs[True].append(cons)
            diffs.append(cons - base)
            steering.append(spent * 1e6 / max(got1, 1))
            per_frame = got1 / max(frames1, 1)
    finally:
        for worker in twins:
            worker.close()
    return {
        "base": min(runs[False]),
        "cons": min(runs[True]),
        "base_median": statistics.median(runs[False]),
        "cons_median": statistics.median(runs[True]),
        "paired": statistics.median(diffs),
        "steering": statistics.median(steering),
        "tokens_per_frame": per_frame,
    }


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
    parser.add_argument(
        "--only",
        choices=["compile", "sim", "worker", "e2e"],
        action="append",
        help="run only these parts (repeatable)",
    )
    parser.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="the worker measurement's sim time scale (1: the timing profile's real time)",
    )
    parser.add_argument(
        "--family",
        default="qwen3",
        help="the tool-call syntax of the constraint and of the `follow` script (a family with a grammar)",
    )
    parser.add_argument("--serve-worker", help=argparse.SUPPRESS)
    parser.add_argument("--script", help=argparse.SUPPRESS)
    parser.add_argument(
        "--memo", choices=["uncached", "anew", "memoized"], default="memoized", help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_worker:
        port, events = (int(p) for p in args.serve_worker.split(","))
        serve_worker(port, events, args.script, args.speedup, args.memo)
        return
    SYNTAX.family = get_family(args.family)
    if SYNTAX.family.grammar is None:
        parser.error(f"{args.family} writes no tool calls (no grammar)")
    parts = set(args.only or ["compile", "sim", "worker", "e2e"])
    if "compile" in parts:
        compile_part(args.quick)
    if "sim" in parts:
        sim_part(args.quick)
    if "worker" in parts:
        worker_part(args.quick, args.speedup)
    if "e2e" in parts:
        e2e_part(args.quick)


def compile_part(quick: bool) -> None:
    generated = 60 if quick else 300
    syntax = SYNTAX.family.name
    print(f"1. compile time per schema (a request forcing that tool, {syntax} syntax, llguidance)")
    compile_times("coding-agent tools", list(AGENT_TOOLS.items()))
    compile_times(
        "hypothesis-generated schemas", [(f"t{i}", s) for i, s in enumerate(generated_schemas(generated, 7))]
    )
    everything = tuple(ToolSpec(n, "", s, strict=True) for n, s in AGENT_TOOLS.items())
    try:
        constraint = constraint_for(everything, ToolChoice("required"))
    except ConstraintError as exc:
        print(f"  all {len(everything)} tools strict, required: refused in {syntax}'s syntax ({exc})")
        return
    probe = GrammarEngine(TOKENIZER.to_json())
    probe.tokenizer(EOS)
    t0 = time.perf_counter()
    assert probe.check(constraint.grammar, EOS) is None
    t1 = time.perf_counter()
    probe.check(constraint.grammar, EOS)
    t2 = time.perf_counter()
    cold_ms, cached_us = (t1 - t0) * 1000, (t2 - t1) * 1e6
    print(f"  all {len(everything)} tools strict, required: cold {cold_ms:.1f} ms, cached {cached_us:.1f} µs")


def sim_part(quick: bool) -> None:
    print("\n2. sim worker CPU per generated token (zero-time sim), constrained vs not, same run")
    tokens = 128 if quick else 512
    for mode in ("follow", "steer"):
        for kind in ("uncached", "anew", "memoized"):
            for streams in (1, 64, 256):
                if quick and streams == 256:
                    continue
                # At 64 streams (the target's) 5 pairs, alternated: one batch is ~30 ms of CPU here,
                # and a collection or the other core's job moves it by ±10 %.
                pairs = 5 if streams == 64 and not quick else 1
                runs: list[tuple[float, float]] = []
                for _ in range(pairs):
                    gc.collect()
                    base, n0 = asyncio.run(sim_cpu(streams, tokens, mode, False, kind))
                    gc.collect()
                    cons, n1 = asyncio.run(sim_cpu(streams, tokens, mode, True, kind))
                    runs.append((base, cons))
                base, cons = min(b for b, _ in runs), min(c for _, c in runs)
                paired = statistics.median(c / b for b, c in runs)
                print(
                    f"  {mode:<6} {kind:<8} {streams:4} streams: unconstrained {base:6.2f} µs/token "
                    f"({n0} tok), constrained {cons:6.2f} µs/token ({n1} tok): minima ×{cons / base:4.2f}"
                    + (f", median of {pairs} pairs ×{paired:4.2f}" if pairs > 1 else "")
                )

    for mode in ("follow", "steer"):
        per_token, masks, draws = steering_alone(mode, tokens, 64)
        print(
            f"  {mode:<6} steering alone (constrained_plan, memo off, 64 requests): {per_token:5.2f} "
            f"µs/token, {masks:4.1f} masks and {draws:3.1f} seeded draws per request"
        )


def worker_part(quick: bool, speedup: float) -> None:
    timing = "the timing profile's real time" if speedup == 1 else f"time scale {speedup:g}"
    print(f"\n2b. a sim worker process ({timing}), 64 streams over the mux (msgpack): worker CPU per token")
    tokens, reps = (128, 2) if quick else (512, 8)
    for mode in ("follow", "steer"):
        for kind in ("uncached", "anew", "memoized"):
            got = worker_cpu(mode, kind, 64, tokens, speedup, reps)
            added = got["cons"] - got["base"]
            print(
                f"  {mode:<6} {kind:<8}: unconstrained {got['base']:5.2f} µs/token (median "
                f"{got['base_median']:5.2f}), constrained {got['cons']:5.2f} ({got['cons_median']:5.2f}): "
                f"added, minima {added:+5.2f} µs/token = {added / got['base'] * 100:+5.1f} %, median of "
                f"pairs {got['paired']:+5.2f} = {got['paired'] / got['base_median'] * 100:+5.1f} %; "
                f"the worker's own account (its constraint CPU, median) {got['steering']:4.2f} µs/token = "
                f"{got['steering'] / got['base_median'] * 100:4.1f} %; "
                f"{got['tokens_per_frame']:.2f} tokens/frame"
            )


def e2e_part(quick: bool) -> None:
    print("\n3. end to end (in-process app, Chat, non-streamed): tool_choice required vs auto, same script")
    for streams in (1, 64) if quick else (1, 64, 256):
        auto, required = asyncio.run(end_to_end(streams, 64 if quick else 256))
        ratio = required / auto
        print(f"  {streams:4} streams: auto {auto:8.0f} tok/s, required {required:8.0f} tok/s, ×{ratio:4.2f}")


if __name__ == "__main__":
    main()
