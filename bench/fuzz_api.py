"""Mutation fuzzer for the three agent APIs, against the in-process `agentserve up` app.

Each request is a valid harness-shaped body (Anthropic Messages, Chat Completions, Responses, with
tools, tool calls, results and reasoning) with one to three mutations at random JSON paths: a value
replaced by another type, a huge string, a lone surrogate (sent as the JSON escape `\\udcff`), deep
nesting, an extreme number, a removed key, another API's tag, or the raw bytes truncated / flipped.
Streaming and non-streaming alike. Counted: 5xx answers, error bodies not in the API's shape, and
event streams without their terminal event (Anthropic `message_stop` or `error`, Chat `[DONE]`,
Responses `response.completed` / `.incomplete` / `.failed` or `error`).

    .venv/bin/python bench/fuzz_api.py --requests 5000 --seed 17

Seeded: the same seed sends the same requests. Exits 1 when anything was counted. The generator is
importable (`mutated_request`) for the suite's hypothesis tests.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

ANTHROPIC_TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command"}},
            "required": ["command"],
        },
    },
    {"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {}}},
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
        "strict": False,
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch", "format": {"type": "text"}},
]

SEEDS: dict[str, dict[str, Any]] = {
    "/v1/messages": {
        "model": "qwen3-sim",
        "max_tokens": 1100,
        "system": [
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "user_abc_account__session_0b5c8f1e-1a2b-4c3d-8e9f-0123456789ab"},
        "messages": [
            {"role": "user", "content": "list the files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "use ls", "signature": "sig"},
                    {"type": "text", "text": "Listing."},
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.py\nb.py"},
                    {"type": "text", "text": "now read a.py"},
                ],
            },
        ],
        "temperature": 0.5,
        "stop_sequences": ["\n\nHuman:"],
    },
    "/v1/chat/completions": {
        "model": "qwen3-sim",
        "max_tokens": 64,
        "tools": CHAT_TOOLS,
        "tool_choice": "auto",
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "use ls",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": '{"command":"ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
        ],
        "temperature": 0.7,
        "stop": ["</done>"],
    },
    "/v1/responses": {
        "model": "qwen3-sim",
        "max_output_tokens": 64,
        "instructions": "You are Codex.",
        "tools": RESPONSES_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0b5c8f1e-1a2b-4c3d-8e9f-0123456789ab",
        "store": False,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "list the files"}],
            },
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "use ls"}]},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "a.py\nb.py"},
        ],
    },
}
SEEDS["/v1/messages/count_tokens"] = {
    k: v for k, v in SEEDS["/v1/messages"].items() if k not in ("max_tokens", "stream", "temperature")
}
API_OF = {
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
}
TAGS = [
    "text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "message",
    "reasoning", "function_call", "function_call_output", "custom_tool_call", "custom", "function",
    "user", "assistant", "system", "developer", "tool", "input_text", "output_text", "image_url",
    "input_image", "auto", "any", "none", "required", "enabled", "adaptive", "disabled", "namespace",
    "web_search_20250305", "json_schema", "call_1", "toolu_01", "Bash", "shell",
]  # fmt: skip
HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if len(prefix) > 24:  # a deep-nesting mutation: its inside is not worth mutating again
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _nested(rng: random.Random) -> Any:
    depth = rng.choice((40, 70, 200, 900, 5000))
    value: Any = "x"
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


def _value(rng: random.Random, old: Any) -> Any:
    """A replacement for `old`: another JSON type, an edge value, or a hostile string."""
    kind = rng.randrange(14)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice((True, False))
    if kind == 2:
        return rng.choice((0, -1, 1, 2**31, 2**63, -(2**64), 10**30))
    if kind == 3:
        return rng.choice((0.5, -0.0, 1e308, -1e308, 1.5e-300, 3.0))
    if kind == 4:
        return rng.choice(("", " ", "\x00", "a" * rng.choice((300, 5000, 200_000))))
    if kind == 5:  # a lone surrogate, alone or inside text
        return rng.choice(("\udcff", "ok \ud800 ok", "\udfff\ud83d", "emoji \ud83d\ude00 fine"))
    if kind == 6:
        return rng.choice(TAGS)
    if kind == 7:
        return []
    if kind == 8:
        return {}
    if kind == 9:
        return [old, old] if old is not None else [1]
    if kind == 10:
        return {"type": rng.choice(TAGS), "text": old}
    if kind == 11:
        return _nested(rng)
    if kind == 12 and isinstance(old, str):
        return old + "\udcff"
    return [rng.choice(TAGS), 3, None]


def _mutate(rng: random.Random, body: Any) -> Any:
    paths = _paths(body)[1:]
    if not paths:
        return _value(rng, body)
    path = rng.choice(paths)
    parent = _get(body, path[:-1])
    key = path[-1]
    action = rng.randrange(10)
    if action < 2 and isinstance(parent, dict):
        del parent[key]
    elif action == 2 and isinstance(parent, list):
        parent.insert(key, parent[key])  # a duplicate (ids, names, messages)
    elif action == 3 and isinstance(parent, dict):
        parent[rng.choice(TAGS)] = _value(rng, None)  # an unknown key
    else:
        parent[key] = _value(rng, parent[key])
    return body


@dataclass(frozen=True)
class FuzzRequest:
    endpoint: str
    stream: bool
    content: bytes


def mutated_request(rng: random.Random, endpoint: str | None = None) -> FuzzRequest:
    """One fuzzed request (endpoint, stream flag, raw JSON bytes)."""
    endpoint = endpoint or rng.choice(list(SEEDS))
    body: Any = copy.deepcopy(SEEDS[endpoint])
    stream = endpoint != "/v1/messages/count_tokens" and rng.random() < 0.5
    if stream:
        body["stream"] = True
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        body = _mutate(rng, body)
    # ensure_ascii: lone surrogates travel as the `\udcff` escapes clients send.
    try:
        content = json.dumps(body, ensure_ascii=rng.random() < 0.9).encode("utf-8", "surrogatepass")
    except RecursionError:
        content = b"[" * 100_000
    if rng.random() < 0.04:  # raw bytes: cut, flipped, or not UTF-8
        cut = rng.randrange(len(content) + 1)
        content = rng.choice((content[:cut], content[:cut] + b"\xff\xfe" + content[cut:], content[::-1]))
    return FuzzRequest(endpoint, stream, content)


# The last frame of a complete stream, per API (a frame's data may be large: Responses' terminal
# events repeat the request's tools, so the event line is what is looked at).
TERMINAL_EVENTS = {
    "anthropic": (b"message_stop", b"error"),
    "responses": (b"response.completed", b"response.incomplete", b"response.failed", b"error"),
}


def stream_complete(api: str, body: bytes) -> bool:
    """The stream ends with its API's terminal frame (after an error: the error event, then it)."""
    if api == "chat":
        return body.endswith(b"data: [DONE]\n\n")
    if not body.endswith(b"\n\n"):
        return False
    start = body.rfind(b"event: ")
    if start < 0 or (start > 0 and body[start - 1 : start] != b"\n"):
        return False
    name = body[start + 7 : body.index(b"\n", start)]
    return name in TERMINAL_EVENTS[api]


