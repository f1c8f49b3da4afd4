"""Telemetry: per-request trace records, harness tool events, trace sinks and Prometheus metrics.

`Telemetry` (hub) is what the frontend holds; `TraceBuilder` (trace) is the pure accumulator behind
each request; `agentserve trace` (report) reads the files back. Details: docs/telemetry.md.
"""

from agentserve.telemetry.hub import RequestTelemetry, Telemetry
from agentserve.telemetry.metrics import FrontendMetrics
from agentserve.telemetry.sink import JsonlSink, NullSink, SinkStats, TraceSink, open_sink
from agentserve.telemetry.tool_events import (
    DispatchIndex,
    ToolEvent,
    ToolEventError,
    ToolEventRecord,
    accepted_body,
    decode_tool_events,
    decode_zmq_message,
    parse_tool_event,
)
from agentserve.telemetry.trace import (
    DispatchedCall,
    DriftSummary,
    ToolCallTrace,
    TraceBuilder,
    TraceRecord,
    drift_cause,
)

__all__ = [
    "DispatchIndex",
    "DispatchedCall",
    "DriftSummary",
    "FrontendMetrics",
    "JsonlSink",
    "NullSink",
    "RequestTelemetry",
    "SinkStats",
    "Telemetry",
    "ToolCallTrace",
    "ToolEvent",
    "ToolEventError",
    "ToolEventRecord",
    "TraceBuilder",
    "TraceRecord",
    "TraceSink",
    "accepted_body",
    "decode_tool_events",
    "decode_zmq_message",
    "drift_cause",
    "open_sink",
    "parse_tool_event",
]
