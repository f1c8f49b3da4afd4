"""The frontend's cost per token: the full stack in one process vs the engine alone, same run.

    python bench/frontend.py            # full run (~1.5 min)
    python bench/frontend.py --quick    # smoke run

The stack is `agentserve up`'s app (frontend + embedded router + 2 zero-time sim workers) in a server
subprocess on 127.0.0.1 (uvicorn, uvloop); this process is the load: N concurrent streams of one API,
read with a lean HTTP/1.1 client (`agentserve.worker.http1`, no SSE parsing: the token count comes
from the usage in the stream's last frames). The baseline is the same two sim engines, same prompts,
same outputs, consumed in-process with nothing on top, measured in this run.

Per API (Anthropic Messages, Chat Completions, Responses) and concurrency (1, 64, 256 streams):
tokens/s through the stack, the ratio to the engine alone, and the frontend's added cost per token,

    added µs/token (wall) = 1/throughput(stack) − 1/throughput(engine alone)
    added µs/token (CPU)  = server CPU / token − engine-alone CPU / token

(the second is steadier on a shared machine: it does not count the load generator). At N streams each
stream sees about N × that per token. Two engine settings:

- `merged`: the sim runs iterations back to back for 5 ms before yielding, so a step carries every
  token produced meanwhile (a fast engine ahead of its consumer);
- `per-token` (`--slice 0`): the engine yields after every iteration, one token per step per stream,
  which is what a real engine at real speed delivers: the cost per frame is the number to plan with.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.config import UpConfig  # noqa: E402
from agentserve.worker.engine import GenerateRequest, SamplingParams  # noqa: E402

try:
    import uvloop

    new_loop: Any = uvloop.new_event_loop
except ImportError:  # pragma: no cover - platforms without uvloop
    new_loop = asyncio.new_event_loop

HOST = "127.0.0.1"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
WORKERS = 2
# What the sim says: a short think block, then more words than any request asks for.
OUTPUT = "<think>\nWrite it out.\n</think>\n\n" + "word " * 2500
APIS = ("anthropic", "chat", "responses")
PATHS = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
# The last frame of a stream carries its output token count.
USAGE = re.compile(rb'"(?:output_tokens|completion_tokens)":(\d+)')
END = {"anthropic": b"message_stop", "chat": b"[DONE]", "responses": b"response.incomplete"}


def config(slice_s: float, scenario: str) -> UpConfig:
    return UpConfig.model_validate(
        {"workers": WORKERS, "sim_speedup": 0, "script": scenario, "port": 0, "ping_interval_s": 0}
    )


def scenario_file() -> str:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "bench-scenario.json"
    path.write_text(json.dumps({"rules": [], "default": OUTPUT}))
    return str(path)


def body(api: str, i: int, tokens: int) -> dict[str, Any]:
    text = f"request {i}: please write a long answer about the stack, with many words."
    if api == "anthropic":
        return {
            "model": "m",
            "max_tokens": tokens,
            "stream": True,
            "messages": [{"role": "user", "content": text}],
        }
    if api == "chat":
        return {
            "model": "m",
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": text}],
        }
    return {"model": "m", "max_output_tokens": tokens, "stream": True, "input": text}


def engines(slice_s: float, scenario: str) -> dict[str, Any]:
    """The `up` sim workers, with their output planned once: every request gets the same text, and
    tokenizing it (and splitting it into per-token pieces) per request would cost more than the
    frontend does per token, in the baseline and the stack alike."""
    from agentserve.frontend.up import load_pipeline, sim_engines

    cfg = config(slice_s, scenario)
    built = sim_engines(cfg, load_pipeline(cfg))
    for engine in built.values():
        engine.config = replace(engine.config, zero_time_slice_s=slice_s)  # type: ignore[attr-defined]
        plan = engine._plan  # type: ignore[attr-defined]
        planned: dict[int, Any] = {}

        def cached(
            request: GenerateRequest, prompt: list[int], plan: Any = plan, planned: Any = planned
        ) -> Any:
            key = request.sampling.max_tokens
            if key not in planned:
                planned[key] = plan(request, prompt)
            return planned[key]

        engine._plan = cached  # type: ignore[attr-defined]
    return built


# -- the server subprocess ---------------------------------------------------------------------


def serve(slice_s: float, scenario: str) -> None:
    import uvicorn

    from agentserve.frontend.up import build_up

    app, _ = build_up(config(slice_s, scenario), engines=engines(slice_s, scenario))
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    print(f"PORT {port}", flush=True)
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False, loop="uvloop")


class Server:
    def __init__(self, slice_s: float, scenario: str) -> None:
        cmd = [sys.executable, __file__, "--serve", "--slice", str(slice_s), "--scenario", scenario]
        self.proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the server did not start: {line!r}")
        self.url = f"http://{HOST}:{int(line.split()[1])}"
        self._wait_ready()

    def _wait_ready(self) -> None:
        import urllib.request

        for _ in range(3000):
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("the server did not become ready")

    def cpu(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- measurements --------------------------------------------------------------------------------


@dataclass
class Run:
    tokens: int
    frames: int  # engine steps (baseline) / HTTP reads (stack)
    wall: float
    cpu: float  # engine-alone: this process; stack: the server process

    @property
    def rate(self) -> float:
        return self.tokens / self.wall


async def engine_alone(slice_s: float, scenario: str, streams: int, per_stream: int, tokens: int) -> Run:
    from agentserve.frontend.up import load_pipeline

    pipeline = load_pipeline(config(slice_s, scenario))
    built = list(engines(slice_s, scenario).values())
    for engine in built:
        await engine.start()
    from agentserve.api.chat import decode_chat
    from agentserve.frontend.plan import generation_hints
    from agentserve.prompt.pipeline import render_prompt

    def request(i: int) -> GenerateRequest:
        conversation = decode_chat(body("chat", i, tokens)).conversation
        prompt = render_prompt(conversation, pipeline)
        hints = generation_hints(conversation)
        return GenerateRequest(f"r{i}", prompt.token_ids, SamplingParams(tokens), hints=hints)

    requests = [request(i) for i in range(streams * per_stream)]

    async def one_stream(s: int) -> tuple[int, int]:
        count = frames = 0
        for k in range(per_stream):
            i = s * per_stream + k
            async for step in built[i % len(built)].generate(requests[i]):
                count += len(step.token_ids)
                frames += 1
        return count, frames

    t0, c0 = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(one_stream(s) for s in range(streams)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for engine in built:
        await engine.stop()
    return Run(sum(r[0] for r in results), sum(r[1] for r in results), wall, cpu)


async def through_stack(server: Server, api: str, streams: int, per_stream: int, tokens: int) -> Run:
    from agentserve.worker.http1 import Http1Pool

    pool = Http1Pool(server.url)
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}

    async def request(i: int) -> tuple[int, int]:
        payload = json.dumps(body(api, i, tokens)).encode()
        response = await pool.request("POST", PATHS[api], headers=headers, body=payload)
        assert response.status == 200, response.status
        last: collections.deque[bytes] = collections.deque(maxlen=4)
        reads = 0
        while (chunk := await response.read_some()) is not None:
            last.append(chunk)
            reads += 1
        tail = b"".join(last)[-131072:]  # a Responses stream's last event repeats the whole output
        assert END[api] in tail, tail[-300:]
        counts = USAGE.findall(tail)
        return int(counts[-1]), reads

    async def one_stream(s: int) -> tuple[int, int]:
        count = reads = 0
        for k in range(per_stream):
            n, r = await request(s * per_stream + k)
            count += n
            reads += r
        return count, reads

    await request(10**6)  # warm: connections, caches
    c0, t0 = server.cpu(), time.perf_counter()
    results = await asyncio.gather(*(one_stream(s) for s in range(streams)))
    wall, cpu = time.perf_counter() - t0, server.cpu() - c0
    await pool.aclose()
    return Run(sum(r[0] for r in results), sum(r[1] for r in results), wall, cpu)


def run(coro: Any) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def plan(streams: int, quick: bool) -> tuple[int, int]:
    """(requests per stream, tokens per request): ~100K tokens per cell (a tenth with --quick)."""
    tokens = 2048 if streams == 1 else 512
    per_stream = max(1, (100_000 // (streams * tokens)))
    if quick:
        per_stream = max(1, per_stream // 10)
    return per_stream, tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 64, 256])
    parser.add_argument("--apis", nargs="*", default=list(APIS), choices=APIS)
    parser.add_argument("--slices", type=float, nargs="*", default=[5e-3, 0.0], help="sim yield slices (s)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--slice", type=float, default=5e-3, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.slice, args.scenario)
        return

    scenario = scenario_file()
    rows = []
    for slice_s in args.slices:
        label = "per-token" if slice_s == 0 else "merged"
        server = Server(slice_s, scenario)
        try:
            for streams in args.streams:
                per_stream, tokens = plan(streams, args.quick)
                base = run(engine_alone(slice_s, scenario, streams, per_stream, tokens))
                for api in args.apis:
                    stack = run(through_stack(server, api, streams, per_stream, tokens))
                    assert stack.tokens == base.tokens, (stack.tokens, base.tokens)
                    wall = (1 / stack.rate - 1 / base.rate) * 1e6
                    cpu = (stack.cpu / stack.tokens - base.cpu / base.tokens) * 1e6
                    rows.append((label, api, streams, base, stack, wall, cpu))
                    print(
                        f"{label:9} {api:9} {streams:3} streams: engine {base.rate:9,.0f} tok/s, "
                        f"stack {stack.rate:9,.0f} tok/s, +{wall:5.1f} µs/token wall, +{cpu:5.1f} CPU",
                        flush=True,
                    )
        finally:
            server.close()

    print()
    print(
        "| engine | API | streams | engine alone tok/s | stack tok/s | ratio | tokens/step (engine) | "
        "added µs/token (wall) | added µs/token (CPU) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, api, streams, base, stack, wall, cpu in rows:
        ratio = stack.rate / base.rate
        print(
            f"| {label} | {api} | {streams} | {base.rate:,.0f} | {stack.rate:,.0f} | {ratio:.2f} | "
            f"{base.tokens / base.frames:.1f} | {wall:.1f} | {cpu:.1f} |"
        )
    worst = max((w for label, _, s, _, _, w, _ in rows if s == 256 and label == "merged"), default=None)
    if worst is not None:
        verdict = "meets" if worst <= 20 else "MISSES"
        print(f"\nAcceptance (≤ 20 µs/token at 256 streams, zero-time sim): worst {worst:.1f}: {verdict}")


if __name__ == "__main__":
    main()
