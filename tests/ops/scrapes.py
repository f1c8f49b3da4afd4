"""Real scrapes → promtool `input_series`, the way Prometheus would have stored them.

Each scrape of a target adds the labels Prometheus and the ServiceMonitor give every series of that
target, and Prometheus's own `up` (1 when the scrape answered, 0 when not). A counter, histogram or
summary series missing from an earlier scrape was 0 then (prometheus_client creates a labelled child
at its first observation); a gauge missing from a scrape has no sample (`_`). `_created` samples are
left out, as Prometheus does by default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

ZERO_BEFORE = ("counter", "histogram", "summary")


@dataclass
class Target:
    labels: dict[str, str]  # the target's labels (namespace, deployment, component, pod, job, instance)
    scrapes: list[str | None] = field(default_factory=list)  # exposition text per step; None: no answer


def _series(name: str, labels: Mapping[str, str]) -> str:
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _value(v: float) -> str:
    return "NaN" if math.isnan(v) else repr(float(v))


def input_series(targets: Sequence[Target]) -> list[dict[str, str]]:
    """promtool `input_series` with one sample per scrape step (interval: the step)."""
    out: list[dict[str, str]] = []
    for target in targets:
        steps = len(target.scrapes)
        values: dict[str, list[float | None]] = {}
        kinds: dict[str, str] = {}
        for step, text in enumerate(target.scrapes):
            if text is None:
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    key = _series(sample.name, {**sample.labels, **target.labels})
                    values.setdefault(key, [None] * steps)[step] = sample.value
                    kinds[key] = family.type
        for key, row in values.items():
            first = next(i for i, v in enumerate(row) if v is not None)
            cells = []
            for i, v in enumerate(row):
                if v is None and i < first and kinds[key] in ZERO_BEFORE:
                    cells.append("0")
                else:
                    cells.append("_" if v is None else _value(v))
            out.append({"series": key, "values": " ".join(cells)})
        up = " ".join("0" if text is None else "1" for text in target.scrapes)
        out.append({"series": _series("up", target.labels), "values": up})
    return out
