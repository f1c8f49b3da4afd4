"""Time one engine iteration (a StepWork) of the Qwen3-30B-A3B shape on one GPU, at held-out shapes.

A step runs every token through 48 layers of random BF16 weights of the model's shape (RMSNorm, QKV,
QK-norm, RoPE, SDPA attention, output projection, RMSNorm, top-8 of 128 routed SwiGLU experts as
grouped GEMMs without host syncs) and the LM head on each sequence's last token. Prefill chunks
attend bottom-right causally over (start + n) cached keys, decodes over their C cached keys (random
contents, one K/V buffer per step shared by all layers). Decode and mixed steps replay a CUDA graph;
prefill runs eagerly, as the reference profile was measured. Times are the median of CUDA-event
pairs. Unfused element-wise ops, SDPA instead of paged/flash-decoding kernels and the
sort/index_add MoE make this an upper bound on a fused engine's iteration time.

    python bench/gpu_step_times.py [--quick] [--layers N] [--out PATH]   # on the GPU
    python bench/gpu_step_times.py --shapes both   # also the reference note's shapes, same code
    python bench/gpu_step_times.py --tiny --out /tmp/t.json              # the code path, on CPU
    python bench/gpu_step_times.py --check                               # MoE/attention self-check
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-6
ROPE_THETA = 1e6


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    inter: int
    vocab: int


QWEN3_30B_A3B = Shape(48, 2048, 32, 4, 128, 128, 8, 768, 151_936)
TINY = Shape(2, 256, 4, 2, 64, 16, 2, 64, 1000)


@dataclass(frozen=True)
class Step:
    kind: str  # decode, mixed, chunk (graph replay on a GPU) or prefill (eager)
    prefill: tuple[int, int] | None = None  # one chunk: (start, n)
    decode: tuple[int, int] | None = None  # (count, context)

    @property
    def label(self) -> str:
        parts = [f"S={self.prefill[0]} P={self.prefill[1]}"] if self.prefill else []
        parts += [f"B={self.decode[0]} C={self.decode[1]}"] if self.decode else []
        return f"{self.kind} " + " + decode ".join(parts)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prefill": [list(self.prefill)]} if self.prefill else {}
        return out | ({"decode": [list(self.decode)]} if self.decode else {})


def note_plan() -> list[Step]:
    """The shapes of shared/reference/gpu-h200.md, measured again by this script (so a fit on them can
    be checked against the held-out shapes of `plan` from the same implementation)."""
    steps = [Step("prefill", (0, n)) for n in (1024, 4096, 16384, 52000, 53000)]
    steps.append(Step("prefill", (52000, 1000)))
    decode = [(1, 2048), (1, 8192), (4, 2048), (16, 2048), (16, 8192), (64, 2048), (64, 8192), (256, 2048)]
    steps += [Step("decode", None, (b, c)) for b, c in decode]
    for p in (512, 2048, 8192):
        steps += [Step("chunk", (32000, p)), Step("mixed", (32000, p), (64, 8192))]
    return steps


def plan(quick: bool, tiny: bool) -> list[Step]:
    def ln(v: int) -> int:  # the tiny model's contexts stay ≤ 512
        return v // 128 if tiny else v

    def bs(v: int) -> int:
        return max(1, v // 8) if tiny else v

    decode = [(1, 4096), (8, 2048), (32, 4096), (32, 16384), (128, 4096), (128, 8192), (512, 1024)]
    mixed = [(16000, 1024, 32, 4096), (8000, 4096, 128, 2048), (30000, 2048, 64, 8192)]
    prefill = [(0, 2048), (0, 8192), (0, 32000), (30000, 2000), (60000, 500)]
    chunks = [(16000, 1024), (8000, 4096)]
    steps = [Step("decode", None, (bs(b), ln(c))) for b, c in decode]
    steps += [Step("mixed", (ln(s), ln(p)), (bs(b), ln(c))) for s, p, b, c in mixed]
    steps += [Step("prefill", (ln(s), ln(p))) for s, p in prefill]
    steps += [Step("chunk", (ln(s), ln(p))) for s, p in chunks]
    if quick:
        return [st for st in steps if st.kind == "decode"][:2] + [st for st in steps if st.kind == "prefill"][
            :1
        ]
    return steps


# ---- MoE: grouped expert GEMMs (no host sync) and the references it is checked against -------------

GROUPED: dict[str, Callable[..., Tensor]] = {}
if hasattr(torch, "_grouped_mm"):
    GROUPED["torch._grouped_mm"] = torch._grouped_mm
if hasattr(F, "grouped_mm"):
    GROUPED["torch.nn.functional.grouped_mm"] = F.grouped_mm
LOOP = "per-expert loop"


def _loop_experts(xs: Tensor, ids: Tensor, w_gu: Tensor, w_d: Tensor) -> Tensor:
    """Rows sorted by expert id through each expert in turn (syncs for the counts)."""
    outs, o = [], 0
    for e, c in enumerate(torch.bincount(ids, minlength=w_gu.shape[0]).tolist()):
        if c:
            g, u = F.linear(xs[o : o + c], w_gu[e]).chunk(2, dim=-1)
            outs.append(F.linear(F.silu(g) * u, w_d[e]))
            o += c
    return torch.cat(outs)


def expert_mix(h: Tensor, idx: Tensor, w: Tensor, w_gu: Tensor, w_d: Tensor, *, path: str) -> Tensor:
    """Σ_k w[t,k]·expert_{idx[t,k]}(h[t]); w_gu is (E, 2I, H) [gate; up], w_d is (E, H, I)."""
    k = idx.shape[1]
    flat = idx.reshape(-1)
    order = flat.argsort()
    tok = order // k
    xs = h.index_select(0, tok)
    if path == LOOP:
        y = _loop_experts(xs, flat[order], w_gu, w_d)
    else:
        ones = torch.ones_like(flat, dtype=torch.int32)
        counts = torch.zeros(w_gu.shape[0], dtype=torch.int32, device=h.device).scatter_add_(0, flat, ones)
        offs = counts.cumsum(0, dtype=torch.int32)
        mm = GROUPED[path]
        g, u = mm(xs, w_gu.transpose(1, 2), offs=offs).chunk(2, dim=-1)
        y = mm(F.silu(g) * u, w_d.transpose(1, 2), offs=offs)
    y = y * w.reshape(-1)[order].unsqueeze(1)
    return torch.zeros_like(h).index_add_(0, tok, y)


def reference_moe(h: Tensor, idx: Tensor, w: Tensor, w_gu: Tensor, w_d: Tensor) -> Tensor:
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for e in range(w_gu.shape[0]):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel():
            g, u = (h[tok].float() @ w_gu[e].float().T).chunk(2, dim=-1)
            y = (F.silu(g) * u) @ w_d[e].float().T
            out.index_add_(0, tok, y * w[tok, slot].float().unsqueeze(1))
    return out


def tolerance(dtype: torch.dtype) -> float:
    return 3e-2 if dtype == torch.bfloat16 else 1e-4


def moe_errors(s: Shape, device: torch.device, dtype: torch.dtype) -> dict[str, float | str]:
    """Relative max error of each MoE path against the reference: 64 tokens, the model's expert
    shapes, expert 0 never chosen (an empty group)."""
    gen = torch.Generator(device=device).manual_seed(1)
    t, e, k, hid, inter = 64, s.experts, s.top_k, s.hidden, s.inter
    h = torch.randn(t, hid, generator=gen, device=device, dtype=dtype)
    scores = torch.rand(t, e, generator=gen, device=device)
    scores[:, 0] = -1.0
    w, idx = scores.topk(k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    w_gu = (torch.randn(e, 2 * inter, hid, generator=gen, device=device, dtype=dtype) * 0.05).contiguous()
    w_d = (torch.randn(e, hid, inter, generator=gen, device=device, dtype=dtype) * 0.05).contiguous()
    ref = reference_moe(h, idx, w, w_gu, w_d)
    errs: dict[str, float | str] = {}
    for path in [*GROUPED, LOOP]:
        try:
            out = expert_mix(h, idx, w, w_gu, w_d, path=path).float()
            errs[path] = float((out - ref).abs().max() / ref.abs().max())
        except Exception as exc:
            errs[path] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return errs


def pick_moe_path(errs: dict[str, float | str], dtype: torch.dtype) -> str:
    return next((p for p, v in errs.items() if isinstance(v, float) and v < tolerance(dtype)), LOOP)


# ---- attention: SDPA, flash first, GQA native when it runs ---------------------------------------------

LOWER_RIGHT: Callable[[int, int], Any] | None = None
with contextlib.suppress(ImportError):
    from torch.nn.attention.bias import causal_lower_right as LOWER_RIGHT


def _flash_only() -> contextlib.AbstractContextManager[Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


class Attention:
    """Per kind ("decode", "causal", "chunk") the first of flash+GQA, flash+expanded K/V, default+GQA,
    default+expanded that runs; chosen at the first (eager) call, reused in graph captures."""

    def __init__(self) -> None:
        self.choice: dict[str, tuple[bool, bool]] = {}

    def describe(self) -> str:
        parts = [
            f"{kind}: {'flash' if fl else 'default backend'}, gqa {'native' if gqa else 'expanded'}"
            for kind, (fl, gqa) in sorted(self.choice.items())
        ]
        mask = "causal_lower_right" if LOWER_RIGHT else "explicit bool mask"
        return "sdpa " + "; ".join(parts) + f"; chunk mask {mask}"

    def __call__(self, kind: str, q: Tensor, k: Tensor, v: Tensor, start: int) -> Tensor:
        if kind in self.choice:
            return self._run(kind, self.choice[kind], q, k, v, start=start)
        error: Exception | None = None
        for flash, gqa in ((True, True), (True, False), (False, True), (False, False)):
            try:
                out = self._run(kind, (flash, gqa), q, k, v, start=start)
            except Exception as exc:
                error = exc
                continue
            self.choice[kind] = (flash, gqa)
            return out
        raise RuntimeError(f"no SDPA configuration ran for {kind}: {error}") from error

    @staticmethod
    def _run(kind: str, cfg: tuple[bool, bool], q: Tensor, k: Tensor, v: Tensor, *, start: int) -> Tensor:
        flash, gqa = cfg
        n, kv_len = q.shape[2], k.shape[2]
        mask: Any = None
        if kind == "chunk":
            if LOWER_RIGHT is not None:
                mask = LOWER_RIGHT(n, kv_len)
            else:
                mask = torch.ones(n, kv_len, dtype=torch.bool, device=q.device).tril(diagonal=start)
        extra: dict[str, Any] = {"enable_gqa": True} if gqa else {}
        if not gqa:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with _flash_only() if flash else contextlib.nullcontext():
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=kind == "causal", **extra
            )


# ---- the model ------------------------------------------------------------------------------------------


@dataclass
class Layer:
    ln1: Tensor
    wqkv: Tensor
    q_norm: Tensor
    k_norm: Tensor
    wo: Tensor
    ln2: Tensor
    router: Tensor
    w_gu: Tensor  # (E, 2I, H)
    w_d: Tensor  # (E, H, I)


@dataclass
class Batch:
    x: Tensor
    cos: Tensor
    sin: Tensor
    chunks: list[tuple[int, int, Tensor, Tensor]]  # start, n, K cache, V cache (1, KV, start+n, D)
    decode: tuple[Tensor, Tensor] | None  # K, V caches (B, KV, C, D)
    last: Tensor  # rows that reach the LM head


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model:
    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype, moe_path: str) -> None:
        self.s, self.device, self.dtype, self.moe_path = s, device, dtype, moe_path
        self.gen = torch.Generator(device=device).manual_seed(0)
        self.attn = Attention()
        hq, hkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = [
            Layer(
                self._ones(s.hidden),
                self._rand(hq + 2 * hkv, s.hidden),
                self._ones(s.head_dim),
                self._ones(s.head_dim),
                self._rand(s.hidden, hq),
                self._ones(s.hidden),
                self._rand(s.experts, s.hidden),
                self._rand(s.experts, 2 * s.inter, s.hidden),
                self._rand(s.experts, s.hidden, s.inter),
            )
            for _ in range(s.layers)
        ]
        self.final_norm = self._ones(s.hidden)
        self.lm_head = self._rand(s.vocab, s.hidden)

    def _rand(self, *size: int, scale: float = 0.02) -> Tensor:
        return torch.randn(*size, generator=self.gen, device=self.device, dtype=self.dtype).mul_(scale)

    def _ones(self, n: int) -> Tensor:
        return torch.ones(n, device=self.device, dtype=self.dtype)

    def batch(self, step: Step) -> Batch:
        s = self.s
        pos, last, chunks, o = [], [], [], 0
        for start, n in [step.prefill] if step.prefill else []:
            pos.append(torch.arange(start, start + n, device=self.device))
            kc, vc = (self._rand(1, s.kv_heads, start + n, s.head_dim, scale=1.0) for _ in range(2))
            chunks.append((start, n, kc, vc))
            o += n
            last.append(o - 1)
        decode = None
        if step.decode:
            b, c = step.decode
            pos.append(torch.full((b,), c - 1, device=self.device))
            decode = (
                self._rand(b, s.kv_heads, c, s.head_dim, scale=1.0),
                self._rand(b, s.kv_heads, c, s.head_dim, scale=1.0),
            )
            last += range(o, o + b)
            o += b
        inv = ROPE_THETA ** -(torch.arange(0, s.head_dim, 2, device=self.device).float() / s.head_dim)
        ang = torch.cat(pos).float()[:, None] * inv
        ang = torch.cat((ang, ang), dim=-1)[:, None, :]
        cos, sin = ang.cos().to(self.dtype), ang.sin().to(self.dtype)
        idx = torch.tensor(last, device=self.device)
        return Batch(self._rand(o, s.hidden, scale=1.0), cos, sin, chunks, decode, idx)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, b: Batch) -> Tensor:
        outs, o = [], 0
        for start, n, kc, vc in b.chunks:
            kc[0, :, start : start + n] = k[o : o + n].transpose(0, 1)
            vc[0, :, start : start + n] = v[o : o + n].transpose(0, 1)
            qq = q[o : o + n].transpose(0, 1).unsqueeze(0)
            out = self.attn("chunk" if start else "causal", qq, kc, vc, start)
            outs.append(out[0].transpose(0, 1).reshape(n, -1))
            o += n
        if b.decode is not None:
            kc, vc = b.decode
            nb, c = kc.shape[0], kc.shape[2]
            kc[:, :, c - 1] = k[o : o + nb]
            vc[:, :, c - 1] = v[o : o + nb]
            outs.append(self.attn("decode", q[o : o + nb].unsqueeze(2), kc, vc, 0).reshape(nb, -1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def moe(self, h: Tensor, ly: Layer) -> Tensor:
        probs = torch.softmax(F.linear(h, ly.router).float(), dim=-1)
        w, idx = probs.topk(self.s.top_k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(h.dtype)
        return expert_mix(h, idx, w, ly.w_gu, ly.w_d, path=self.moe_path)

    def forward(self, b: Batch) -> Tensor:
        s, x = self.s, b.x
        t = x.shape[0]
        for ly in self.layers:
            qkv = F.linear(F.rms_norm(x, (s.hidden,), ly.ln1, EPS), ly.wqkv)
            q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
            q = _rope(F.rms_norm(q.view(t, s.heads, s.head_dim), (s.head_dim,), ly.q_norm, EPS), b.cos, b.sin)
            k = _rope(
                F.rms_norm(k.view(t, s.kv_heads, s.head_dim), (s.head_dim,), ly.k_norm, EPS), b.cos, b.sin
            )
            x = x + F.linear(self.attend(q, k, v.view(t, s.kv_heads, s.head_dim), b), ly.wo)
            x = x + self.moe(F.rms_norm(x, (s.hidden,), ly.ln2, EPS), ly)
        return F.linear(
            F.rms_norm(x.index_select(0, b.last), (s.hidden,), self.final_norm, EPS), self.lm_head
        )


# ---- timing -------------------------------------------------------------------------------------------


def time_once(fn: Callable[[], object], cuda: bool) -> float:
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0


def timed_runs(fn: Callable[[], object], cuda: bool) -> list[float]:
    warm = [time_once(fn, cuda) for _ in range(3)]
    return [time_once(fn, cuda) for _ in range(5 if warm[-1] > 0.5 else 10)]


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captures on its own side stream
        fn()
    return graph


def measure(model: Model, step: Step, cuda: bool) -> dict[str, Any]:
    batch = model.batch(step)
    graph, note = None, ""
    if step.kind != "prefill" and cuda and model.moe_path != LOOP:
        try:
            graph = capture(lambda: model.forward(batch))
        except Exception as exc:
            note = f"graph capture failed: {type(exc).__name__}: {str(exc)[:300]}"
            torch.cuda.synchronize()
    runs = timed_runs(graph.replay if graph is not None else lambda: model.forward(batch), cuda)
    rec: dict[str, Any] = {"label": step.label, "mode": "graph" if graph is not None else "eager"}
    rec |= {"seconds": statistics.median(runs), "runs": runs, "steps": [step.as_json()]}
    return rec | ({"note": note} if note else {})


def write(path: str, result: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def check(s: Shape, device: torch.device, dtype: torch.dtype) -> bool:
    """MoE paths against the reference loop; GQA chunk, causal and decode attention against explicit."""
    tol, ok = tolerance(dtype), True
    for path, err in moe_errors(s, device, dtype).items():
        good = isinstance(err, float) and err < tol
        ok &= good or (path != LOOP and not isinstance(err, float))  # an absent kernel is not wrong
        print(f"moe {path}: {err} {'OK' if good else 'FAIL'}", flush=True)
    gen = torch.Generator(device=device).manual_seed(2)
    q = torch.randn(2, 4, 5, 64, generator=gen, device=device, dtype=dtype)
    k, v = (torch.randn(2, 2, 12, 64, generator=gen, device=device, dtype=dtype) for _ in range(2))
    kx, vx = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    mask = torch.ones(5, 12, dtype=torch.bool, device=device).tril(diagonal=7)
    sdpa, attn = F.scaled_dot_product_attention, Attention()
    cases = {
        "chunk": (attn("chunk", q, k, v, 7), sdpa(q, kx, vx, attn_mask=mask)),
        "causal": (
            attn("causal", q, k[:, :, :5], v[:, :, :5], 0),
            sdpa(q, kx[:, :, :5], vx[:, :, :5], is_causal=True),
        ),
        "decode": (attn("decode", q[:, :, :1], k, v, 0), sdpa(q[:, :, :1], kx, vx)),
    }
    for kind, (out, want) in cases.items():
        err = float((out.float() - want.float()).abs().max())
        ok &= err < tol
        print(f"attention {kind}: max err {err:.2e} {'OK' if err < tol else 'FAIL'}", flush=True)
    print(attn.describe(), flush=True)
    print("OK" if ok else "FAIL", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_step_times.json"))
    ap.add_argument("--quick", action="store_true", help="2 decode shapes and 1 prefill: a smoke run")
    ap.add_argument("--layers", type=int, default=None, help="layers (default 48; 2 with --tiny)")
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny model and shapes (contexts ≤ 512); always on CPU"
    )
    ap.add_argument("--check", action="store_true", help="check MoE and attention paths, then exit")
    ap.add_argument("--budget", type=float, default=270.0, help="skip measurements after this many seconds")
    ap.add_argument(
        "--shapes",
        choices=("held-out", "note", "both"),
        default="held-out",
        help="held-out shapes (default), the reference note's shapes, or both",
    )
    args = ap.parse_args()
    t0 = time.monotonic()
    cuda = torch.cuda.is_available()
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch {torch.__version__}, device {gpu}, dtype {dtype}", flush=True)
    if not cuda:
        torch.set_num_threads(1)
    shape = TINY if args.tiny or not cuda else QWEN3_30B_A3B  # the full model only on a GPU
    if args.layers:
        shape = replace(shape, layers=args.layers)
    if args.check:
        return 0 if check(shape, device, dtype) else 1
    errs = moe_errors(shape, device, dtype)
    moe_path = pick_moe_path(errs, dtype)
    print(f"moe path {moe_path} (relative errors vs reference: {errs})", flush=True)
    print(f"allocating {shape.layers} layers of random weights", flush=True)
    with torch.inference_mode():
        model = Model(shape, device, dtype, moe_path)
        if cuda:
            torch.cuda.synchronize()
            print(f"weights {torch.cuda.memory_allocated() / 2**30:.1f} GiB", end=" ", flush=True)
        print(f"ready at {time.monotonic() - t0:.1f} s", flush=True)
        result: dict[str, Any] = {
            "gpu": gpu,
            "torch": torch.__version__,
            "moe_path": moe_path,
            "moe_check": errs,
            "attention": "",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "model": asdict(shape),
            "dtype": str(dtype),
            "measurements": [],
        }
        steps = [] if args.shapes == "note" else plan(args.quick, args.tiny or not cuda)
        if args.shapes != "held-out" and cuda and not args.tiny:
            steps = note_plan() + steps
        for step in steps:
            if time.monotonic() - t0 > args.budget:
                rec: dict[str, Any] = {"label": step.label, "skipped": f"past the {args.budget:.0f} s budget"}
            else:
                try:
                    rec = measure(model, step, cuda)
                    print(f"{step.label}: {rec['mode']} {rec['seconds'] * 1e3:.2f} ms", flush=True)
                except Exception as exc:
                    rec = {"label": step.label, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                    print(f"{step.label}: {rec['error']}", flush=True)
                gc.collect()
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            result["measurements"].append(rec)
            result["attention"] = model.attn.describe()
            write(args.out, result)
    print(f"wrote {args.out} at {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
