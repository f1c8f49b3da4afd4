"""Worker transport and KV events, measured against in-process baselines taken in the same run.

    python bench/worker.py            # full run (~1–2 min)
    python bench/worker.py --quick    # smoke run

1. Startup: `agentserve worker --engine sim` until /ready, and until a first stream is served.
2. Transport: tokens/s of a zero-time sim engine consumed in-process vs through the worker service
   (uvicorn subprocess on 127.0.0.1, `WorkerClient` here) at 1, 64 and 256 concurrent streams;
   overhead per token = 1/throughput(service) - 1/throughput(in-process) (wall clock), and the
   same in CPU time (client + server process vs in-process). Framings compared at 256 streams.
   The machines these run on are shared: CPU time is the steadier number.
3. Cost per frame: the same at 256 streams with the engine yielding after every iteration (one
   token per frame), the case of a real engine at real speed.
4. KV events: 1M events published on a ZeroMQ PUB socket to a real SUB socket in another process,
   which checks the sequence numbers (lost events, gaps); and events/s the sim engine itself
   produces under cache churn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.worker.engine import (  # noqa: E402
    AllCleared,
    BlockRemoved,
    BlockStored,
    GenerateRequest,
    KvEvent,
    SamplingParams,
)
from agentserve.worker.engines.sim import SimConfig, SimEngine  # noqa: E402
from agentserve.worker.scheduler import SchedulerConfig  # noqa: E402

try:
    import uvloop

    new_loop: Any = uvloop.new_event_loop
except ImportError:  # pragma: no cover - platforms without uvloop
    new_loop = asyncio.new_event_loop

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
HOST = "127.0.0.1"


def run(coro: Any) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def engine(slice_s: float, blocks: int = 32768) -> SimEngine:
    cfg = SimConfig(
        num_blocks=blocks,
        speedup=float("inf"),
        zero_time_slice_s=slice_s,
        scheduler=SchedulerConfig(max_batch_size=256, max_num_tokens=8192),
    )
    return SimEngine(cfg)


def requests(streams: int, tokens: int, tag: str) -> list[GenerateRequest]:
    # Distinct 64-token prompts (no prefix sharing), output forced to `tokens` tokens.
    return [
        GenerateRequest(
            f"{tag}-{i}", [(i * 7 + t) % 250 + 1 for t in range(64)], SamplingParams(tokens, ignore_eos=True)
        )
        for i in range(streams)
    ]


async def consume(stream: Any) -> tuple[int, int]:
    tokens = frames = 0
    async for step in stream:
        tokens += len(step.token_ids)
        frames += 1
    return tokens, frames


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    tokens: int
    frames: int
    wall: float
    cpu: float  # this process (+ the server process for service runs)
    server_cpu: float = 0.0


async def in_process(streams: int, tokens: int, slice_s: float) -> Run:
    eng = engine(slice_s)
    await eng.start()
    t0, c0 = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(consume(eng.generate(r)) for r in requests(streams, tokens, "in")))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    await eng.stop()
    return Run(sum(r[0] for r in results), sum(r[1] for r in results), wall, cpu)


async def through_service(url: str, pid: int, streams: int, tokens: int, framing: str) -> Run:
    from agentserve.worker.client import WorkerClient

    async with WorkerClient(url, framing=framing) as client:  # type: ignore[arg-type]
        await consume(await client.generate(GenerateRequest("warm", [1, 2, 3], SamplingParams(8))))

        async def one(r: GenerateRequest) -> tuple[int, int]:
            return await consume(await client.generate(r))

        s0, t0, c0 = proc_cpu(pid), time.perf_counter(), time.process_time()
        results = await asyncio.gather(*(one(r) for r in requests(streams, tokens, f"http{time.time_ns()}")))
        wall, cpu, server = time.perf_counter() - t0, time.process_time() - c0, proc_cpu(pid) - s0
    return Run(sum(r[0] for r in results), sum(r[1] for r in results), wall, cpu + server, server)


def serve(port: int, slice_s: float) -> None:
    """Subprocess mode: a worker service on a zero-time sim engine with the given slice."""
    import uvicorn

    from agentserve.worker.service import create_app

    app = create_app(engine(slice_s))
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


class Server:
    def __init__(self, slice_s: float) -> None:
        import socket

        with socket.socket() as s:
            s.bind((HOST, 0))
            self.port = s.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--slice", str(slice_s)], env=ENV
        )
        wait_ready(self.url, self.proc)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def wait_ready(url: str, proc: subprocess.Popen[bytes], limit_s: float = 30) -> float:
    import urllib.request

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError("the worker exited")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError("the worker did not become ready")


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: r.wall)


# --------------------------------------------------------------------------------------------------


def bench_startup(reps: int) -> dict[str, float]:
    import socket
    import urllib.request

    ready, first = [], []
    for _ in range(reps):
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind((HOST, 0))
                ports.append(s.getsockname()[1])
        url = f"http://{HOST}:{ports[0]}"
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentserve", "worker", "--engine", "sim", "--host", HOST,
             "--port", str(ports[0]), "--kv-events-port", str(ports[1])],
            env=ENV, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            ready.append(wait_ready(url, proc))
            body = json.dumps({"token_ids": [1, 2, 3], "sampling": {"max_tokens": 16}}).encode()
            req = urllib.request.Request(url + "/generate", body, {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                lines = r.read().splitlines()
            assert json.loads(lines[-1])["finish_reason"] in ("stop", "length")
            first.append(time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "ready_s": min(ready),
        "first_stream_s": min(first),
        "first_stream_median_s": sorted(first)[len(first) // 2],
    }


def bench_transport(
    configs: list[tuple[int, int]], framings: list[str], reps: int, slice_s: float
) -> list[dict[str, Any]]:
    rows = []
    server = Server(slice_s)
    run(in_process(64, 200, slice_s))  # warm-up: first-call costs out of the baselines
    try:
        for streams, tokens in configs:
            base = best([run(in_process(streams, tokens, slice_s)) for _ in range(reps)])
            for framing in framings if streams == max(c[0] for c in configs) else framings[:1]:
                http = best(
                    [
                        run(through_service(server.url, server.proc.pid, streams, tokens, framing))
                        for _ in range(reps)
                    ]
                )
                rows.append(
                    {
                        "streams": streams,
                        "framing": framing,
                        "tokens": http.tokens,
                        "inproc_tok_s": base.tokens / base.wall,
                        "service_tok_s": http.tokens / http.wall,
                        "ratio": (http.tokens / http.wall) / (base.tokens / base.wall),
                        "tokens_per_frame": http.tokens / http.frames,
                        "overhead_wall_us": (http.wall / http.tokens - base.wall / base.tokens) * 1e6,
                        "overhead_cpu_us": (http.cpu / http.tokens - base.cpu / base.tokens) * 1e6,
                        "server_cpu_us_per_frame": http.server_cpu / http.frames * 1e6,
                        "client_cpu_us_per_frame": (http.cpu - http.server_cpu) / http.frames * 1e6,
                    }
                )
    finally:
        server.close()
    return rows


# -- KV events ---------------------------------------------------------------------------------------


def subscribe(endpoint: str, total: int, timeout_s: float) -> None:
    """Subprocess mode: count KV events by sequence number on a real SUB socket; print JSON."""
    import zmq

    from agentserve.worker.kvwire import GapDetector, decode_batch, peek_range

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"kv")
    sock.setsockopt(zmq.SUBSCRIBE, b"probe")
    sock.connect(endpoint)
    gaps = GapDetector()
    decoded = 0
    t_first = t_last = 0.0
    ready_sent = False
    deadline = time.monotonic() + timeout_s
    while gaps.received + gaps.lost < total and time.monotonic() < deadline:
        if not sock.poll(1000):
            continue
        frames = sock.recv_multipart()
        if frames[0] == b"probe":
            if not ready_sent:
                print("ready", flush=True)
                ready_sent = True
            continue
        if not t_first:
            t_first = time.perf_counter()
        first, count = peek_range(frames)
        gaps.feed(first, count)
        if first % 1000 < count:  # decode a sample fully to check the payload too
            decoded += len(decode_batch(frames))
        t_last = time.perf_counter()
    result = {"received": gaps.received, "lost": gaps.lost, "gaps": gaps.gaps, "decoded": decoded,
              "last_seq": (gaps.expected or 1) - 1, "seconds": t_last - t_first}  # fmt: skip
    print(json.dumps(result), flush=True)
    sock.close(0)
    ctx.term()


def bench_events(total: int, batch: int) -> dict[str, Any]:
    import zmq

    from agentserve.worker.publisher import KvEventPublisher

    pub = KvEventPublisher(f"tcp://{HOST}:0")
    sub = subprocess.Popen(
        [sys.executable, __file__, "--subscribe", pub.endpoint, "--total", str(total)],
        env=ENV, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Probe until the subscriber's subscription has reached us (no slow-joiner loss).
        assert sub.stdout is not None
        os.set_blocking(sub.stdout.fileno(), False)
        line = ""
        for _ in range(3000):
            pub._sock.send_multipart([b"probe", b"", b""], flags=zmq.NOBLOCK)
            time.sleep(0.01)
            line = sub.stdout.readline()
            if line.strip() == "ready":
                break
        assert line.strip() == "ready", "subscriber never connected"
        os.set_blocking(sub.stdout.fileno(), True)
        seq = 0
        t0 = time.perf_counter()
        while seq < total:
            events: list[KvEvent] = []
            for _ in range(min(batch, total - seq)):
                seq += 1
                if seq % 2:
                    events.append(BlockStored(seq, (seq * 2654435761 % 2**64,), seq - 1, 32))
                else:
                    events.append(BlockRemoved(seq, ((seq - 1) * 2654435761 % 2**64,)))
            pub.publish(events)
        publish_s = time.perf_counter() - t0
        out, _ = sub.communicate(timeout=120)
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if sub.poll() is None:
            sub.kill()
        pub.close()
    return {
        "events": total,
        "batch": batch,
        "messages": pub.messages_published,
        "publish_events_per_s": total / publish_s,
        "received": result["received"],
        "lost": result["lost"],
        "gaps": result["gaps"],
        "receive_events_per_s": result["received"] / result["seconds"] if result["seconds"] else 0.0,
        "decoded_sample": result["decoded"],
    }


async def sim_event_rate(streams: int, tokens: int) -> dict[str, float]:
    eng = engine(5e-3, blocks=2048)  # small cache: constant eviction
    events = blocks = 0
    sub = eng.kv_events()

    async def count() -> None:
        nonlocal events, blocks
        async for batch in sub:
            events += len(batch)
            blocks += sum(len(e.block_hashes) for e in batch if not isinstance(e, AllCleared))

    await eng.start()
    counter = asyncio.ensure_future(count())
    t0 = time.perf_counter()
    reqs = [
        GenerateRequest(
            f"c{i}", [(i * 131 + t) % 50_000 for t in range(512)], SamplingParams(tokens, ignore_eos=True)
        )
        for i in range(streams)
    ]
    await asyncio.gather(*(consume(eng.generate(r)) for r in reqs))
    wall = time.perf_counter() - t0
    await eng.stop()
    await counter
    return {"events": events, "events_per_s": events / wall, "blocks_per_s": blocks / wall}


# --------------------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repetitions (smoke test)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--slice", type=float, default=5e-3, help=argparse.SUPPRESS)
    ap.add_argument("--subscribe", help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=1_000_000, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.slice)
        return
    if args.subscribe:
        subscribe(args.subscribe, args.total, timeout_s=120)
        return

    reps = 1 if args.quick else 3
    scale = 10 if args.quick else 1
    configs = [(1, 50_000 // scale), (64, 2000 // scale), (256, 1000 // scale)]
    framings = ["msgpack", "ndjson", "sse"]
    results: dict[str, Any] = {}

    results["startup"] = bench_startup(reps)
    s = results["startup"]
    print("## Startup: agentserve worker --engine sim\n")
    print(table(["until /ready", "until a first stream is served (best)", "(median)"],
                [[f"{s['ready_s']:.2f} s", f"{s['first_stream_s']:.2f} s",
                  f"{s['first_stream_median_s']:.2f} s"]]))  # fmt: skip

    results["transport"] = bench_transport(configs, framings, reps, 5e-3)
    print("\n## Transport: zero-time sim, in-process vs through the worker service\n")
    print(table(
        ["streams", "framing", "in-process tok/s", "service tok/s", "ratio", "tokens/frame",
         "overhead µs/token (wall)", "overhead µs/token (CPU)"],
        [[str(r["streams"]), r["framing"], f"{r['inproc_tok_s']:,.0f}", f"{r['service_tok_s']:,.0f}",
          f"{r['ratio']:.2f}", f"{r['tokens_per_frame']:.1f}", f"{r['overhead_wall_us']:.1f}",
          f"{r['overhead_cpu_us']:.1f}"] for r in results["transport"]],
    ))  # fmt: skip

    results["per_frame"] = bench_transport([(256, 1000 // scale)], framings, reps, 0.0)
    print("\n## Cost per frame: one token per frame (engine yields after every iteration), 256 streams\n")
    print(table(
        ["framing", "tokens/frame", "server CPU µs/frame", "client CPU µs/frame", "overhead µs/token (CPU)"],
        [[r["framing"], f"{r['tokens_per_frame']:.1f}", f"{r['server_cpu_us_per_frame']:.1f}",
          f"{r['client_cpu_us_per_frame']:.1f}", f"{r['overhead_cpu_us']:.1f}"]
         for r in results["per_frame"]],
    ))  # fmt: skip

    total = 100_000 if args.quick else 1_000_000
    results["events"] = [bench_events(total, batch) for batch in (16, 256)]
    results["sim_events"] = run(sim_event_rate(64, 200 if args.quick else 1000))
    print(f"\n## KV events: {total:,} events, PUB → real SUB socket in another process\n")
    print(table(
        ["events/message", "messages", "published events/s", "received", "lost", "gaps"],
        [[str(e["batch"]), f"{e['messages']:,}", f"{e['publish_events_per_s']:,.0f}", f"{e['received']:,}",
          str(e["lost"]), str(e["gaps"])] for e in results["events"]],
    ))  # fmt: skip
    se = results["sim_events"]
    print(f"\nSim engine under cache churn (64 streams, 2048-block cache): {se['events']:,} events, "
          f"{se['events_per_s']:,.0f} events/s carrying {se['blocks_per_s']:,.0f} blocks/s")  # fmt: skip

    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "worker.json").write_text(json.dumps(results, indent=2))
    lost = sum(e["lost"] for e in results["events"])
    worst = max(r["overhead_cpu_us"] for r in results["transport"] if r["streams"] == 256)
    print(f"\nAcceptance: startup {s['first_stream_s']:.2f} s (< 2 s), "
          f"overhead at 256 streams ≤ {worst:.1f} µs/token CPU (≤ 20), events lost: {lost}")  # fmt: skip


if __name__ == "__main__":
    main()
