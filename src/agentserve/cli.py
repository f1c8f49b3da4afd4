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


def _cmd_worker(args: argparse.Namespace) -> int:
    from agentserve.config import ConfigError, WorkerConfig, config_from_args

    try:
        config = config_from_args(WorkerConfig, args)
        from agentserve.worker.main import run

        return run(config)
    except ConfigError as exc:
        print(f"agentserve worker: {exc}", file=sys.stderr)
        return 2


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

    from agentserve.config import WorkerConfig, add_config_flags

    p = sub.add_parser(
        "worker",
        help="run a worker: an inference engine behind the generate API and KV events",
        description="Serves an engine (sim: no GPU; trtllm: TensorRT-LLM) over HTTP (streaming "
        "generate, /health, /ready, /metrics, /kv/snapshot) and publishes its KV events on a "
        "ZeroMQ PUB socket. See docs/worker.md.",
    )
    add_config_flags(p, WorkerConfig)
    p.set_defaults(handler=_cmd_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
