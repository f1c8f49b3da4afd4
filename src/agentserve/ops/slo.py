"""The latency targets the dashboard draws and the burn-rate alerts watch.

A target must be a bucket bound of its histogram (`agentserve.telemetry.metrics`), so "within target"
is one bucket's share, exact; tests/unit/ops checks it. `le` is matched as `2` or `2.0`: Prometheus 3
normalises the label value of a classic histogram at scrape time, promtool's input series keep it as
the client wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentserve.telemetry.metrics import ITL_BUCKETS, PREFIX, TTFT_BUCKETS


@dataclass(frozen=True, slots=True)
class SloTarget:
    name: str
    histogram: str  # the histogram's name, without `_bucket`
    buckets: tuple[float, ...]
    target_s: float  # a request within this is good
    objective: float  # the share of requests that must be good

    @property
    def budget(self) -> float:
        """The share of requests allowed over target (the error budget)."""
        return round(1.0 - self.objective, 6)

    @property
    def le_regex(self) -> str:
        """`le` of the target's bucket, as written by the client or normalised by Prometheus 3."""
        whole = f"{self.target_s:g}"
        return f"{whole}(\\\\.0)?" if "." not in whole else whole.replace(".", "\\\\.")


# An agent's cold prompt is 10K-200K tokens, so its first token can take seconds; 95% within 4 s.
TTFT = SloTarget("TTFT", f"{PREFIX}_time_to_first_token_seconds", TTFT_BUCKETS, 4.0, 0.95)
# A turn that writes a file decodes for minutes; 95% of requests average 50 ms or less per token.
ITL = SloTarget("ITL", f"{PREFIX}_inter_token_latency_seconds", ITL_BUCKETS, 0.05, 0.95)
SLOS = (TTFT, ITL)
