"""`agentserve planner`: the planner over a fleet it reads over the network, and on Kubernetes the
loop that scales an AgentServingDeployment through its scale subresource.

Every interval `ClusterPlanner.step` reads the fleet (`FleetReader`: workers' `/load`, frontends' and
routers' `/metrics`), builds a `Sample`, calls `decide`, and — with a `PlannerKube` — acts:

- before a scale-down it ranks the ready workers with `choose_removals` and writes the rank as each
  pod's `controller.kubernetes.io/pod-deletion-cost`, so the ReplicaSet removes the workers whose
  retained sessions are cheapest to lose; the pod's SIGTERM drains it (no new requests, running ones
  finish; the router migrates a stream whose worker dies);
- writes the count to the CR's scale subresource (`kubectl get asd` shows it; an HPA or KEDA could
  drive the same subresource instead of this planner);
- posts an Event on every change of the count and keeps the CR's `Autoscaling` condition current.

Without Kubernetes (`discovery: static`) it only advises: the decision goes to the log and `/metrics`.
A reading in which no worker answered decides nothing (the workers may be loading, or the planner
cut off): the count stays, and the condition says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from agentserve.config import ConfigError, PlannerServiceConfig
from agentserve.operator.cluster import ClusterError
from agentserve.operator.events import Note
from agentserve.operator.spec import AUTOSCALING_CONDITION
from agentserve.planner.decide import Decision, PlannerConfig, Sample, WorkerState, choose_removals, decide
from agentserve.planner.fleet import FleetReader, FleetReading, slice_discovery, static_discovery
from agentserve.planner.kube import (
    PlannerKube,
    condition_reason,
    conditions_of,
    decision_message,
    desired_replicas,
    planner_condition,
    same_condition,
    scale_note,
)
from agentserve.planner.metrics import PlannerMetrics
from agentserve.planner.readings import SampleBuilder, session_blocks
from agentserve.worker.timing import TimingModel

log = logging.getLogger("agentserve.planner")
HISTORY = 720  # samples kept
DEFAULT_KV_BLOCKS = 32768  # until a worker reports its size


def decision_config(config: PlannerServiceConfig, kv_blocks: int) -> PlannerConfig:
    return PlannerConfig(
        min_workers=config.min_workers,
        max_workers=config.max_workers,
        ttft_target_s=config.ttft_target_ms / 1000,
        itl_target_s=config.itl_target_ms / 1000,
        kv_blocks_per_worker=kv_blocks,
        scale_down_delay_s=config.scale_down_delay_s,
        chunk=config.max_num_tokens,
    )


class ClusterPlanner:
    def __init__(
        self,
        config: PlannerServiceConfig,
        timing: TimingModel,
        reader: FleetReader,
        kube: PlannerKube | None = None,
        *,
        metrics: PlannerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.timing = timing
        self.reader = reader
        self.kube = kube
        self.metrics = metrics
        self.clock = clock
        self.now = now
        self.readings = SampleBuilder(config.interval_s)
        self.history: list[Sample] = []
        self.decisions: list[Decision] = []
        self.desired: int | None = None  # the count last asked for (kubernetes: read from the CR)
        self.kv_blocks = config.kv_blocks_per_worker or DEFAULT_KV_BLOCKS
        self._costs: dict[str, int] = {}  # deletion costs written, by pod

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.step()
            except Exception:  # one bad interval must not end the loop
                log.exception("planner: the step failed; trying again next interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.interval_s)

    async def step(self) -> Decision | None:
        owner = await asyncio.to_thread(self.kube.owner) if self.kube is not None else None
        current = desired_replicas(owner) if owner is not None else self.desired
        fleet = await self.reader.read()
        if not fleet.loads:
            why = (
                f"no worker answered ({len(fleet.unreachable)} unreachable)"
                if fleet.workers_discovered
                else "no ready worker yet"
            )
            log.info("planner: %s; keeping %s workers", why, current)
            await self._condition(owner, ok=False, reason="NoWorkerReadings", message=why)
            return None
        if self.config.kv_blocks_per_worker is None:
            reported = max(load.kv_blocks_total for load in fleet.loads.values())
            self.kv_blocks = reported if reported > 0 else self.kv_blocks
        sample = self.readings.build(
            self.clock(), fleet.loads, len(fleet.loads), frontend=fleet.frontend, queued=fleet.queued
        )
        self.history = [*self.history[-(HISTORY - 1) :], sample]
        decision = decide(
            self.history,
            decision_config(self.config, self.kv_blocks),
            self.timing,
            current=current if current is not None else sample.ready_workers,
            previous=self.decisions,
        )
        self.decisions = [*self.decisions[-(HISTORY - 1) :], decision]
        before = current if current is not None else sample.ready_workers
        if decision.desired != before:
            log.info("planner: %d -> %s", before, decision_message(decision))
            if self.kube is not None:
                await self._scale(owner, fleet, before, decision)
        self.desired = decision.desired
        ok = not decision.reason.startswith("max")
        await self._condition(
            owner, ok=ok, reason=condition_reason(decision.reason), message=decision_message(decision)
        )
        if self.metrics is not None:
            loading = max(decision.desired - len(fleet.loads), 0)
            self.metrics.export(decision, ready=len(fleet.loads), loading=loading, draining=0)
        return decision

    async def _scale(self, owner: Any, fleet: FleetReading, before: int, decision: Decision) -> None:
        assert self.kube is not None
        if decision.desired < before:
            await self._rank_for_removal(fleet)
        await asyncio.to_thread(self.kube.scale, decision.desired)
        uid = (owner or {}).get("metadata", {}).get("uid")
        note: Note = scale_note(before, decision)
        try:
            await asyncio.to_thread(self.kube.post_event, note, uid, self.now())
        except ClusterError as exc:  # an Event is a courtesy: the scale already happened
            log.warning("planner: cannot post the Event: %s", exc)

    async def _rank_for_removal(self, fleet: FleetReading) -> None:
        """Deletion costs by `choose_removals`' order: the cheapest worker to lose costs least."""
        assert self.kube is not None
        states = [WorkerState(w, session_blocks(x), x.running + x.waiting) for w, x in fleet.loads.items()]
        ranked = choose_removals(states, len(states))
        for cost, pod in enumerate(ranked):
            if self._costs.get(pod) == cost:
                continue
            try:
                await asyncio.to_thread(self.kube.set_deletion_cost, pod, cost)
                self._costs[pod] = cost
            except ClusterError as exc:  # static URLs as ids, or the pod just went
                log.warning("planner: cannot annotate %s: %s", pod, exc)

    async def _condition(self, owner: Any, *, ok: bool, reason: str, message: str) -> None:
        if self.kube is None or owner is None:
            return
        previous = next((c for c in conditions_of(owner) if c.get("type") == AUTOSCALING_CONDITION), None)
        generation = (owner.get("metadata") or {}).get("generation")
        condition = planner_condition(
            previous, ok=ok, reason=reason, message=message, generation=generation, now=self.now()
        )
        if same_condition(previous, condition):
            return
        try:
            await asyncio.to_thread(self.kube.set_condition, owner, condition)
        except ClusterError as exc:  # written again at the next interval
            log.info("planner: condition not written (%s)", exc)


