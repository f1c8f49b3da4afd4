"""The `agentserve` command line: one entry point, one subcommand per job.

Each subcommand only parses its flags and calls into the module that does the work, so the CLI
stays a thin edge around pure code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

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


def _cmd_crd(args: argparse.Namespace) -> int:
    from agentserve.operator.crd import crd_yaml, helm_crd_template

    sys.stdout.write(helm_crd_template() if args.helm else crd_yaml())
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
    )


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
        "crd",
        help="print the AgentServingDeployment CustomResourceDefinition (YAML)",
        description="Prints the CRD generated from the spec model (agentserve.operator.spec).",
    )
    p.add_argument("--helm", action="store_true", help="print the Helm chart's CRD template instead")
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
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(handler=_cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
