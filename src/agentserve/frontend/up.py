"""`agentserve up`: the whole stack in one process, on one port.

Frontend + embedded router + N in-process sim workers (each a `SimEngine` built exactly as
`agentserve worker --engine sim` builds one, sharing the frontend's family and tokenizer), their KV
events fed to the router by tasks. No GPU, no cluster: it starts in about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from fastapi import FastAPI

from agentserve.api.signing import Signer
from agentserve.config import ConfigError, FrontendConfig, RouterConfig, UpConfig, WorkerConfig
from agentserve.drain import server as draining_server
from agentserve.eventloop import event_loop_runner
from agentserve.frontend.app import create_app
from agentserve.frontend.backend import EngineBackend
from agentserve.frontend.harness import harness_settings
from agentserve.frontend.http import ApiKeys
from agentserve.keyfile import decode_key
from agentserve.prompt.pipeline import PromptPipeline
from agentserve.prompt.template import PromptError
from agentserve.router.core import Role
from agentserve.worker.engine import Engine
from agentserve.worker.main import build_engine

log = logging.getLogger("agentserve.up")

SIGNING_KEY_ENV = "AGENTSERVE_SIGNING_KEY"


def load_signer(config: FrontendConfig, environ: Mapping[str, str] = os.environ) -> Signer:
    """The signing key from `signing_key_file` or $AGENTSERVE_SIGNING_KEY, else a random one.

    Hex, base64 or raw bytes (`agentserve.keyfile`). Only the key's fingerprint is logged, so operators
    can check that replicas agree (`/ready` shows it too).
    """
    if config.signing_key_file is not None:
        source = f"signing_key_file {config.signing_key_file}"
        try:
            raw = Path(config.signing_key_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read signing_key_file: {exc}") from exc
    elif environ.get(SIGNING_KEY_ENV):
        source, raw = f"${SIGNING_KEY_ENV}", environ[SIGNING_KEY_ENV].encode()
    else:
        signer = Signer.random()
        log.info(
            "signing key: random to this process (fingerprint %s); other replicas and restarts will not "
            "recognise its thinking signatures or sealed reasoning: set signing_key_file to share one",
            signer.fingerprint,
        )
        return signer
    try:
        key, form = decode_key(raw)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    signer = Signer(key)
    log.info("signing key from %s (%s): fingerprint %s", source, form, signer.fingerprint)
    return signer


def load_pipeline(config: FrontendConfig) -> PromptPipeline:
    try:
        return PromptPipeline.from_config(config)
    except PromptError as exc:
        raise ConfigError(str(exc)) from exc


def sim_worker_config(config: UpConfig, pipeline: PromptPipeline) -> WorkerConfig:
    return WorkerConfig.model_validate(
        {
            "engine": "sim",
            "model": config.model,
            "model_path": config.model_path,
            "tokenizer": config.tokenizer,
            "family": pipeline.family.name,
            "block_size": config.block_size,
            "hash_seed": config.hash_seed,
            "sim_kv_blocks": config.sim_kv_blocks,
            "sim_host_kv_blocks": config.sim_host_kv_blocks,
            "kv_retention": config.kv_retention,
            "sim_speedup": config.sim_speedup,
            "sim_profile": config.sim_profile,
            "sim_script": config.script,
        }
    )


def sim_engines(config: UpConfig, pipeline: PromptPipeline) -> dict[str, Engine]:
    worker = sim_worker_config(config, pipeline)
    count = config.autoscale_range[0] if config.autoscale_range else config.workers
    engines = {f"sim-{i}": build_engine(worker) for i in range(count)}
    prefill = worker.model_copy(update={"role": "prefill"})
    engines.update({f"prefill-{i}": build_engine(prefill) for i in range(config.prefill_workers)})
    return engines


def attach_planner(config: UpConfig, app: FastAPI, backend: EngineBackend, pipeline: PromptPipeline) -> None:
    """`--autoscale MIN:MAX`: the planner runs beside the backend and adds or removes sim workers."""
    from dataclasses import replace

    from agentserve.planner.decide import PlannerConfig
    from agentserve.planner.local import FrontendReadings, LocalPlanner
    from agentserve.planner.metrics import PlannerMetrics
    from agentserve.worker.engines.sim import SimEngine
    from agentserve.worker.main import sim_timing

    bounds = config.autoscale_range
    assert bounds is not None
    worker = sim_worker_config(config, pipeline)
    timing = sim_timing(config.sim_profile)
    load_s = config.sim_model_load_s if config.sim_model_load_s is not None else timing.model_load_s

    def make_engine() -> Engine:
        engine = build_engine(worker)
        assert isinstance(engine, SimEngine)
        engine.config = replace(engine.config, load_delay_s=load_s)
        return engine

    planner_config = PlannerConfig(
        min_workers=bounds[0],
        max_workers=bounds[1],
        ttft_target_s=config.ttft_target_ms / 1000,
        itl_target_s=config.itl_target_ms / 1000,
        kv_blocks_per_worker=config.sim_kv_blocks,
        scale_down_delay_s=config.scale_down_delay_s,
    )
    speedup = config.sim_speedup
    if speedup <= 0 or speedup == float("inf"):
        raise ConfigError("autoscale needs a sim that keeps time: set --sim-speedup to a positive number")
    frontend_metrics = app.state.frontend.telemetry.metrics
    metrics = PlannerMetrics(frontend_metrics.registry)
    planner = LocalPlanner(
        backend,
        make_engine,
        planner_config,
        timing,
        interval_s=config.planner_interval_s,
        metrics=metrics,
        time_scale=speedup,
        frontend=FrontendReadings(frontend_metrics),
    )
    app.state.planner = planner
    backend.run_beside(planner.run)


def build_up(
    config: UpConfig, *, engines: Mapping[str, Engine] | None = None, keys: ApiKeys | None = None
) -> tuple[FastAPI, EngineBackend]:
    """The app of `agentserve up` and its backend (engines: the sim workers, unless given)."""
    pipeline = load_pipeline(config)
    if engines is None:
        engines = sim_engines(config, pipeline)
    router = RouterConfig.model_validate(
        {
            "block_size": config.block_size,
            "profile": config.sim_profile,
            "prefill_threshold_tokens": config.prefill_threshold_tokens,
        }
    )
    # Engines named prefill-* (--prefill-workers) prefill only; the others decode (or do both).
    roles: dict[str, Role] = {w: "prefill" for w in engines if w.startswith("prefill-")}
    backend = EngineBackend(engines, router, max_migrations=config.migration_limit, roles=roles)
    try:
        keys = keys if keys is not None else ApiKeys.load(config.api_keys_file)
    except OSError as exc:
        raise ConfigError(f"cannot read api_keys_file: {exc}") from exc
    app = create_app(config, backend, pipeline=pipeline, signer=load_signer(config), keys=keys)
    if roles:
        from agentserve.router.metrics import PrefillDecisionsCollector

        app.state.frontend.telemetry.metrics.registry.register(PrefillDecisionsCollector(backend.router))
    if config.autoscale_range is not None:
        attach_planner(config, app, backend, pipeline)
    return app, backend


async def serve(
    app: FastAPI,
    host: str,
    port: int,
    banner: Callable[[str], str] | None = None,
    out: TextIO = sys.stdout,
    *,
    sock: socket.socket | None = None,
) -> None:
    """Run `app` until interrupted (SIGTERM: drained, see `agentserve.drain`); once it listens,
    print `banner(base_url)`. `sock`: an already bound listening socket (`--processes`)."""
    config: FrontendConfig = app.state.frontend.config
    server = draining_server(
        app, host, port, app.state.drain, delay_s=config.drain_delay_s, grace_s=config.drain_grace_s
    )
    task = asyncio.create_task(server.serve(sockets=[sock] if sock is not None else None))
    for _ in range(3000):  # 30 s at most for startup
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if server.started and banner is not None:
        bound = server.servers[0].sockets[0].getsockname()
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        out.write(banner(f"http://{shown}:{bound[1]}"))
        out.flush()
    await task


def up_banner(config: UpConfig, keys_required: bool) -> Callable[[str], str]:
    workers = f"{config.workers} sim worker{'s' if config.workers != 1 else ''}"
    if config.autoscale_range is not None:
        low, high = config.autoscale_range
        workers = (
            f"{low} to {high} sim workers (planner: TTFT {config.ttft_target_ms:.0f} ms, ITL "
            f"{config.itl_target_ms:.0f} ms; desired and ready workers on /metrics as "
            "agentserve_planner_desired_workers / _ready_workers)"
        )

    def banner(base_url: str) -> str:
        head = f"agentserve is up at {base_url}: model {config.model}, {workers}, embedded router.\n\n"
        return head + harness_settings(base_url, config.model, keys_required=keys_required)

    return banner


def run_up(config: UpConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app, _ = build_up(config)
    keys = ApiKeys.load(config.api_keys_file)
    with contextlib.suppress(KeyboardInterrupt), event_loop_runner() as runner:
        runner.run(serve(app, config.host, config.port, up_banner(config, bool(keys))))
    return 0
