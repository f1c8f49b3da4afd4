"""The metrics of a running stack, checked by the real promtool, and every dashboard panel evaluated on them.

One process, real loopback HTTP: two sim workers (`agentserve worker`'s app, KV events over ZeroMQ),
the router service over them, a frontend routing through it and the planner reading all of them over
HTTP (static discovery: it decides before the first two scrapes) — the cluster's shape. The official SDKs
drive a short agent load through all three APIs (a Claude Code tool loop with its billing line and a
retry, a streamed Chat tool call, a Responses chain through the state store, one bad request); then one
worker stops and the router removes it. Each component's `/metrics` is scraped before the load, after
it and after the worker left, and:

- `promtool check metrics` passes on every scrape of the frontend, the router and the workers;
- the scrapes become promtool `input_series` (tests/ops/scrapes.py), every panel expression of the
  dashboard becomes a recording rule, and `promtool test rules` asserts each yields a sample that is a
  number (not NaN) — promtool's PromQL engine evaluates them, nothing here does.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml
from prometheus_client import CollectorRegistry
from promtool_runner import Promtool
from scrapes import Target, input_series
from sim_scenarios import ANTHROPIC_TOOLS, CHAT_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, write_scenario
from stack import serving

from agentserve.config import FrontendConfig, PlannerServiceConfig, RouterConfig, WorkerConfig
from agentserve.frontend.app import create_app
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.main import build_backend
from agentserve.operator.metrics import OperatorMetrics
from agentserve.ops import dashboard
from agentserve.planner.service import ClusterPlanner, build_planner
from agentserve.planner.service import create_app as planner_app
from agentserve.router.local import LocalRouter
from agentserve.router.service import create_app as router_app
from agentserve.worker.main import build_engine
from agentserve.worker.publisher import KvEventPublisher
from agentserve.worker.service import create_app as worker_app

NAMESPACE, DEPLOYMENT = "agents", "sim"
RATE_WINDOW = "3m"  # $__rate_interval: covers the three scrapes, one minute apart, at the last one
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;"


@dataclass
class Scraped:
    frontend: Target
    router: Target
    workers: list[Target]
    planner: Target

    @property
    def targets(self) -> list[Target]:
        return [self.frontend, self.router, *self.workers, self.planner]


def _labels(component: str, pod: str, url: str) -> dict[str, str]:
    return {
        "namespace": NAMESPACE,
        "deployment": DEPLOYMENT,
        "component": component,
        "pod": pod,
        "job": f"{DEPLOYMENT}-{component}",
        "instance": url.removeprefix("http://"),
    }


def _wait(check: object, what: str, timeout: float = 15.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _ready(url: str) -> bool:
    return httpx.get(url + "/ready", timeout=5).status_code == 200


def _routable(router_url: str) -> int:
    workers = httpx.get(router_url + "/workers", timeout=5).json()["workers"]
    return sum(1 for w in workers if w["state"] == "live")


def _scrape(url: str) -> str:
    response = httpx.get(url + "/metrics", timeout=5)
    response.raise_for_status()
    return response.text


def _load(url: str) -> None:
    """A short agent load through the official SDKs."""
    claude = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    session = {"x-claude-code-session-id": "cc-session-1"}
    system = [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are a coding agent."}]
    first_turn: list[anthropic.types.MessageParam] = [{"role": "user", "content": "please run echo hello"}]
    with claude.messages.stream(
        model="qwen3-sim",
        max_tokens=500,
        system=system,  # type: ignore[arg-type]
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        messages=first_turn,
        extra_headers=session,
    ) as stream:
        first = stream.get_final_message()
    call = first.content[-1]
    assert call.type == "tool_use"
    second_turn: list[anthropic.types.MessageParam] = [
        *first_turn,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},  # type: ignore[misc]
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}]},
    ]
    claude.messages.create(
        model="qwen3-sim",
        max_tokens=500,
        system=system,  # type: ignore[arg-type]
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        messages=second_turn,
        extra_headers=session,
    )
    # The harness retries its first turn: the prompt rewinds (a drift event).
    claude.messages.create(
        model="qwen3-sim",
        max_tokens=500,
        system=system,  # type: ignore[arg-type]
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        messages=first_turn,
        extra_headers=session,
    )

    chat = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    chunks = chat.chat.completions.create(
        model="qwen3-sim",
        messages=[{"role": "user", "content": "DISPATCH the listing"}],
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"session_id": "codex-1"},
    )
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)

    first_response = chat.responses.create(model="qwen3-sim", input="hello there", store=True)
    chat.responses.create(model="qwen3-sim", input="and again", previous_response_id=first_response.id)
    with pytest.raises(openai.BadRequestError):
        chat.chat.completions.create(model="qwen3-sim", messages=[], max_tokens=5)


@contextlib.contextmanager
def _planner(url: str, router_url: str, workers: list[str]) -> Iterator[tuple[str, ClusterPlanner]]:
    """`agentserve planner` over the stack (static discovery: it reads, advises, scales nothing)."""
    config = PlannerServiceConfig.model_validate(
        {"workers": workers, "frontends": [url], "routers": [router_url], "max_workers": 4}
    )
    registry = CollectorRegistry()
    planner = build_planner(config, registry=registry)
    with serving(planner_app(planner, registry)) as (planner_url, _):
        yield planner_url, planner


@contextlib.contextmanager
def _stack(tmp_path: Path) -> Iterator[tuple[str, str, list[str], contextlib.ExitStack]]:
    scenario = write_scenario(tmp_path, QWEN3_RULES, QWEN3_DEFAULT)
    worker_config = WorkerConfig.model_validate(
        {"family": "qwen3", "sim_script": scenario, "sim_speedup": 0, "sim_host_kv_blocks": 256}
    )
    with contextlib.ExitStack() as stack:
        workers = []
        last = contextlib.ExitStack()  # the worker that leaves
        for i in range(2):
            app = worker_app(build_engine(worker_config), publisher=KvEventPublisher("tcp://127.0.0.1:*"))
            url, _ = (last if i == 1 else stack).enter_context(serving(app))
            workers.append(url)
        stack.enter_context(last)
        router = LocalRouter(RouterConfig.model_validate({"workers": workers, "health_interval_s": 0.1}))
        router_url, _ = stack.enter_context(serving(router_app(router)))
        config = FrontendConfig.model_validate({"model": "qwen3-sim", "router_url": router_url})
        url, _ = stack.enter_context(serving(create_app(config, build_backend(config), keys=ApiKeys())))
        for u in (*workers, router_url, url):
            _wait(lambda u=u: _ready(u), f"{u}/ready")
        _wait(lambda: _routable(router_url) == 2, "two routable workers")
        yield url, router_url, workers, last


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Scraped:
    with (
        _stack(tmp_path_factory.mktemp("ops")) as (url, router_url, workers, last),
        _planner(url, router_url, workers) as (planner_url, planner),
    ):
        result = Scraped(
            Target(_labels("frontend", "sim-frontend-0", url)),
            Target(_labels("router", "sim-router-0", router_url)),
            [Target(_labels("worker", f"sim-worker-{i}", w)) for i, w in enumerate(workers)],
            Target(_labels("planner", "sim-planner-0", planner_url)),
        )
        urls = [url, router_url, *workers, planner_url]

        def scrape_all() -> None:
            for target, u in zip(result.targets, urls, strict=True):
                target.scrapes.append(_scrape(u) if u not in gone else None)

        gone: set[str] = set()
        assert asyncio.run(planner.step()) is not None  # the planner's interval, before each scrape
        scrape_all()
        _load(url)
        assert asyncio.run(planner.step()) is not None
        scrape_all()
        last.close()  # the second worker goes away; the router's probes remove it
        gone.add(workers[1])
        _wait(lambda: "agentserve_router_worker_removals_total{" in _scrape(router_url), "a worker removal")
        scrape_all()
        return result


@pytest.mark.parametrize("component", ["frontend", "router", "worker", "planner"])
def test_promtool_check_metrics_is_clean(promtool: Promtool, scraped: Scraped, component: str) -> None:
    targets = {
        "frontend": [scraped.frontend],
        "router": [scraped.router],
        "worker": scraped.workers,
        "planner": [scraped.planner],
    }[component]
    texts = [text for t in targets for text in t.scrapes if text is not None]
    assert texts
    for text in texts:
        result = promtool.run("check", "metrics", stdin=text)
        assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
            result.stdout + result.stderr
        )


def test_promtool_check_metrics_is_clean_on_the_operator(promtool: Promtool) -> None:
    """The operator's `/metrics` body (handlers._serve_metrics answers `render()`), after a reconcile."""
    metrics = OperatorMetrics()
    metrics.record(
        trigger="update",
        result="ApplyFailed",
        seconds=0.2,
        applied=["Deployment", "Service"],
        deleted=["ServiceMonitor"],
        namespace="agents",
        name="sim",
        ready=False,
    )
    result = promtool.run("check", "metrics", stdin=metrics.render())
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


