"""`agentserve router` as a process: it starts, serves its API, and refuses bad settings clearly."""

from __future__ import annotations

import httpx
from procs import Processes, wait_ready


def test_the_router_starts_with_no_workers_and_is_not_ready_until_one_syncs() -> None:
    with Processes() as procs:
        url, proc = procs.router([])
        wait_ready(url, "/health")
        ready = httpx.get(url + "/ready")
        assert ready.status_code == 503 and ready.json()["error"]["type"] == "no_workers"
        assert httpx.get(url + "/workers").json()["workers"] == []
        assert "agentserve_router_queue_depth 0.0" in httpx.get(url + "/metrics").text
        assert proc.poll() is None


def test_kubernetes_discovery_without_a_service_is_a_config_error() -> None:
    with Processes() as procs:
        proc = procs.start("router", "--discovery", "kubernetes", "--port", "0")
        assert proc.wait(timeout=30) == 2
        assert "--worker-service" in procs.logs() and "Traceback" not in procs.logs()


def test_a_malformed_worker_url_is_a_config_error() -> None:
    with Processes() as procs:
        proc = procs.start("router", "--workers", "10.0.0.1:8200", "--port", "0")
        assert proc.wait(timeout=30) == 2
        assert "http://host:port" in procs.logs() and "Traceback" not in procs.logs()
