"""The operator's own Prometheus metrics (text exposition format, no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter


class OperatorMetrics:
    """Reconcile counters and timings; handlers run in threads, so updates are locked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._syncs: Counter[tuple[str, str]] = Counter()  # (trigger, result)
        self._applied: Counter[str] = Counter()  # kind
        self._deleted: Counter[str] = Counter()
        self._seconds_sum = 0.0
        self._seconds_count = 0
        self._ready: dict[tuple[str, str], bool] = {}

    def record(
        self,
        *,
        trigger: str,
        result: str,
        seconds: float,
        applied: list[str],
        deleted: list[str],
        namespace: str,
        name: str,
        ready: bool,
    ) -> None:
        with self._lock:
            self._syncs[(trigger, result)] += 1
            self._applied.update(applied)
            self._deleted.update(deleted)
            self._seconds_sum += seconds
            self._seconds_count += 1
            self._ready[(namespace, name)] = ready

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._ready.pop((namespace, name), None)

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP agentserve_operator_syncs_total Reconciles of AgentServingDeployments.",
                "# TYPE agentserve_operator_syncs_total counter",
            ]
            lines += [
                f'agentserve_operator_syncs_total{{trigger="{t}",result="{r}"}} {n}'
                for (t, r), n in sorted(self._syncs.items())
            ]
            lines += [
                "# HELP agentserve_operator_applied_total Children (re-)applied, by kind.",
                "# TYPE agentserve_operator_applied_total counter",
            ]
            lines += [
                f'agentserve_operator_applied_total{{kind="{k}"}} {n}'
                for k, n in sorted(self._applied.items())
            ]
            lines += [
                "# HELP agentserve_operator_deleted_total Children deleted as no longer desired, by kind.",
                "# TYPE agentserve_operator_deleted_total counter",
            ]
            lines += [
                f'agentserve_operator_deleted_total{{kind="{k}"}} {n}'
                for k, n in sorted(self._deleted.items())
            ]
            lines += [
                "# HELP agentserve_operator_sync_seconds Time spent reconciling.",
                "# TYPE agentserve_operator_sync_seconds summary",
                f"agentserve_operator_sync_seconds_sum {self._seconds_sum:.6f}",
                f"agentserve_operator_sync_seconds_count {self._seconds_count}",
                "# HELP agentserve_operator_deployment_ready Whether a deployment's Ready condition is True.",
                "# TYPE agentserve_operator_deployment_ready gauge",
            ]
            lines += [
                f'agentserve_operator_deployment_ready{{namespace="{ns}",name="{n}"}} {int(r)}'
                for (ns, n), r in sorted(self._ready.items())
            ]
        return "\n".join(lines) + "\n"