def test_promtool_check_metrics_can_fail(promtool: Promtool) -> None:
    bad = "# HELP requests counted\n# TYPE requests counter\nrequests 1\n"
    assert promtool.run("check", "metrics", stdin=bad).returncode != 0


def _expr(expr: str) -> str:
    """A panel's expression as Grafana sends it for this deployment."""
    return (
        expr.replace("$__rate_interval", RATE_WINDOW)
        .replace("$namespace", NAMESPACE)
        .replace("$deployment", DEPLOYMENT)
    )


def test_every_dashboard_panel_returns_data(promtool: Promtool, scraped: Scraped, tmp_path: Path) -> None:
    records: dict[str, str] = {}
    for p, panel in enumerate(dashboard.panels()):
        for t, target in enumerate(panel.targets):
            records[f"panel_{p}_{t}"] = f"{panel.title} [{target.legend}]"
    rules = {
        "groups": [
            {
                "name": "dashboard-panels",
                "rules": [
                    {"record": f"panel_{p}_{t}", "expr": _expr(target.expr)}
                    for p, panel in enumerate(dashboard.panels())
                    for t, target in enumerate(panel.targets)
                ],
            }
        ]
    }
    steps = len(scraped.frontend.scrapes)
    tests = {
        "rule_files": ["panels.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "every panel returns data",
                "interval": "1m",
                "input_series": input_series(scraped.targets),
                "promql_expr_test": [
                    {
                        "expr": f"count({record} == {record}) > bool 0",  # `x == x` drops NaN
                        "eval_time": f"{steps - 1}m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                    for record in records
                ],
            }
        ],
    }
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    (tmp_path / "panels_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    assert promtool.run("check", "rules", "panels.yaml", cwd=tmp_path).returncode == 0
    result = promtool.run("test", "rules", "panels_test.yaml", cwd=tmp_path)
    output = result.stdout + result.stderr
    failing = sorted({records[r] for r in re.findall(r"count\((panel_\d+_\d+) ==", output)})
    assert result.returncode == 0, "panels without data: " + ", ".join(failing) + "\n" + output[-3000:]