# ------------------------------------------------------------------------------------ the process


def build_planner(
    config: PlannerServiceConfig, *, api_client: Any = None, registry: CollectorRegistry | None = None
) -> ClusterPlanner:
    from agentserve.worker.profiles import ProfileError, load_profile

    try:
        timing = load_profile(config.profile).timing
    except ProfileError as exc:
        raise ConfigError(f"profile: {exc}") from exc
    kube: PlannerKube | None = None
    if config.discovery == "kubernetes":
        namespace = config.namespace or _pod_namespace()
        kube = PlannerKube(namespace, config.deployment or "", api_client)
        services = {
            "worker": config.worker_service,
            "frontend": config.frontend_service,
            "router": config.router_service,
        }
        reader = FleetReader(slice_discovery(kube.endpoint_slices, services))
    else:
        urls = {"worker": config.workers, "frontend": config.frontends, "router": config.routers}
        reader = FleetReader(static_discovery(urls))
    metrics = PlannerMetrics(registry) if registry is not None else None
    # Without a deployment to scale the planner advises only: it reads the cluster, acts on nothing.
    return ClusterPlanner(config, timing, reader, kube if config.deployment else None, metrics=metrics)


def _pod_namespace() -> str:
    import os

    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "default"


def create_app(planner: ClusterPlanner, registry: CollectorRegistry) -> Any:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def decisions(_: Request) -> Response:
        last = planner.decisions[-1] if planner.decisions else None
        body: dict[str, Any] = {"desired": planner.desired, "decisions": len(planner.decisions)}
        if last is not None:
            body["last"] = {
                "desired": last.desired,
                "reason": last.reason,
                "kv_floor": last.kv_floor,
                "predicted_ttft_s": _finite(last.predicted.ttft_s),
                "predicted_itl_s": _finite(last.predicted.itl_s),
                "observed_ttft_s": last.observed_ttft_s,
                "observed_itl_s": last.observed_itl_s,
            }
        return JSONResponse(body)

    routes = [
        Route("/health", health),
        Route("/ready", health),
        Route("/metrics", metrics),
        Route("/decisions", decisions),
    ]
    return Starlette(routes=routes)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


async def serve(config: PlannerServiceConfig) -> None:
    import uvicorn

    registry = CollectorRegistry()
    planner = build_planner(config, registry=registry)
    server = uvicorn.Server(
        uvicorn.Config(create_app(planner, registry), host=config.host, port=config.port, log_level="warning")
    )
    acting = f"scales {config.deployment}" if config.deployment else "advises (scales nothing)"
    log.warning(
        "agentserve planner: %d..%d workers, TTFT %.0f ms, ITL %.0f ms, every %.0f s; %s; /metrics on %s:%d",
        config.min_workers,
        config.max_workers,
        config.ttft_target_ms,
        config.itl_target_ms,
        config.interval_s,
        acting,
        config.host,
        config.port,
    )
    stop = asyncio.Event()
    loop_task = asyncio.create_task(planner.run(stop))
    try:
        await server.serve()
    finally:
        stop.set()
        await loop_task


def run(config: PlannerServiceConfig) -> int:
    from agentserve.eventloop import event_loop_runner

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with event_loop_runner() as runner:
        runner.run(serve(config))
    return 0
