"""agentserve next to NVIDIA Dynamo 1.6.1, both deployed as separate processes, same load, same run.

    python bench/peers.py            # 1/64/256 streams, Chat and Anthropic, 3 alternating rounds
    python bench/peers.py --quick    # 64 and 256 streams, Chat, 1 round, short windows
    python bench/peers.py --streams 1024 --prompt-tokens 2000 --workers 4 --processes 2

Dynamo: its Rust frontend (`python -m dynamo.frontend --discovery-backend file --request-plane tcp
--event-plane zmq --enable-anthropic-api`) over its Rust mock engine (`python -m dynamo.mocker
--speedup-ratio 1000`). agentserve: `agentserve frontend --worker-urls …` over `agentserve worker
--engine sim --sim-speedup 1000` (a scripted output long enough for every request to reach
`max_tokens`; Dynamo is sent `ignore_eos`). Both read the same tiny model directory built here from
agentserve's embedded tokenizer (tokenizer.json, a ChatML template, a config.json).

Dynamo is installed on first use into its own virtual environment under
~/.cache/agentserve-peers/ (`pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1`, then
their runtime requirements from the wheels' metadata except `aisimulate`, whose wheel is a stub that
downloads from an index this machine cannot reach; the mocker runs without it).

The load is this process: N concurrent streams, each a keep-alive HTTP/1.1 connection sending
streaming requests back to back for a time window (`agentserve.worker.http1`, the C `httptools`
parser; uvloop). Per point: delivered tokens/s (the usage's output token count over the window),
TTFT p50/p99 (request sent → first read carrying output text), inter-token latency p50/p99 (gaps
between reads carrying output text, divided by the tokens they carried when the stream says), the
server's CPU per 1000 tokens over its whole process trees (frontend + workers + children, from
/proc), and the client's own CPU (to see whether the load generator saturates). Stacks alternate
within each round (order flipped every round); the table shows medians over rounds. A PNG goes to
bench/results/peers.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.worker.http1 import Http1Pool  # noqa: E402
from agentserve.worker.profiles import DEFAULT_PROFILE, load_profile  # noqa: E402

try:
    import uvloop

    new_loop: Any = uvloop.new_event_loop
except ImportError:  # pragma: no cover - platforms without uvloop
    new_loop = asyncio.new_event_loop

HOST = "127.0.0.1"
DYNAMO_VERSION = "1.6.1"
CACHE = Path(os.environ.get("AGENTSERVE_PEERS_CACHE", Path.home() / ".cache" / "agentserve-peers"))
MODEL = "peer-model"
# Runtime requirements that are not needed (or installable) here, by name.
SKIP_REQUIREMENTS = {"aisimulate"}
PATHS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages"}
# Output text in a read: Chat content/reasoning deltas, Anthropic text/thinking deltas.
TEXT = {
    "chat": re.compile(rb'"(?:content|reasoning_content)":"[^"]'),
    "anthropic": re.compile(rb'"type":"(?:text_delta|thinking_delta)"'),
}
USAGE = {
    "chat": re.compile(rb'"completion_tokens":(\d+)'),
    "anthropic": re.compile(rb'"output_tokens":(\d+)'),
}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# -- Dynamo's environment and the model directory -----------------------------------------------


def _requirements(wheel: Path) -> list[str]:
    """Unconditional `Requires-Dist` lines of a wheel (extras skipped, markers kept)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()
        if name in SKIP_REQUIREMENTS or name.startswith("ai-dynamo"):
            continue
        out.append(req)
    return out


def dynamo_python() -> Path:
    """The Python of Dynamo's virtual environment, created on first use."""
    venv = CACHE / f"dynamo-{DYNAMO_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if marker.exists():
        return python
    print(f"installing Dynamo {DYNAMO_VERSION} into {venv} (once)", flush=True)
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pins = [f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *pins], check=True
    )
    found = [w for w in wheels.glob("ai_dynamo*.whl") if f"-{DYNAMO_VERSION}-" in w.name]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", *map(str, found)], check=True)
    reqs = sorted({r for w in found for r in _requirements(w)})
    subprocess.run([*pip, *reqs], check=True)
    marker.write_text("\n".join(reqs) + "\n")
    return python


