"""The `agentserve` command line: one entry point, one subcommand per job.

Each subcommand only parses its flags and calls into the module that does the work, so the CLI
stays a thin edge around pure code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentserve.api.options import GenerationOptions
    from agentserve.api.request import DecodedRequest
    from agentserve.conversation import Conversation
    from agentserve.prompt.pipeline import PromptPipeline, RenderedPrompt

Handler = Callable[[argparse.Namespace], int]


def _cmd_parse(args: argparse.Namespace) -> int:
    from agentserve.families import UnknownFamilyError, get_family
    from agentserve.parsing import ParserOptions, sequential_call_id
    from agentserve.parsing.events import event_to_json, merge_deltas

    try:
        family = get_family(args.family)
    except UnknownFamilyError as exc:
        print(f"agentserve parse: {exc}", file=sys.stderr)
        return 2
    starts = family.starts_in_reasoning if args.starts_in_reasoning is None else args.starts_in_reasoning
    parser = family.parser(ParserOptions(starts_in_reasoning=starts, id_factory=sequential_call_id))
    raw = sys.stdin.read()
    size = args.chunk_size if args.chunk_size > 0 else max(len(raw), 1)
    events = []
    for i in range(0, len(raw), size):
        events += parser.feed(raw[i : i + size])
    events += parser.close()
    if not args.no_merge:
        events = merge_deltas(events)
    for event in events:
        print(json.dumps(event_to_json(event), ensure_ascii=False))
    return 0


REQUEST_APIS = ("canonical", "anthropic", "chat", "responses")


class _CliError(Exception):
    pass


def _decode_request(api: str, text: str) -> tuple[Conversation, GenerationOptions | None]:
    """A request body of `api` (canonical: agentserve's JSON form, docs/prompt.md) as a Conversation,
    with the API request's options (None for canonical bodies)."""
    from agentserve.api.anthropic import decode_messages
    from agentserve.api.chat import decode_chat
    from agentserve.api.errors import ApiError
    from agentserve.api.responses import decode_responses
    from agentserve.api.signing import Signer
    from agentserve.prompt.canonical import conversation_from_json
    from agentserve.prompt.template import PromptError

    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _CliError(f"request body is not JSON: {exc}") from exc
    try:
        request: DecodedRequest
        if api == "anthropic":
            request = decode_messages(body)
        elif api == "chat":
            request = decode_chat(body)
        elif api == "responses":
            request = decode_responses(body, signer=Signer.random())
        else:
            return conversation_from_json(body), None
        return request.conversation, request.options
    except ApiError as exc:
        raise _CliError(f"invalid {api} request: {exc.message}") from exc
    except PromptError as exc:
        raise _CliError(str(exc)) from exc


def _pipeline(args: argparse.Namespace) -> PromptPipeline:
    from agentserve.config import PromptConfig, config_from_args
    from agentserve.prompt.pipeline import PromptPipeline

    config = config_from_args(PromptConfig, args)
    if args.no_strip:
        config = config.model_copy(update={"strip_anthropic_preamble": False, "strip_pattern": []})
    return PromptPipeline.from_config(config)


def _render(args: argparse.Namespace, text: str, pipeline: PromptPipeline) -> RenderedPrompt:
    from agentserve.prompt.pipeline import render_prompt

    conversation, options = _decode_request(args.api, text)
    if options is None:
        return render_prompt(conversation, pipeline, enable_thinking=args.enable_thinking)
    # As the server renders it: the request's own thinking switch or effort, unless the flag says.
    thinking = args.enable_thinking if args.enable_thinking is not None else options.reasoning.enabled
    return render_prompt(
        conversation,
        pipeline,
        enable_thinking=thinking,
        template_kwargs=options.template_kwargs or None,
        reasoning_effort=options.reasoning.level,
    )


def _cmd_render(args: argparse.Namespace) -> int:
    from agentserve.config import ConfigError
    from agentserve.prompt.template import PromptError

    try:
        pipeline = _pipeline(args)
        rendered = _render(args, sys.stdin.read(), pipeline)
    except (_CliError, PromptError, ConfigError) as exc:
        print(f"agentserve render: {exc}", file=sys.stderr)
        return 2
    if args.tokens:
        report = {
            "tokens": len(rendered.token_ids),
            "block_size": pipeline.block_size,
            "block_hashes": [f"{h:016x}" for h in rendered.block_hashes],
            "stripped": dict(rendered.stripped),
            "replay": rendered.replay,
            "starts_in_reasoning": rendered.starts_in_reasoning,
            "tokenizer": pipeline.tokenizer.name,
        }
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(rendered.text)
    return 0


def _cmd_drift(args: argparse.Namespace) -> int:
    from agentserve.config import ConfigError
    from agentserve.prompt.drift import compare
    from agentserve.prompt.template import PromptError

    try:
        pipeline = _pipeline(args)
        first = _render(args, _read(args.first), pipeline)
        second = _render(args, _read(args.second), pipeline)
        generated = pipeline.tokenizer.encode(_read(args.generated)) if args.generated else []
    except (_CliError, PromptError, ConfigError) as exc:
        print(f"agentserve drift: {exc}", file=sys.stderr)
        return 2
    previous = [*first.token_ids, *generated]
    report = compare(previous, second.token_ids, pipeline.tokenizer.decode)
    print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    return 1 if report.drifted else 0


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise _CliError(f"cannot read {path}: {exc}") from exc


def _add_prompt_flags(p: argparse.ArgumentParser) -> None:
    from agentserve.config import PromptConfig, add_config_flags

    add_config_flags(p, PromptConfig)
    p.add_argument(
        "--api",
        choices=REQUEST_APIS,
        default="canonical",
        help="request body format (canonical: agentserve's JSON form of a Conversation, docs/prompt.md)",
    )
    p.add_argument(
        "--replay", dest="replay_policy", choices=["auto", "native", "inject", "drop"], help=argparse.SUPPRESS
    )
    p.add_argument("--no-strip", action="store_true", help="keep volatile spans (billing line, patterns)")
    p.add_argument(
        "--enable-thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pass enable_thinking to the chat template (default: leave it unset)",
    )


def _cmd_crd(args: argparse.Namespace) -> int:
    from agentserve.operator.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from agentserve.ops.dashboard import render

    sys.stdout.write(render())
    return 0


def _cmd_alerts(args: argparse.Namespace) -> int:
    from agentserve.ops.alerts import render

    sys.stdout.write(render())
    return 0


def _cmd_manifests(args: argparse.Namespace) -> int:
    from agentserve.operator.manifests import ManifestError, render

    try:
        if args.filename == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            with open(args.filename, encoding="utf-8") as f:
                text, source = f.read(), args.filename
        sys.stdout.write(render(text, args.namespace, source))
    except OSError as exc:
        print(f"agentserve manifests: {exc}", file=sys.stderr)
        return 2
    except ManifestError as exc:
        print(f"agentserve manifests: invalid AgentServingDeployment\n{exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_operator(args: argparse.Namespace) -> int:
    from agentserve.operator.handlers import run_operator

    return run_operator(
        namespaces=args.namespace or [],
        liveness=args.liveness,
        metrics_port=args.metrics_port,
        verbose=args.verbose,
        manage_crd=args.manage_crd,
        resync_seconds=args.resync_seconds,
        peering=args.peering,
    )


# The long-running components: their config model (agentserve.config) and entry point, imported
# only when that command runs so the CLI itself starts fast.
_COMPONENTS: dict[str, tuple[str, str]] = {
    "worker": ("WorkerConfig", "agentserve.worker.main:run"),
    "up": ("UpConfig", "agentserve.frontend.up:run_up"),
    "frontend": ("FrontendConfig", "agentserve.frontend.main:run_frontend"),
    "router": ("RouterConfig", "agentserve.router.main:run"),
    "planner": ("PlannerServiceConfig", "agentserve.planner.service:run"),
}


def _cmd_component(args: argparse.Namespace) -> int:
    """Load the component's config (defaults ← --config file ← flags) and run it; bad config exits 2."""
    from importlib import import_module

    from agentserve import config as settings

    model_name, entry = _COMPONENTS[args.command]
    module, _, function = entry.partition(":")
    try:
        config = settings.config_from_args(getattr(settings, model_name), args)
        run: Callable[[object], int] = getattr(import_module(module), function)
        return run(config)
    except settings.ConfigError as exc:
        print(f"agentserve {args.command}: {exc}", file=sys.stderr)
        return 2


def _cmd_trace(args: argparse.Namespace) -> int:
    from agentserve.telemetry.report import format_table, load, perfetto, summarize, total

    try:
        loaded = load(args.files)
    except OSError as exc:
        print(f"agentserve trace: {exc}", file=sys.stderr)
        return 2
    if loaded.skipped:
        print(f"agentserve trace: skipped {loaded.skipped} unreadable line(s)", file=sys.stderr)
    if args.perfetto:
        try:
            with open(args.perfetto, "w", encoding="utf-8") as f:
                json.dump(perfetto(loaded), f, separators=(",", ":"))
        except OSError as exc:
            print(f"agentserve trace: {exc}", file=sys.stderr)
            return 2
    sessions = summarize(loaded)
    if args.json:
        report = {
            "sessions": [s.to_json() for s in sessions],
            "total": total(loaded).to_json(),
            "requests": len(loaded.requests),
            "tool_events": len(loaded.tool_events),
            "skipped_lines": loaded.skipped,
        }
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(format_table(sessions, total(loaded)))
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from agentserve.profiler.command import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from agentserve import __version__

    parser = argparse.ArgumentParser(prog="agentserve", description="An open serving stack for AI agents.")
    parser.add_argument("--version", action="version", version=f"agentserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "parse",
        help="parse raw model output (stdin) into OutputEvents, one JSON object per line",
        description="Reads raw model output on stdin and prints its OutputEvents as JSON lines "
        "(schema: docs/parse-events.md). Adjacent deltas are merged unless --no-merge.",
    )
    p.add_argument("--family", required=True, help="model family or parser name (e.g. qwen3, hermes)")
    p.add_argument("--chunk-size", type=int, default=0, help="feed the parser N characters at a time")
    p.add_argument(
        "--starts-in-reasoning",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the prompt ended inside an open reasoning block (default: the family's)",
    )
    p.add_argument("--no-merge", action="store_true", help="print every event as the parser emitted it")
    p.set_defaults(handler=_cmd_parse)

    p = sub.add_parser(
        "render",
        help="render a request (stdin) into the prompt the model sees",
        description="Reads a request body on stdin and prints the rendered prompt: volatile spans "
        "stripped, past reasoning replayed by policy, the model's chat template (or the family's). "
        "With --tokens, prints the token count and block hashes as JSON instead.",
    )
    _add_prompt_flags(p)
    p.add_argument("--tokens", action="store_true", help="print token count and block hashes as JSON")
    p.set_defaults(handler=_cmd_render)

    p = sub.add_parser(
        "drift",
        help="render two consecutive requests and report where the second stops extending the first",
        description="Renders FIRST and SECOND (request bodies) and prints the prefix drift report: the "
        "first differing token, reusable tokens and the text around it. Exit status 1 when SECOND "
        "rewrites part of FIRST (plus --generated, the model's raw output for FIRST).",
    )
    _add_prompt_flags(p)
    p.add_argument("first", help="the earlier request body (JSON file)")
    p.add_argument("second", help="the later request body (JSON file)")
    p.add_argument("--generated", help="file with the model's raw output for FIRST")
    p.set_defaults(handler=_cmd_drift)

    p = sub.add_parser(
        "crd",
        help="print the AgentServingDeployment CustomResourceDefinition (YAML)",
        description="Prints the CRD generated from the spec model (agentserve.operator.spec).",
    )
    p.set_defaults(handler=_cmd_crd)

    p = sub.add_parser(
        "manifests",
        help="print the Kubernetes objects the operator would create for an AgentServingDeployment",
        description="Validates AgentServingDeployment documents against the CRD's schema and rules and "
        "prints the objects the operator would apply, as a YAML stream (a dry run). Exit code 2 on "
        "invalid input, with the offending field named.",
    )
    p.add_argument(
        "-f", "--filename", required=True, help="YAML file with AgentServingDeployments ('-': stdin)"
    )
    p.add_argument("-n", "--namespace", default="default", help="namespace when a document names none")
    p.set_defaults(handler=_cmd_manifests)

    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (kopf) for AgentServingDeployments",
        description="Runs the kopf operator (same as `kopf run -m agentserve.operator --standalone`). "
        "Needs the `operator` extra (kopf, kubernetes) and in-cluster or kubeconfig credentials.",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="namespace to watch (repeatable; default: all namespaces)",
    )
    p.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL ('' to disable)"
    )
    p.add_argument("--metrics-port", type=int, default=8081, help="port of /metrics (0 to disable)")
    p.add_argument(
        "--manage-crd",
        action="store_true",
        help="at start, server-side apply this version's CRD (keeps its schema current on upgrades; "
        "needs patch on the CRD)",
    )
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=30.0,
        help="period of the level-based resync of every AgentServingDeployment (default 30)",
    )
    p.add_argument(
        "--peering",
        metavar="NAME",
        help="run as one of several replicas: kopf peering object NAME elects the active one "
        "(default: standalone, a single replica)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(handler=_cmd_operator)

    from agentserve.config import RouterConfig, WorkerConfig, add_config_flags

    p = sub.add_parser(
        "worker",
        help="run a worker: an inference engine behind the generate API and KV events",
        description="Serves an engine (sim: no GPU; trtllm: TensorRT-LLM) over HTTP (streaming "
        "generate, /health, /ready, /metrics, /kv/snapshot) and publishes its KV events on a "
        "ZeroMQ PUB socket. See docs/worker.md.",
    )
    add_config_flags(p, WorkerConfig)
    p.set_defaults(handler=_cmd_component)

    from agentserve.config import FrontendConfig, UpConfig

    p = sub.add_parser(
        "up",
        help="run the whole stack in one process: frontend, router and sim workers on one port",
        description="Serves the Anthropic Messages, OpenAI Chat Completions and Responses APIs on one "
        "port, with an embedded router and N in-process sim workers (no GPU), and prints the base URL "
        "and ready-to-paste settings for Claude Code, Codex and OpenAI clients. See docs/frontend.md.",
    )
    add_config_flags(p, UpConfig)
    p.set_defaults(handler=_cmd_component)

    p = sub.add_parser(
        "frontend",
        help="run the frontend: the agent APIs over workers (embedded router) or a router service",
        description="Serves the agent APIs. Without --router-url the router is embedded and routes "
        "over --worker-urls (agentserve worker processes); with it, routing is the router service's. "
        "See docs/frontend.md.",
    )
    add_config_flags(p, FrontendConfig)
    p.set_defaults(handler=_cmd_component)

    p = sub.add_parser(
        "trace",
        help="summarize trace files per session; --perfetto writes a timeline",
        description="Reads JSONL trace files written by the frontend's trace sink (plain or gzip, "
        "several at once, e.g. a rotated series) and prints one row per session: turns, TTFT p50/p95, "
        "cache hit ratio, model and tool time, dispatched calls and dispatch lead time, drift events. "
        "Record schema: docs/telemetry.md.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="trace file (.jsonl or .jsonl.gz)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument(
        "--perfetto",
        metavar="OUT.json",
        help="write a Chrome/Perfetto trace-event timeline (open it in ui.perfetto.dev)",
    )
    p.set_defaults(handler=_cmd_trace)

    p = sub.add_parser(
        "router",
        help="run the router: KV-aware placement of requests on workers, for frontends",
        description="Follows the workers' KV events (ZeroMQ) and health, and serves the route API "
        "frontends call per request (/route, /finish, /worker_failed, /workers, /health, /ready, "
        "/metrics). Workers come from --workers URLs or a Kubernetes Service's EndpointSlices "
        "(--discovery kubernetes). See docs/router.md.",
    )
    add_config_flags(p, RouterConfig)
    p.set_defaults(handler=_cmd_component)

    from agentserve.config import PlannerServiceConfig

    p = sub.add_parser(
        "planner",
        help="run the planner: scale workers to hold TTFT/ITL targets from what the fleet reports",
        description="Every interval reads the workers' /load and the frontends' and routers' /metrics, "
        "predicts TTFT and ITL per worker count from an engine profile and picks the smallest count "
        "meeting the targets, never below what retained agent sessions hold. On Kubernetes (--discovery "
        "kubernetes --deployment NAME) it writes the AgentServingDeployment's scale subresource; with "
        "static --workers URLs it advises only. See docs/planner.md.",
    )
    add_config_flags(p, PlannerServiceConfig)
    p.set_defaults(handler=_cmd_component)

    from agentserve.profiler.command import add_arguments as add_profile_arguments

    p = sub.add_parser(
        "profile",
        help="measure a running worker and write its engine profile (the timing model the sim, planner "
        "and router predict with)",
        description="Sweeps prompt length, cached prefix, batch size and context and a prefill chunk "
        "under decode load through the worker API of any engine, fits the timing model, writes the "
        "profile YAML and prints measured vs modelled. --refit refits a profile's measurements; "
        "--show prints them against its model. See docs/worker.md, Engine profiles.",
    )
    add_profile_arguments(p)
    p.set_defaults(handler=_cmd_profile)

    p = sub.add_parser(
        "dashboard",
        help="print the Grafana dashboard (JSON) for agent serving",
        description="Prints the Grafana dashboard the chart ships (dashboards.enabled): traffic by API "
        "and harness, TTFT/ITL against targets, cache hit share of returning turns, prefix drift, tool "
        "dispatch lead time, KV tiers, saturation, failover, state store. See docs/operations.md.",
    )
    p.set_defaults(handler=_cmd_dashboard)

    p = sub.add_parser(
        "alerts",
        help="print the Prometheus alert rules (a rules file) for agent serving",
        description="Prints the alert rules the chart ships as a PrometheusRule (prometheusRule.enabled), "
        "as a plain Prometheus rules file. Each alert's runbook is in docs/operations.md.",
    )
    p.set_defaults(handler=_cmd_alerts)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
