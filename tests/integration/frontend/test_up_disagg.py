"""`agentserve up --prefill-workers`: a cold prompt prefilled on a prefill sim worker, a follow-up
turn prefilled locally; both decisions with their predicted costs in the trace and counted on
/metrics (the official `openai` SDK as the client)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from stack import served

from agentserve.config import UpConfig


def records(sink: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    return [r["request"] for r in lines if r["event_type"] == "request_end"]


def test_prefill_workers_take_cold_prompts_and_the_trace_says_so(tmp_path: Path) -> None:
    sink = tmp_path / "trace.jsonl"
    settings = {"workers": 2, "prefill_workers": 1, "prefill_threshold_tokens": 200, "trace_sink": str(sink)}
    with served(settings) as s:
        assert set(s.backend.engines) == {"sim-0", "sim-1", "prefill-0"}
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        history: list[Any] = [
            {"role": "user", "content": "Please read the whole repository and summarise it. " * 60}
        ]
        first = client.chat.completions.create(model="m", max_tokens=16, messages=history)
        history += [{"role": "assistant", "content": first.choices[0].message.content}]
        history += [{"role": "user", "content": "Thanks, one more detail?"}]
        client.chat.completions.create(model="m", max_tokens=16, messages=history)
        metrics = httpx.get(s.url + "/metrics").text
    cold, warm = (r["prefill"] for r in records(sink))
    assert cold["where"] == "remote" and cold["outcome"] == "remote" and cold["prefill_worker"] == "prefill-0"
    assert cold["received_tokens"] > 0 and cold["predicted_remote_ttft_ms"] > 0
    assert cold["predicted_local_ttft_ms"] > 0 and cold["uncached_tokens"] > 200
    assert warm["where"] == "local" and warm["reason"] == "below-threshold" and warm["uncached_tokens"] <= 200
    assert 'agentserve_router_prefill_decisions_total{where="remote"} 1.0' in metrics
    assert 'agentserve_router_prefill_decisions_total{where="local"} 1.0' in metrics


def test_aggregated_up_has_no_prefill_record(tmp_path: Path) -> None:
    sink = tmp_path / "trace.jsonl"
    with served({"workers": 1, "trace_sink": str(sink)}) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        client.chat.completions.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert records(sink)[0]["prefill"] is None


def test_prefill_workers_do_not_combine_with_autoscale() -> None:
    with pytest.raises(ValueError, match="prefill-workers"):
        UpConfig.model_validate({"prefill_workers": 1, "autoscale": "1:2"})
    with pytest.raises(ValueError, match="in-process"):
        UpConfig.model_validate({"prefill_worker_urls": ["http://127.0.0.1:8200"]})
