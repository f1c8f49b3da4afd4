"""Speculative prefill (`nvext.agent_hints.speculative_prefill`, issue 23 item 8): the next turn's TTFT
with and without the hint, in the same run.

    PYTHONPATH=src python bench/speculative.py            # 8 sessions per mode, real-speed sim
    PYTHONPATH=src python bench/speculative.py --quick    # 3 per mode

`agentserve up`'s app (2 sim workers at the sim's real speed, the default engine profile) on uvicorn
in this process. Each session: a system prompt of ~6K tokens unique to it (no cross-session cache),
turn 1 asks and the scripted model answers with a tool call; the "tool" runs for `--tool-ms`
(the warm-up's window); turn 2 sends the history plus a ~1K-token tool result, streamed, and the
client times its first chunk with content. Modes alternate session by session (hint, none, hint, …)
so drift in the machine's speed hits both. Printed: median turn-2 TTFT and cached prompt tokens per
mode, and their ratio.

What to expect from the sim: it keeps a finished turn's output blocks in its KV pool anyway, so a
warm-up adds what the template writes after the output (end of turn, the next message's header) —
at most a block or two of prefill. An engine that does not keep generated tokens' KV, or a session
whose blocks were evicted during a long tool call, gains the whole prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.config import UpConfig  # noqa: E402
from agentserve.frontend.http import ApiKeys  # noqa: E402
from agentserve.frontend.up import build_up  # noqa: E402

WORDS = ("file", "path", "command", "tool", "output", "read", "write", "edit", "search", "result", "error")
CALL = '<tool_call>\n{"name": "Read", "arguments": {"path": "src/main.py"}}\n</tool_call><|im_end|>'
TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def serve(config: UpConfig) -> tuple[str, uvicorn.Server, threading.Thread]:
    app, _ = build_up(config, keys=ApiKeys())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", server, thread


def ttft(client: httpx.Client, body: dict[str, Any]) -> tuple[float, int]:
    """Seconds to the first content chunk, and the prompt's cached tokens (from the usage chunk)."""
    start = time.perf_counter()
    first = None
    cached = 0
    stream = body | {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=stream) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None, "no content"
    return first, cached


def session(
    client: httpx.Client, rng: random.Random, index: int, hinted: bool, tool_s: float
) -> tuple[float, int]:
    nvext: dict[str, Any] = {"agent_context": {"session_id": f"bench-{index}"}}
    if hinted:
        nvext["agent_hints"] = {"speculative_prefill": True}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Session {index}. " + prose(rng, 4500)},
        {"role": "user", "content": "CALLREAD please look at the main module"},
    ]
    first = client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS, "nvext": nvext}
    )
    first.raise_for_status()
    message = first.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    time.sleep(tool_s)  # the tool runs: the warm-up's window
    messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": prose(rng, 800)}]
    return ttft(client, {"model": "m", "messages": messages, "tools": TOOLS, "nvext": nvext})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sessions", type=int, default=8, help="sessions per mode")
    parser.add_argument("--tool-ms", type=float, default=500.0)
    parser.add_argument("--speedup", type=float, default=1.0, help="sim clock speedup")
    args = parser.parse_args()
    sessions = 3 if args.quick else args.sessions
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.yaml"
        rules = [{"match": "^CALLREAD", "output": CALL}]
        script.write_text(yaml.safe_dump({"rules": rules, "default": "Read it: all fine.<|im_end|>"}))
        config = UpConfig.model_validate({"port": 0, "script": str(script), "sim_speedup": args.speedup})
        url, server, thread = serve(config)
        rng = random.Random(23)
        results: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                session(client, rng, -1, False, 0)  # warm the process (imports, first compile)
                for i in range(sessions * 2):
                    hinted = i % 2 == 0
                    results[hinted].append(session(client, rng, i, hinted, args.tool_ms / 1000))
        finally:
            server.should_exit = True
            thread.join(15)
    print(
        f"speculative prefill, {sessions} sessions per mode, tool {args.tool_ms:.0f} ms, "
        f"sim speedup {args.speedup}"
    )
    print("| mode | turn-2 TTFT median (ms) | cached prompt tokens (median) |")
    print("|---|---|---|")
    medians = {}
    for hinted in (False, True):
        times = [t for t, _ in results[hinted]]
        cached = [c for _, c in results[hinted]]
        medians[hinted] = statistics.median(times)
        name = "speculative_prefill" if hinted else "no hint"
        print(f"| {name} | {medians[hinted] * 1000:.1f} | {statistics.median(cached):.0f} |")
    print(f"TTFT ratio hint / none: {medians[True] / medians[False]:.3f}")


if __name__ == "__main__":
    main()
