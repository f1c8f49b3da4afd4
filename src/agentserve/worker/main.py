"""Assemble a worker from its configuration: engine, KV event publisher, HTTP service."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from agentserve.config import ConfigError, WorkerConfig
from agentserve.worker.constrained import grammar_engine
from agentserve.worker.engine import Engine
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.outputs import EchoPolicy, OutputPolicy, ScenarioError, ScriptPolicy, raw_format_for
from agentserve.worker.profiles import ProfileError, load_profile
from agentserve.worker.scheduler import SchedulerConfig
from agentserve.worker.timing import INTERCONNECTS, TimingModel, spanning_nodes
from agentserve.worker.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from agentserve.families import Family

log = logging.getLogger("agentserve.worker")


def _family(config: WorkerConfig) -> Family | None:
    """The family whose output the sim writes: the configured one, else the model name's."""
    from agentserve.families import UnknownFamilyError, family_for_model, get_family

    if config.family is not None:
        try:
            return get_family(config.family)
        except UnknownFamilyError:
            return None  # a family the parsers do not know: `<think>` tags
    return family_for_model(config.model)


def build_policy(config: WorkerConfig, tokenizer: Tokenizer) -> OutputPolicy:
    echo = EchoPolicy(raw_format_for(_family(config)))
    if config.sim_script is None:
        return echo
    try:
        script = ScriptPolicy.from_file(config.sim_script, echo)
    except ScenarioError as exc:
        raise ConfigError(str(exc)) from exc
    for text in script.outputs():
        if tokenizer.decode(tokenizer.encode(text)) != text:
            raise ConfigError(f"the tokenizer does not reproduce this scripted output exactly: {text[:80]!r}")
    return script


def sim_timing(profile: str, nodes: int = 1, interconnect: str = "infiniband-ndr") -> TimingModel:
    """The sim's timing: the profile's, as a replica spanning `nodes` nodes when more than one."""
    try:
        loaded = load_profile(profile)
    except ProfileError as exc:
        raise ConfigError(f"sim_profile: {exc}") from exc
    if nodes <= 1:
        return loaded.timing
    model = loaded.model
    layers = int(model.get("layers") or 0)
    # The all-reduced activation is the hidden state; a profile without hidden_size gives the
    # attention width (query heads × head dim), which it equals for most dense models.
    hidden = int(
        model.get("hidden_size") or int(model.get("query_heads") or 0) * int(model.get("head_dim") or 0)
    )
    gpus = int((loaded.hardware or {}).get("count") or 1)
    try:
        return spanning_nodes(
            loaded.timing,
            nodes,
            INTERCONNECTS[interconnect],
            layers=layers,
            hidden=hidden,
            gpus_per_node=gpus,
        )
    except ValueError as exc:
        raise ConfigError(f"sim_nodes: profile {profile!r} has no model layers/hidden size: {exc}") from exc


def engine_facts(config: WorkerConfig) -> dict[str, object]:
    """What a client measuring this engine needs to know (GET /info; `agentserve profile`)."""
    facts: dict[str, object] = {
        "max_num_tokens": config.max_num_tokens,
        "max_batch_size": config.max_batch_size,
        "chunked_prefill": config.enable_chunked_prefill,
        "time_scale": 1.0,
        "role": config.role,
    }
    if config.engine == "sim":
        # Simulated seconds per wall second; 0: the sim does not wait (nothing to measure).
        speedup = config.sim_speedup
        facts["time_scale"] = 0.0 if math.isinf(speedup) else speedup
        facts["sim_profile"] = config.sim_profile
    return facts


def build_engine(config: WorkerConfig) -> Engine:
    if config.engine == "trtllm":
        from agentserve.worker.engines.trtllm import TrtLlmEngine

        return TrtLlmEngine(config)
    try:
        tokenizer = load_tokenizer(config.tokenizer, config.model_path)
    except Exception as exc:  # tokenizers raises its own exception type for unreadable files
        where = f"--tokenizer {config.tokenizer}" if config.tokenizer else f"--model-path {config.model_path}"
        if config.tokenizer is None and config.model_path is None:
            where = "the embedded tokenizer"
        raise ConfigError(f"{where}: cannot load the tokenizer: {exc}") from exc
    sim = SimConfig(
        num_blocks=config.sim_kv_blocks,
        host_blocks=config.sim_host_kv_blocks,
        honour_retention=config.kv_retention != "off",
        block_size=config.block_size,
        hash_seed=config.hash_seed,
        scheduler=SchedulerConfig(
            max_batch_size=config.max_batch_size,
            max_num_tokens=config.max_num_tokens,
            chunked_prefill=config.enable_chunked_prefill,
            prefix_caching=config.enable_block_reuse,
        ),
        speedup=config.sim_speedup,
        catch_up_s=config.sim_catch_up_s,
        timing=sim_timing(config.sim_profile, config.sim_nodes, config.sim_interconnect),
        kv_hold_s=config.sim_kv_hold_s,
    )
    policy = build_policy(config, tokenizer)
    grammar_engine(tokenizer, cache_size=config.constraint_cache_size)  # sized once, built on first use
    if config.sim_dp_ranks > 1:
        if config.role != "both":
            raise ConfigError("a prefill or decode sim worker has no attention-DP ranks (sim_dp_ranks 1)")
        from agentserve.worker.engines.sim_dp import DpSimEngine

        return DpSimEngine(config.sim_dp_ranks, sim, tokenizer, policy)
    return SimEngine(sim, tokenizer, policy)


async def serve(config: WorkerConfig) -> None:

    from agentserve.drain import DrainState
    from agentserve.drain import server as draining_server
    from agentserve.worker.publisher import KvEventPublisher
    from agentserve.worker.service import create_app

    engine = build_engine(config)
    if isinstance(engine, SimEngine):
        from agentserve.worker.client import KvPuller

        engine.kv_peer = KvPuller()  # KV of disaggregated prefills comes from prefill workers' /kv/pull
    drain = DrainState()
    publisher = KvEventPublisher(f"tcp://{config.host}:{config.kv_events_port}")
    app = create_app(
        engine,
        model=config.model,
        engine_name=config.engine,
        publisher=publisher,
        request_abort=config.request_abort,
        drain=drain,
        facts=engine_facts(config),
    )
    server = draining_server(
        app, config.host, config.port, drain, delay_s=config.drain_delay_s, grace_s=config.drain_grace_s
    )
    log.warning(
        "agentserve worker: %s engine, generate on http://%s:%d, KV events on %s",
        config.engine,
        config.host,
        config.port,
        publisher.endpoint,
    )
    await server.serve()


def run(config: WorkerConfig) -> int:
    from agentserve.eventloop import event_loop_runner

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with event_loop_runner() as runner:
        runner.run(serve(config))
    return 0
