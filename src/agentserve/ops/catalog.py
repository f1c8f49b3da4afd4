"""What each component exports to Prometheus, read from the code that exports it.

The dashboard and the alert rules may name only series and labels listed here (tests/unit/ops checks
every expression). Nothing is restated: each component's real collectors are built the way the
component builds them (the frontend's `FrontendMetrics` with its trace-sink collector and the shared
state's `StateMetrics`, the router's `RouterMetrics` over a real core and fleet, the worker's
`EngineCollector` over a sim engine and a KV event publisher, the operator's `OperatorMetrics`), and
their families, series names and label names are read from them.

Besides a metric's own labels, a scraped series carries the labels of its target: the ones
prometheus-operator sets on every target (`namespace`, `pod`, `service`, `endpoint`, `container`,
`job`, `instance`) and those the operator's ServiceMonitor adds (`SCRAPE_TARGET_LABELS`:
`deployment`, `component`). Prometheus adds one series per target, `up`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import zmq
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Component = Literal["frontend", "router", "worker", "planner", "operator"]
COMPONENTS: tuple[Component, ...] = ("frontend", "router", "worker", "planner", "operator")

# Set by prometheus-operator on every target of a ServiceMonitor.
PROMETHEUS_OPERATOR_TARGET_LABELS = frozenset(
    {"namespace", "pod", "service", "endpoint", "container", "job", "instance"}
)
# Series Prometheus itself writes for every target.
SCRAPE_SERIES: Mapping[str, frozenset[str]] = {"up": frozenset()}

_SUFFIXES = {
    "counter": (("_total", ()), ("_created", ())),
    "gauge": (("", ()),),
    "histogram": (("_bucket", ("le",)), ("_sum", ()), ("_count", ()), ("_created", ())),
    "summary": (("", ("quantile",)), ("_sum", ()), ("_count", ()), ("_created", ())),
    "info": (("_info", ()),),
    "unknown": (("", ()),),
}


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # as registered (a counter's without `_total`)
    type: str
    labels: frozenset[str]
    component: Component

    def series(self) -> dict[str, frozenset[str]]:
        """Every series name this family writes, with its label names."""
        return {self.name + suffix: self.labels | set(extra) for suffix, extra in _SUFFIXES[self.type]}


def target_labels() -> frozenset[str]:
    from agentserve.operator.build import SCRAPE_TARGET_LABELS

    return PROMETHEUS_OPERATOR_TARGET_LABELS | frozenset(SCRAPE_TARGET_LABELS)


def _from_registry(registry: CollectorRegistry, component: Component) -> Iterator[Family]:
    # The registry keeps its collectors privately; a labelled metric with no child yet writes no
    # sample, so its label names are read from the collector itself.
    collectors: Iterable[Collector] = list(registry._collector_to_names)
    for collector in collectors:
        if isinstance(collector, MetricWrapperBase):
            kind = collector._type
            assert kind is not None  # set by every concrete metric class
            yield Family(collector._name, kind, frozenset(collector._labelnames), component)
            continue
        for metric in collector.collect():
            labels = set(getattr(metric, "_labelnames", ()))
            for sample in metric.samples:
                labels |= set(sample.labels) - {"le", "quantile"}
            yield Family(metric.name, metric.type, frozenset(labels), component)


def _frontend() -> Iterator[Family]:
    from agentserve.state.shared import StateMetrics
    from agentserve.telemetry.metrics import FrontendMetrics
    from agentserve.telemetry.sink import SinkStats

    metrics = FrontendMetrics(["model"])
    metrics.watch_sink(SinkStats)
    StateMetrics(metrics.registry, "memory")
    yield from _from_registry(metrics.registry, "frontend")


def _router() -> Iterator[Family]:
    from agentserve.config import RouterConfig
    from agentserve.router.local import LocalRouter

    router = LocalRouter(RouterConfig.model_validate({}))
    router.fleet.removals["gone"] += 1  # the removals family names its label only in a sample
    yield from _from_registry(router.metrics.registry, "router")


def _worker() -> Iterator[Family]:
    from agentserve.config import WorkerConfig
    from agentserve.worker.main import build_engine
    from agentserve.worker.publisher import KvEventPublisher
    from agentserve.worker.service import Rate, metrics_registry

    engine = build_engine(WorkerConfig.model_validate({"engine": "sim"}))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    publisher = KvEventPublisher("inproc://agentserve-catalog", context=context)
    try:
        yield from _from_registry(metrics_registry(engine, "model", publisher, Rate()), "worker")
    finally:
        publisher.close()
        context.destroy(linger=0)


def _planner() -> Iterator[Family]:
    from agentserve.planner.metrics import PlannerMetrics

    registry = CollectorRegistry()
    PlannerMetrics(registry)
    yield from _from_registry(registry, "planner")


def _operator() -> Iterator[Family]:
    from agentserve.operator.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    # One reconcile that applied and deleted a child: each family then names its labels in a sample.
    metrics.record(
        trigger="create",
        result="ok",
        seconds=0.1,
        applied=["Deployment"],
        deleted=["Service"],
        namespace="ns",
        name="n",
        ready=True,
    )
    for metric in text_string_to_metric_families(metrics.render()):
        labels: set[str] = set()
        for sample in metric.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        yield Family(metric.name, metric.type, frozenset(labels), "operator")


def families() -> list[Family]:
    """Every metric family of every component."""
    return [*_frontend(), *_router(), *_worker(), *_planner(), *_operator()]


def exported_series() -> dict[str, frozenset[str]]:
    """Series name → the label names it can carry (its own and its target's)."""
    targets = target_labels()
    out: dict[str, frozenset[str]] = {name: labels | targets for name, labels in SCRAPE_SERIES.items()}
    for family in families():
        for name, labels in family.series().items():
            out[name] = out.get(name, frozenset()) | labels | targets
    return out