def problem(endpoint: str, status: int, content_type: str, body: bytes) -> str | None:
    """What is wrong with one answer, or None."""
    api = API_OF[endpoint]
    if status >= 500:
        return f"status {status}"
    if status >= 400:
        try:
            data = json.loads(body)
        except ValueError:
            return "error body is not JSON"
        if api == "anthropic":
            ok = data.get("type") == "error" and isinstance(data.get("error", {}).get("type"), str)
        else:
            ok = isinstance(data.get("error"), dict) and isinstance(data["error"].get("message"), str)
        return None if ok else "error body not in the API's shape"
    if content_type.startswith("text/event-stream") and not stream_complete(api, body):
        return "stream without a terminal event"
    return None


class _Causes(logging.Handler):
    """Counts the exception classes the app logs (the causes behind any 500 or cut stream)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frame = exc.__traceback__
            while frame is not None and frame.tb_next is not None:
                frame = frame.tb_next
            where = (
                f"{frame.tb_frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.tb_lineno}" if frame else "?"
            )
            self.seen[f"{type(exc).__name__} at {where}"] += 1


@dataclass
class Report:
    sent: Counter[str] = field(default_factory=Counter)
    streams: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[str, str, bytes]] = field(default_factory=list)
    causes: Counter[str] = field(default_factory=Counter)


async def run_fuzz(
    requests: int,
    seed: int,
    *,
    family: str | None = None,
    per_api: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Report:
    from agentserve.config import UpConfig
    from agentserve.frontend.http import ApiKeys
    from agentserve.frontend.up import build_up

    settings: dict[str, object] = {"port": 0, "sim_speedup": 0, "context_length": 8192}
    settings["max_body_bytes"] = 1 << 20
    if family is not None:  # another family's template renders the tools and messages
        settings |= {"family": family, "model": f"{family}-sim"}
    config = UpConfig.model_validate(settings)
    app, _ = build_up(config, keys=ApiKeys())
    rng = random.Random(seed)
    report = Report()
    endpoints = list(SEEDS)
    causes = _Causes()
    logging.getLogger().addHandler(causes)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://fuzz", timeout=60) as client:
            total = requests * (len(endpoints) if per_api else 1)
            for i in range(total):
                endpoint = endpoints[i % len(endpoints)] if per_api else None
                req = mutated_request(rng, endpoint)
                r = await client.post(req.endpoint, content=req.content, headers=HEADERS)
                report.sent[req.endpoint] += 1
                report.statuses[r.status_code] += 1
                ctype = r.headers.get("content-type", "")
                if ctype.startswith("text/event-stream"):
                    report.streams[req.endpoint] += 1
                bad = problem(req.endpoint, r.status_code, ctype, r.content)
                if bad is not None:
                    report.problems[f"{req.endpoint}: {bad}"] += 1
                    if len(report.examples) < 10:
                        report.examples.append((req.endpoint, bad, req.content[:600]))
                if progress is not None and i % 1000 == 0:
                    progress(i)
    logging.getLogger().removeHandler(causes)
    report.causes = causes.seen
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000, help="requests per endpoint")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--family", help="model family (default: qwen3); 'all': every family in turn")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # the errors we look for are counted, not printed
    if args.family == "all":
        from agentserve.families import FAMILIES

        families: list[str | None] = [f.name for f in FAMILIES]
    else:
        families = [args.family]
    failed = False
    for family in families:
        started = time.perf_counter()
        report = asyncio.run(
            run_fuzz(
                args.requests,
                args.seed,
                family=family,
                progress=lambda i: print(f"  {i} …", file=sys.stderr),
            )
        )
        elapsed = time.perf_counter() - started
        summary = {
            "seed": args.seed,
            "family": family or "qwen3",
            "requests": dict(report.sent),
            "event_streams": dict(report.streams),
            "statuses": {str(k): v for k, v in sorted(report.statuses.items())},
            "5xx": sum(v for k, v in report.statuses.items() if k >= 500),
            "problems": dict(report.problems),
            "logged_exceptions": dict(report.causes),
            "seconds": round(elapsed, 1),
        }
        if args.json:
            print(json.dumps(summary))
        else:
            for key, value in summary.items():
                print(f"{key}: {value}")
            for endpoint, bad, content in report.examples:
                print(f"\n{endpoint}: {bad}\n  {content[:400]!r}")
        failed = failed or bool(report.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