def model_dir(where: Path) -> Path:
    """A tiny Hugging Face-style model directory around agentserve's embedded tokenizer."""
    from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER

    d = where / MODEL
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(EMBEDDED_TOKENIZER, d / "tokenizer.json")
    vocab = json.loads(EMBEDDED_TOKENIZER.read_text())
    size = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    eos = next(t["id"] for t in vocab["added_tokens"] if t["content"] == "<|im_end|>")
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": CHATML,
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "pad_token": "<|endoftext|>",
                "model_max_length": 32768,
            }
        )
    )
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": size,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "max_position_embeddings": 32768,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }
    (d / "config.json").write_text(json.dumps(config))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return d


# -- the stacks -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_cpu(roots: Sequence[int]) -> float:
    """User + system CPU seconds of the process trees under `roots` (live processes)."""
    kids = _children()
    tick = os.sysconf("SC_CLK_TCK")
    total, stack, seen = 0.0, list(roots), set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
        stack.extend(kids.get(pid, ()))
    return total


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except OSError:
        return 0, b""


@dataclass
class Stack:
    name: str
    url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu(self) -> float:
        return tree_cpu([p.pid for p in self.procs])

    def check(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{self.name}: process {p.args!r} exited ({p.returncode})")

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _wait(stack: Stack, ready: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check()
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{stack.name} did not become ready in {timeout} s")


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or dict(os.environ))


def start_agentserve(
    model: Path,
    workers: int,
    processes: int,
    logs: Path,
    catch_up: float | None = None,
    *,
    transport: str = "mux",
) -> Stack:
    """`transport`: the frontend's worker transport (mux: one connection per worker; http: one
    response per request; the `agentserve-http` stack of `--with-http`)."""
    exe = str(Path(sys.executable).with_name("agentserve"))
    script = logs / "scenario.json"
    script.write_text(json.dumps({"rules": [], "default": "word " * 4000}))
    port = free_port()
    name = "agentserve" if transport == "mux" else f"agentserve-{transport}"
    stack = Stack(name, f"http://{HOST}:{port}")
    urls = []
    for i in range(workers):
        wport, kport = free_port(), free_port()
        cmd = [exe, "worker", "--engine", "sim", "--sim-speedup", "1000", "--sim-script", str(script)]
        cmd += ["--model", MODEL, "--model-path", str(model), "--family", "qwen3", "--host", HOST]
        cmd += ["--port", str(wport), "--kv-events-port", str(kport)]
        if catch_up is not None:
            cmd += ["--sim-catch-up-s", str(catch_up)]
        stack.procs.append(_spawn(cmd, logs / f"{name}-worker-{i}.log"))
        urls.append(f"http://{HOST}:{wport}")
    cmd = [exe, "frontend", "--model", MODEL, "--model-path", str(model), "--family", "qwen3"]
    cmd += ["--host", HOST, "--port", str(port), "--ping-interval-s", "0"]
    for u in urls:
        cmd += ["--worker-urls", u]
    if processes > 1:
        url, redis = _redis(logs)
        stack.procs.append(redis)  # its CPU is the stack's too
        cmd += ["--processes", str(processes), "--state-url", url]
    env = {**os.environ, "AGENTSERVE_WORKER_TRANSPORT": transport}
    stack.procs.append(_spawn(cmd, logs / f"{name}-frontend.log", env))
    _wait(stack, lambda: _get(stack.url + "/ready")[0] == 200)
    return stack


def _redis(logs: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A redis-server for `--processes` (the shared state store they need)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("--processes > 1 needs redis-server (./scripts/install-redis)")
    port = free_port()
    cmd = [exe, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    proc = _spawn(cmd, logs / "redis.log")
    time.sleep(0.5)
    return f"redis://{HOST}:{port}/0", proc


def start_dynamo(model: Path, workers: int, logs: Path) -> Stack:
    python = str(dynamo_python())
    port = free_port()
    env = {**os.environ, "DYN_FILE_KV": str(logs / "dynamo-kv"), "DYN_LOG": "warn"}
    stack = Stack("dynamo", f"http://{HOST}:{port}")
    planes = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    for i in range(workers):
        cmd = [python, "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", MODEL]
        cmd += ["--speedup-ratio", "1000", *planes]
        stack.procs.append(_spawn(cmd, logs / f"dynamo-mocker-{i}.log", env))
    cmd = [python, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(port), *planes]
    cmd += ["--enable-anthropic-api"]
    if workers > 1:
        cmd += ["--router-mode", "kv"]
    stack.procs.append(_spawn(cmd, logs / "dynamo-frontend.log", env))

    def ready() -> bool:
        status, body = _get(stack.url + "/v1/models")
        return status == 200 and MODEL.encode() in body

    _wait(stack, ready)
    return stack


# -- the load ---------------------------------------------------------------------------------------


def prompt_text(i: int, prompt_tokens: int) -> str:
    # ~1 token per word with the embedded tokenizer; a unique head so nothing is a cache hit.
    return f"request {i}: " + " ".join(f"w{(i * 7 + k) % 997}" for k in range(max(prompt_tokens // 2, 8)))


def body(stack: str, api: str, i: int, tokens: int, prompt_tokens: int) -> bytes:
    msgs = [{"role": "user", "content": prompt_text(i, prompt_tokens)}]
    data: dict[str, Any] = {"model": MODEL, "max_tokens": tokens, "stream": True, "messages": msgs}
    if api == "chat":
        data["stream_options"] = {"include_usage": True}
    if stack == "dynamo":
        data["ignore_eos"] = True  # the mocker's random tokens may include EOS
        if api == "chat":
            data["min_tokens"] = tokens
    return json.dumps(data).encode()


@dataclass
class Samples:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)  # TTFT of each stream's first request


@dataclass
class Point:
    stack: str
    api: str
    streams: int
    tokens: int
    wall: float
    server_cpu: float
    client_cpu: float
    samples: Samples
    errors: int

    @property
    def ttft(self) -> list[float]:
        return self.samples.ttft

    @property
    def itl(self) -> list[float]:
        return self.samples.itl

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    @property
    def cpu_per_k(self) -> float:
        return 1000 * self.server_cpu / self.tokens if self.tokens else float("nan")

    @property
    def client_per_k(self) -> float:
        return 1000 * self.client_cpu / self.tokens if self.tokens else float("nan")


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass(frozen=True)
class Shape:
    """What every request of a point looks like."""

    api: str
    tokens: int
    prompt_tokens: int


async def _one(
    pool: Http1Pool, stack: str, shape: Shape, i: int, samples: Samples, *, first: bool = False
) -> int:
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "bench"}
    api = shape.api
    payload = body(stack, api, i, shape.tokens, shape.prompt_tokens)
    text = TEXT[api]
    t0 = time.perf_counter()
    response = await pool.request("POST", PATHS[api], headers=headers, body=payload)
    if response.status != 200:
        await response.read()
        raise RuntimeError(f"{stack} {api}: HTTP {response.status}")
    last: float | None = None
    tail = b""
    while (chunk := await response.read_some()) is not None:
        now = time.perf_counter()
        hits = len(text.findall(chunk))
        if hits:
            if last is None:
                samples.ttft.append(now - t0)
                if first:
                    samples.burst.append(now - t0)
            else:
                gap = (now - last) / hits
                samples.itl.extend([gap] * hits)
            last = now
        tail = (tail + chunk)[-4096:]
    counts = USAGE[api].findall(tail)
    return int(counts[-1]) if counts else 0


async def load(stack: Stack, shape: Shape, streams: int, window: float) -> Point:
    pool = Http1Pool(stack.url)
    samples = Samples()
    errors = 0
    await _one(pool, stack.name, shape, 10**6, Samples())  # warm
    counter = iter(range(10**9))

    async def loop(deadline: float) -> int:
        nonlocal errors
        done = 0
        first = True
        while time.perf_counter() < deadline:
            try:
                done += await _one(pool, stack.name, shape, next(counter), samples, first=first)
                first = False
            except Exception as exc:
                errors += 1
                if errors <= 3:
                    print(f"  {stack.name} {shape.api}: {exc}", flush=True)
                await asyncio.sleep(0.05)
        return done

    c0, u0 = stack.cpu(), resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(loop(t0 + window) for _ in range(streams)))
    wall = time.perf_counter() - t0
    c1, u1 = stack.cpu(), resource.getrusage(resource.RUSAGE_SELF)
    await pool.aclose()
    client = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
    return Point(stack.name, shape.api, streams, sum(counts), wall, c1 - c0, client, samples, errors)


# -- report -----------------------------------------------------------------------------------------


def median_point(points: Sequence[Point]) -> dict[str, float]:
    def med(f: Any) -> float:
        return float(statistics.median(f(p) for p in points))

    return {
        "rate": med(lambda p: p.rate),
        "ttft50": med(lambda p: pct(p.ttft, 0.5) * 1000),
        "ttft99": med(lambda p: pct(p.ttft, 0.99) * 1000),
        "burst99": med(lambda p: pct(p.samples.burst, 0.99) * 1000),
        "itl50": med(lambda p: pct(p.itl, 0.5) * 1000),
        "itl99": med(lambda p: pct(p.itl, 0.99) * 1000),
        "cpu": med(lambda p: p.cpu_per_k),
        "client": med(lambda p: p.client_per_k),
        "errors": sum(p.errors for p in points),
    }


def table(results: dict[tuple[str, str, int], list[Point]], stacks: Sequence[str]) -> str:
    keys = sorted({(api, n) for (_, api, n) in results}, key=lambda k: (k[0], k[1]))
    head = (
        "| API | streams | stack | tok/s | TTFT p50 ms | TTFT p99 ms | burst TTFT p99 ms "
        "| ITL p50 ms | ITL p99 ms | server CPU s/1000 tok | client CPU s/1000 tok "
        "| ratio tok/s | ratio CPU/tok | errors |"
    )
    lines = [head, "|" + "---|" * 14]
    for api, n in keys:
        base = median_point(results[("dynamo", api, n)]) if ("dynamo", api, n) in results else None
        for name in stacks:
            if (name, api, n) not in results:
                continue
            m = median_point(results[(name, api, n)])
            r_rate = f"{m['rate'] / base['rate']:.2f}" if base and base["rate"] else "—"
            r_cpu = f"{m['cpu'] / base['cpu']:.2f}" if base and base["cpu"] else "—"
            lines.append(
                f"| {api} | {n} | {name} | {m['rate']:,.0f} | {m['ttft50']:.1f} | {m['ttft99']:.1f} "
                f"| {m['burst99']:.1f} "
                f"| {m['itl50']:.2f} | {m['itl99']:.2f} | {m['cpu']:.4f} | {m['client']:.4f} "
                f"| {r_rate} | {r_cpu} | {m['errors']:.0f} |"
            )
    return "\n".join(lines)


def plot(results: dict[tuple[str, str, int], list[Point]], stacks: Sequence[str], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apis = sorted({api for (_, api, _) in results})
    fig, axes = plt.subplots(len(apis), 3, figsize=(14, 4 * len(apis)), squeeze=False)
    for row, api in enumerate(apis):
        for name in stacks:
            ns = sorted(n for (s, a, n) in results if s == name and a == api)
            if not ns:
                continue
            ms = [median_point(results[(name, api, n)]) for n in ns]
            axes[row][0].plot(ns, [m["rate"] for m in ms], "o-", label=name)
            axes[row][1].plot(ns, [m["ttft50"] for m in ms], "o-", label=f"{name} p50")
            axes[row][1].plot(ns, [m["ttft99"] for m in ms], "x--", label=f"{name} p99")
            axes[row][2].plot(ns, [m["cpu"] for m in ms], "o-", label=name)
        for col, title in enumerate(("delivered tok/s", "TTFT ms", "server CPU s / 1000 tokens")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streams")
            ax.set_title(f"{api}: {title}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


# -- main -------------------------------------------------------------------------------------------


def progress(p: Point) -> str:
    ttft = f"TTFT p50 {pct(p.ttft, 0.5) * 1000:7.1f} ms p99 {pct(p.ttft, 0.99) * 1000:7.1f} ms"
    cpu = f"CPU {p.cpu_per_k:.4f} s/1000 tok  client {p.client_per_k:.4f}"
    head = f"{p.api:9} {p.streams:5} streams {p.stack:10} {p.rate:10,.0f} tok/s"
    return f"{head}  {ttft}  {cpu}  errors {p.errors}"


def rounds(n: int, stacks: Sequence[str]) -> Iterator[list[str]]:
    for r in range(n):
        yield list(stacks) if r % 2 == 0 else list(reversed(stacks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 and 256 streams, Chat, one round, 3 s windows")
    ap.add_argument("--streams", default=None, help="comma-separated concurrencies (default 1,64,256)")
    ap.add_argument("--apis", default=None, help="chat,anthropic (default both; --quick: chat)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --quick: 1)")
    ap.add_argument("--window", type=float, default=None, help="seconds of load per point (default 6)")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="about this many prompt tokens")
    ap.add_argument("--workers", type=int, default=1, help="engine workers per stack (>1: behind a router)")
    ap.add_argument("--processes", type=int, default=1, help="agentserve frontend processes")
    ap.add_argument(
        "--sim-catch-up-s",
        type=float,
        default=None,
        help="agentserve workers' catch-up (0: one loop hop per iteration, per-token frames like the mocker)",
    )
    ap.add_argument("--only", choices=("agentserve", "dynamo"), default=None, help="one stack")
    ap.add_argument(
        "--with-http",
        action="store_true",
        help="a third stack, agentserve-http: the frontend's per-request worker transport (no mux)",
    )
    ap.add_argument("--plot", default=str(ROOT / "bench" / "results" / "peers.png"))
    args = ap.parse_args()
    streams = [int(s) for s in (args.streams or ("64,256" if args.quick else "1,64,256")).split(",")]
    apis = (args.apis or ("chat" if args.quick else "chat,anthropic")).split(",")
    n_rounds = args.rounds or (1 if args.quick else 3)
    window = args.window or (3.0 if args.quick else 6.0)
    stacks = [args.only] if args.only else ["agentserve", "dynamo"]
    if args.with_http:
        stacks.insert(1, "agentserve-http")

    logs = Path(tempfile.mkdtemp(prefix="peers-"))
    model = model_dir(logs)
    print(f"logs and model dir: {logs}", flush=True)
    # agentserve's sim workers run the default engine profile (Dynamo's mocker has its own model).
    print(f"agentserve sim: engine profile {load_profile(DEFAULT_PROFILE).label}", flush=True)
    running: dict[str, Stack] = {}
    try:
        if "dynamo" in stacks:
            running["dynamo"] = start_dynamo(model, args.workers, logs)
        if "agentserve" in stacks:
            running["agentserve"] = start_agentserve(
                model, args.workers, args.processes, logs, args.sim_catch_up_s
            )
        if "agentserve-http" in stacks:
            running["agentserve-http"] = start_agentserve(
                model, args.workers, args.processes, logs, args.sim_catch_up_s, transport="http"
            )
        results: dict[tuple[str, str, int], list[Point]] = {}
        loop = new_loop()
        for r, order in enumerate(rounds(n_rounds, stacks)):
            for api in apis:
                for n in streams:
                    for name in order:
                        stack = running[name]
                        shape = Shape(api, args.tokens, args.prompt_tokens)
                        p = loop.run_until_complete(load(stack, shape, n, window))
                        stack.check()
                        results.setdefault((name, api, n), []).append(p)
                        print(f"round {r + 1} {progress(p)}", flush=True)
        print()
        print(
            f"{args.tokens} output tokens, ~{args.prompt_tokens} prompt tokens, {args.workers} worker(s), "
            f"{args.processes} agentserve frontend process(es), {n_rounds} round(s) of {window:.0f} s, "
            f"{os.cpu_count()} CPUs; medians over rounds; ratios are agentserve / Dynamo"
        )
        print(table(results, stacks))
        plot(results, stacks, Path(args.plot))
    finally:
        for stack in running.values():
            stack.close()


if __name__ == "__main__":
    main()
