"""`agentserve planner` over real processes: a sim worker, a router and a frontend on loopback, the
planner reading their /load and /metrics over HTTP (static discovery: it advises, scales nothing)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
from procs import Processes, free_port, wait_ready

ROUND = 12  # concurrent requests a round: more than readings.MIN_OBSERVATIONS finish in one window


def _decisions(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(url + "/decisions", timeout=2).json()
    return body


def test_the_planner_reads_the_fleet_over_http_and_explains_its_decision() -> None:
    with Processes() as procs:
        worker, _ = procs.worker("--sim-speedup", "1")
        wait_ready(worker)
        router, _ = procs.router([worker], "--health-interval-s", "0.2")
        wait_ready(router)
        port = free_port()
        procs.start(
            "frontend", "--host", "127.0.0.1", "--port", str(port), "--model", "qwen3-sim",
            "--router-url", router,
        )  # fmt: skip
        frontend = f"http://127.0.0.1:{port}"
        wait_ready(frontend)
        planner_port = free_port()
        procs.start(
            "planner", "--host", "127.0.0.1", "--port", str(planner_port),
            "--workers", worker, "--frontends", frontend, "--routers", router,
            "--min-workers", "1", "--max-workers", "3", "--interval-s", "0.3",
            # A target no single sim worker meets: the planner must ask for more and say why.
            "--ttft-target-ms", "0.5", "--itl-target-ms", "1000",
        )  # fmt: skip
        planner = f"http://127.0.0.1:{planner_port}"
        wait_ready(planner, "/health")
        client = openai.OpenAI(base_url=frontend + "/v1", api_key="k", max_retries=0)

        def ask(i: int) -> None:
            client.chat.completions.create(
                model="qwen3-sim", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=8
            )

        try:
            # Rounds of concurrent requests until one window holds enough finished ones for an observed
            # quantile: on a loaded machine one request at a time finishes fewer than that per window.
            deadline = time.monotonic() + 60
            last: dict[str, Any] = {}
            with ThreadPoolExecutor(ROUND) as pool:
                while time.monotonic() < deadline:
                    list(pool.map(ask, range(ROUND)))
                    last = _decisions(planner).get("last") or {}
                    if last.get("observed_ttft_s") is not None:
                        break
        except BaseException:
            print(procs.logs()[-4000:])
            raise
        assert last.get("observed_ttft_s") is not None, last  # read from the frontend's histograms
        assert last["desired"] == 3 and last["reason"].startswith("max"), last
        assert last["predicted_ttft_s"] is not None and last["kv_floor"] >= 1
        metrics = httpx.get(planner + "/metrics", timeout=2).text
        assert "agentserve_planner_desired_workers 3.0" in metrics
        assert 'agentserve_planner_decisions_total{reason="max"}' in metrics
