"""The `agentserve profile` command: measure a worker (or refit a profile's measurements), write the
profile, print measured vs modelled, plot it."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from dataclasses import replace
from pathlib import Path

from agentserve.profiler.fit import fit_timing
from agentserve.profiler.measure import Profiler, ProfileRunError, worker_facts
from agentserve.profiler.plan import FULL, QUICK, fit_to
from agentserve.profiler.report import error_table, plot
from agentserve.worker.client import WorkerClient, WorkerError
from agentserve.worker.profiles import (
    DEFAULT_PROFILE,
    Measurement,
    Profile,
    ProfileError,
    load_profile,
    profile_to_yaml,
)

NOISY = 0.25  # a fit worse than this on some measurement is reported


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--worker", metavar="URL", help="a running worker to measure (http://host:port)")
    source.add_argument(
        "--refit", metavar="PROFILE", help="refit the measurements of a profile (name or file)"
    )
    source.add_argument("--show", metavar="PROFILE", help="print a profile's measurements against its model")
    p.add_argument("-o", "--output", metavar="FILE", help="write the profile here (default: stdout)")
    p.add_argument("--plot", metavar="PNG", help="plot measured vs modelled (needs matplotlib)")
    p.add_argument("--name", help="the profile's name (default: profile-<model>-<date>)")
    p.add_argument("--description", default="", help="one line saying what was profiled")
    p.add_argument("--hardware", default="", help="the accelerator, e.g. 'NVIDIA B200 (HGX), TP 1'")
    p.add_argument(
        "--base",
        metavar="PROFILE",
        help="profile whose model facts (KV bytes per token, experts, copy bandwidths, load time) the "
        "fit keeps (default: the sim's own profile when profiling a sim, else "
        f"{DEFAULT_PROFILE})",
    )
    p.add_argument("--moe-experts", type=int, help="routed experts per layer (0: a dense model)")
    p.add_argument("--moe-active-experts", type=int, help="experts per token (top-k)")
    p.add_argument("--kv-bytes-per-token", type=int, help="KV cache bytes per token")
    p.add_argument("--quick", action="store_true", help="a short sweep (about 20 measurements)")
    p.add_argument("--max-context", type=int, help="longest prompt to measure, in tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")


def run(args: argparse.Namespace) -> int:
    try:
        if args.show:
            profile = load_profile(args.show)
        elif args.refit:
            base = load_profile(args.refit)
            profile = _refit(base, base.measurements, args, dict(base.obtained))
        else:
            profile = asyncio.run(_measure(args))
    except (ProfileError, ProfileRunError, WorkerError, OSError) as exc:
        print(f"agentserve profile: {exc}", file=sys.stderr)
        return 2
    if not args.show:
        text = profile_to_yaml(profile)
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output}", file=sys.stderr)
        else:
            sys.stdout.write(text)
    print(f"profile {profile.label}", file=sys.stderr if not args.show else sys.stdout)
    (sys.stderr if not args.show else sys.stdout).write(error_table(profile))
    if args.plot:
        try:
            plot(profile, Path(args.plot))
            print(f"plot: {args.plot}", file=sys.stderr)
        except ImportError:
            print("agentserve profile: matplotlib is not installed: no plot", file=sys.stderr)
    return 0


async def _measure(args: argparse.Namespace) -> Profile:
    async with WorkerClient(args.worker) as client:
        facts, info = await worker_facts(client)
        plan = fit_to(QUICK if args.quick else FULL, facts, args.max_context)
        base_name = args.base or str(info.get("sim_profile") or DEFAULT_PROFILE)
        base = load_profile(base_name)
        print(
            f"profiling {info.get('engine')} worker {args.worker} (model {info.get('model')}): "
            f"{plan.size} measurements, KV {facts.kv_tokens} tokens, chunk {facts.max_num_tokens}, "
            f"time scale {facts.time_scale:g}",
            file=sys.stderr,
        )
        profiler = Profiler(client, facts, seed=args.seed, progress=lambda line: print(line, file=sys.stderr))
        measurements = await profiler.run(plan)
    today = datetime.date.today().isoformat()
    obtained: dict[str, str | int | float] = {
        "method": "measured",
        "by": f"agentserve profile --worker {args.worker}{' --quick' if args.quick else ''} "
        f"({len(measurements)} measurements; model facts from {base_name})",
        "date": today,
    }
    engine = {"name": str(info.get("engine", "?"))}
    if info.get("sim_profile"):
        engine["simulating"] = str(info["sim_profile"])
    model = {**base.model, "name": str(info.get("model", "?"))}
    named = replace(
        base,
        name=args.name or f"profile-{info.get('model', 'worker')}-{today}",
        hardware={"accelerator": args.hardware} if args.hardware else {},
        engine=engine,
        model=model,
    )
    return _refit(named, measurements, args, obtained)


def _refit(
    base: Profile,
    measurements: tuple[Measurement, ...] | list[Measurement],
    args: argparse.Namespace,
    obtained: dict[str, str | int | float],
) -> Profile:
    if not measurements:
        raise ProfileError(f"profile {base.name} has no measurements to fit")
    shape = replace(base.timing, name=args.name or base.name)
    if args.moe_experts is not None:
        shape = replace(shape, moe_experts=args.moe_experts, moe_active_experts=args.moe_active_experts or 0)
        if args.moe_experts == 0:
            shape = replace(shape, moe_expert_s=0.0)
    if args.kv_bytes_per_token is not None:
        shape = replace(shape, kv_bytes_per_token=args.kv_bytes_per_token)
    try:
        fit = fit_timing(measurements, shape)
    except ValueError as exc:
        raise ProfileError(str(exc)) from exc
    if fit.worst > NOISY:
        print(
            f"agentserve profile: the model misses a measurement by {100 * fit.worst:.0f} %: "
            "the measurements are noisy (a busy machine, or a sim too fast for its host: profile a sim "
            "at --sim-speedup 1) or the engine does not follow the timing model's shape (see the table "
            "and the plot)",
            file=sys.stderr,
        )
    obtained = {**obtained, "fit_worst_error": round(fit.worst, 4)}
    return replace(
        base,
        name=shape.name,
        description=args.description or base.description,
        timing=fit.timing,
        obtained=obtained,
        measurements=tuple(measurements),
    )
