"""Benchmark bias-aware attention: fused Triton kernel vs FlexAttention vs SDPA+dense bias vs reference.

    python benchmarks/attention.py                   # GPU: N in {512, 1024, 4096, 16384}, bf16
    python benchmarks/attention.py --quick           # CPU-sized run (fewer tokens, smaller N)
    python benchmarks/attention.py --sizes 4096 --methods triton,flex --out /tmp/a.json

Score for head h: ``q_i·k_j / sqrt(d) + T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)``; d=64, H=8,
B = tokens // N (B x N ~ 64k tokens on GPU); the bias is the model's two terms (hir.nn.attention
``table`` and ``exposure``) as one hir_kernels.Bias. Rows: forward (no grad) and forward+backward
(grads for q, k, v, T, lam) of the hir_kernels backends
  triton     attention_triton (fused, O(N) memory)
  flex       attention_flex: torch.compile(flex_attention) with Bias.score_mod
  sdpa_dense attention_sdpa: F.scaled_dot_product_attention with the bias materialised as a (B, H, N, N) mask
  reference  attention_reference (fp32, materialises everything)
Each row records its median time, TFLOP/s (matmul FLOPs: 4 B H N^2 d forward; 3.5x that for
forward+backward, the FlashAttention convention), peak memory, or why it was skipped / how it
failed; never silently. Ratios (time of X / time of triton) and the issue's targets go in the JSON
(default benchmarks/results/attention.json). On CPU the Triton rows are skipped (the interpreter is
not a performance path), FlexAttention has no backward, and rows whose dense N x N tensors would
not fit in memory or take too long are skipped with the estimate.

Targets (H100/H200): fwd+bwd at N=4096 >= 1.5x flex and >= 3x sdpa_dense; forward >= 50% of the
dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "attention.json"
METHODS = ("triton", "flex", "sdpa_dense", "reference")
GIB = 1 << 30
# dense bf16 tensor-core peak (TFLOP/s, no sparsity) by device-name substring
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 756.0,
                    "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "RTX 4090": 165.2}
# bytes per (B, H, N, N) score element a dense row holds at its peak (measured-order estimates)
DENSE_BYTES = {("sdpa_dense", "fwd"): 10, ("sdpa_dense", "fwd+bwd"): 18,
               ("reference", "fwd"): 16, ("reference", "fwd+bwd"): 28}


def log(msg: str) -> None:
    print(f"[attention-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except OSError:
        return None


def attn_flops(b: int, h: int, n: int, d: int, mode: str) -> float:
    f = 4.0 * b * h * n * n * d
    return f if mode == "fwd" else 3.5 * f


class PeakMemory:
    """Peak extra memory of a block: CUDA allocator peak, or sampled process RSS on CPU (approximate)."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.proc = psutil.Process()
            self.base = self.peak_rss = self.proc.memory_info().rss
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self._stop.set()
            self.thread.join()
            self.peak = max(self.peak_rss, self.proc.memory_info().rss) - self.base


def time_call(fn: Callable[[], Any], device: torch.device, warmup: int, reps: int, max_s: float) -> float:
    """Median milliseconds of ``fn`` over up to ``reps`` calls after up to ``warmup`` calls; each phase
    stops early once it has run ``max_s`` seconds (slow rows get at least one timed call)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
        sync()
        if time.perf_counter() - start > max_s:
            break
    times, start = [], time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start > max_s:
            break
    times.sort()
    return times[len(times) // 2]


def make_inputs(b: int, h: int, n: int, d: int, buckets: tuple[int, int], dtype: torch.dtype,
                device: torch.device) -> dict:
    g = torch.Generator().manual_seed(0)
    x = {name: torch.randn(b, h, n, d, generator=g).to(device, dtype) for name in ("q", "k", "v")}
    x["table"] = (0.5 * torch.randn(h, *buckets, generator=g)).to(device)
    x["qb"] = torch.randint(0, buckets[0], (b, n), generator=g).to(device)
    x["kb"] = torch.randint(0, buckets[1], (b, n), generator=g).to(device)
    x["exposure"] = (torch.rand(b, n, generator=g) * 100).to(device)
    x["lam"] = (0.1 + 0.1 * torch.rand(h, generator=g)).to(device)
    x["key_mask"] = None
    return x


def bias_of(x: dict) -> Any:
    """The model's default bias terms (``table``, ``exposure``) on the benchmark's tensors, as a Bias."""
    from hir.nn.attention import BIAS_TERMS
    from hir_kernels import Bias

    feats = {"qb": x["qb"], "kb": x["kb"], "exposure": x["exposure"]}
    parts = [BIAS_TERMS[t].part({p: x[p] for p in BIAS_TERMS[t].params}, feats) for t in ("table", "exposure")]
    return Bias.of(parts, x["key_mask"])


def method_fn(name: str, device: torch.device) -> Callable[..., torch.Tensor]:
    """``fn(**inputs)`` of a benchmark method (a hir_kernels backend; flex compiled on every device)."""
    from hir_kernels import attention_flex, backend_fn

    if name == "flex":
        return lambda **x: attention_flex(x["q"], x["k"], x["v"], bias_of(x), compiled=True)
    fn = backend_fn({"sdpa_dense": "sdpa"}.get(name, name))
    return lambda **x: fn(x["q"], x["k"], x["v"], bias_of(x))


def skip_reason(method: str, mode: str, b: int, h: int, n: int, d: int, device: torch.device,
                cpu_gflops: float, max_row_s: float) -> str | None:
    if method == "triton" and device.type != "cuda":
        return "Triton kernels need CUDA here; the CPU interpreter is a test path, not a performance path"
    if method == "flex" and device.type != "cuda" and mode == "fwd+bwd":
        return "FlexAttention has no backward on CPU (NotImplementedError)"
    if (method, mode) in DENSE_BYTES:
        need = DENSE_BYTES[method, mode] * b * h * n * n
        avail = torch.cuda.mem_get_info()[0] if device.type == "cuda" else psutil.virtual_memory().available
        if need > avail:
            return f"dense N x N tensors need ~{need / GIB:.1f} GiB > {avail / GIB:.1f} GiB available"
    if device.type != "cuda":
        est = attn_flops(b, h, n, d, mode) / (cpu_gflops * 1e9) * (3 if method == "reference" else 1.5)
        if est > max_row_s:
            return f"estimated {est:.0f} s per call on CPU > --max-row-s {max_row_s:.0f}"
    return None


def cpu_gflops() -> float:
    a = torch.randn(1024, 1024)
    a @ a
    t0 = time.perf_counter()
    for _ in range(4):
        a @ a
    return 4 * 2 * 1024**3 / (time.perf_counter() - t0) / 1e9


def sanity_check(device: torch.device, dtype: torch.dtype, buckets: tuple[int, int],
                 shape: tuple[int, int, int, int] = (2, 4, 300, 64)) -> dict:
    """Triton vs the fp32 reference on (B, H, N, d) = ``shape`` with the benchmark's table size: max
    abs errors of the output and every gradient (tests/kernels/test_attention_gpu.py covers more)."""
    return _sanity(device, dtype, buckets, *shape)


def _sanity(device: torch.device, dtype: torch.dtype, buckets: tuple[int, int], b: int, h: int, n: int,
            d: int) -> dict:
    x = make_inputs(b, h, n, d, buckets, dtype, device)
    x["key_mask"] = torch.rand(b, n, device=device) > 0.1
    leaves = ("q", "k", "v", "table", "lam")
    do = torch.randn(b, h, n, d, device=device).to(dtype).float()  # same rounded dO for both paths
    res = {}
    outs = {}
    for name, fn, up in (("triton", method_fn("triton", device), False),
                         ("reference", method_fn("reference", device), True)):
        args = dict(x)
        ts = [args[k].detach().float() if up and k in ("q", "k", "v") else args[k].detach() for k in leaves]
        ts = [t.requires_grad_() for t in ts]
        args.update(zip(leaves, ts))
        o = fn(**args)
        outs[name] = [o, *torch.autograd.grad(o, ts, do.to(o.dtype))]
    for i, label in enumerate(("out", *[f"d{k}" for k in leaves])):
        a, r = outs["triton"][i].float(), outs["reference"][i].float()
        res[label] = {"max_abs_err": (a - r).abs().max().item(), "ref_max_abs": r.abs().max().item()}
    return res


def run_row(method: str, mode: str, x: dict, b: int, h: int, n: int, d: int, device: torch.device,
            args: argparse.Namespace) -> tuple[dict, torch.Tensor | None]:
    fn = method_fn(method, device)
    row: dict[str, Any] = {"method": method, "mode": mode, "N": n, "B": b}
    out = None
    try:
        if mode == "fwd":

            def call() -> torch.Tensor:
                with torch.no_grad():
                    return fn(**x)
        else:
            leaves = ("q", "k", "v", "table", "lam")
            xs = {**x, **{k: x[k].detach().requires_grad_() for k in leaves}}
            do = torch.randn_like(x["q"])

            def call() -> torch.Tensor:
                o = fn(**xs)
                torch.autograd.grad(o, [xs[k] for k in leaves], do)
                return o

        t0 = time.perf_counter()
        out = call()  # first call: compilation / autotuning, timed separately
        if device.type == "cuda":
            torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - t0, 3)
        ms = time_call(call, device, args.warmup, args.reps, args.max_row_s)
        with PeakMemory(device) as mem:
            call()
        fl = attn_flops(b, h, n, d, mode)
        row.update(status="ok", ms=round(ms, 4), tflops=round(fl / (ms * 1e-3) / 1e12, 4),
                   peak_mem_mib=round(mem.peak / 2**20, 1))
        out = out.detach()
    except Exception as e:  # OOM, compile failure, ...: recorded, the run goes on
        row.update(status="error", error=f"{type(e).__name__}: {str(e)[:600]}")
        if not isinstance(e, torch.OutOfMemoryError):
            row["traceback"] = traceback.format_exc(limit=6)[-2000:]
        out = None
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 (GPU default) | float16 | float32 (CPU default)")
    p.add_argument("--sizes", default=None, help="comma list of N; default 512,1024,4096,16384")
    p.add_argument("--tokens", type=int, default=None, help="B x N; default 65536 on GPU, 8192 on CPU")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--buckets", default="26,256",
                   help="QB,KB of the bias table; default: the model's (BucketVocab with 5 types, 6 stages)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--quick", action="store_true", help="CPU-sized: N in {256, 512, 1024}, 4096 tokens")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--max-row-s", type=float, default=None, help="per-row timing cap (and CPU skip estimate)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="run budget from start-up (default 220 on GPU, so the run ends within ~6 min even "
                   "if the last row compiles FlexAttention); rows left when it runs out are recorded as skipped")
    args = p.parse_args(argv)
    t_start = time.perf_counter()

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    sizes = [int(s) for s in (args.sizes or ("256,512,1024" if args.quick else "512,1024,4096,16384")).split(",")]
    tokens = args.tokens or (4096 if args.quick else 65536 if gpu else 8192)
    args.warmup = args.warmup if args.warmup is not None else (3 if gpu else 1)
    args.reps = args.reps if args.reps is not None else (20 if gpu else 3)
    args.max_row_s = args.max_row_s if args.max_row_s is not None else (2.0 if gpu else 60.0)
    budget = args.budget_s if args.budget_s is not None else (220.0 if gpu else 1500.0)
    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        p.error(f"unknown methods {bad}; expected a subset of {list(METHODS)}")
    h, d = args.heads, args.head_dim
    buckets = tuple(int(x) for x in args.buckets.split(","))
    if len(buckets) != 2:
        p.error(f"--buckets wants QB,KB; got {args.buckets!r}")
    # the headline size first, so a tight budget still measures it
    order = sorted(sizes, key=lambda n: (n != 4096, n))
    gflops = 0.0 if gpu else cpu_gflops()

    meta: dict[str, Any] = {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if gpu else cpu_name(), "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "git_sha": git_sha(), "dtype": str(dtype).replace("torch.", ""),
        "heads": h, "head_dim": d, "tokens_per_batch": tokens, "buckets": list(buckets), "key_mask": None,
        "sizes": sizes, "methods": methods, "warmup": args.warmup, "reps": args.reps, "budget_s": budget,
        "flops": "matmul FLOPs: fwd 4*B*H*N^2*d; fwd+bwd 3.5x fwd",
        "peak_memory": "CUDA allocator peak above the inputs" if gpu else "sampled process RSS increase (approx.)",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    if not gpu:
        meta["cpu_matmul_gflops"] = round(gflops, 1)
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if gpu and k in meta["device_name"]), None)
    meta["peak_bf16_tflops"] = peak
    result: dict[str, Any] = {"meta": meta, "rows": []}

    if gpu and "triton" in methods:
        try:
            result["sanity"] = sanity_check(device, dtype, buckets)
            log(f"sanity (triton vs fp32 reference, N=300): {json.dumps(result['sanity'])}")
        except Exception as e:
            result["sanity"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            log(f"sanity check failed: {e}")

    # priority order, so a tight budget still measures what matters: every method at the headline
    # N=4096, then the cheap methods at the other sizes, FlexAttention's per-shape compiles last
    rest = [n for n in order if n != 4096]
    tasks = [(n, m) for n in order if n == 4096 for m in methods]
    tasks += [(n, m) for n in rest for m in methods if m != "flex"]
    tasks += [(n, "flex") for n in rest if "flex" in methods]
    inputs: dict[int, dict] = {}
    outs: dict[int, dict[str, torch.Tensor]] = {n: {} for n in sizes}
    for n, method in tasks:
        b = max(1, tokens // n)
        for mode in ("fwd", "fwd+bwd"):
            base = {"method": method, "mode": mode, "N": n, "B": b}
            reason = skip_reason(method, mode, b, h, n, d, device, gflops, args.max_row_s)
            if reason is None and time.perf_counter() - t_start > budget:
                reason = f"run budget of {budget:.0f} s used up (--budget-s)"
            if reason:
                result["rows"].append({**base, "status": "skipped", "reason": reason})
                log(f"N={n} {method} {mode}: skipped: {reason}")
                continue
            if n not in inputs:
                inputs[n] = make_inputs(b, h, n, d, buckets, dtype, device)
            row, out = run_row(method, mode, inputs[n], b, h, n, d, device, args)
            if out is not None and mode == "fwd":
                outs[n][method] = out
            result["rows"].append(row)
            log(f"N={n} {method} {mode}: {row.get('ms', row.get('error'))} ms, {row.get('tflops')} TFLOP/s, "
                f"{row.get('peak_mem_mib')} MiB, first call {row.get('first_call_s')} s")
            write(result, args.out)
    for n, by_method in outs.items():  # forward agreement between methods, on the benchmark inputs
        ref_name = "triton" if "triton" in by_method else "reference" if "reference" in by_method else None
        for method, o in by_method.items():
            if ref_name and method != ref_name:
                row = next(r for r in result["rows"] if (r["method"], r["mode"], r["N"]) == (method, "fwd", n))
                row[f"max_abs_diff_vs_{ref_name}"] = (o.float() - by_method[ref_name].float()).abs().max().item()

    result["ratios"] = ratios(result["rows"])
    result["targets"] = targets(result["rows"], result["ratios"], peak)
    result["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
    write(result, args.out)
    log(f"wrote {args.out}")
    return 0


def ratios(rows: list[dict]) -> list[dict]:
    """Per (N, mode): time of each method over the baseline's (triton if it ran, else reference)."""
    out = []
    ok = {(r["N"], r["mode"], r["method"]): r["ms"] for r in rows if r.get("status") == "ok"}
    for n, mode in sorted({(r["N"], r["mode"]) for r in rows}):
        base = next((m for m in ("triton", "reference") if (n, mode, m) in ok), None)
        if base is None:
            continue
        entry: dict[str, Any] = {"N": n, "mode": mode, "baseline": base}
        for m in METHODS:
            if m != base and (n, mode, m) in ok:
                entry[f"{m}_time_over_{base}"] = round(ok[n, mode, m] / ok[n, mode, base], 3)
        out.append(entry)
    return out


def targets(rows: list[dict], rats: list[dict], peak: float | None) -> dict:
    def ratio(n: int, mode: str, key: str) -> float | None:
        return next((r.get(key) for r in rats if r["N"] == n and r["mode"] == mode), None)

    fwd = next((r for r in rows if (r["method"], r["mode"], r["N"], r.get("status")) == ("triton", "fwd", 4096, "ok")),
               None)
    vs_flex = ratio(4096, "fwd+bwd", "flex_time_over_triton")
    vs_sdpa = ratio(4096, "fwd+bwd", "sdpa_dense_time_over_triton")
    frac = fwd["tflops"] / peak if fwd and peak else None

    def verdict(v: float | None, goal: float) -> dict:
        return {"value": None if v is None else round(v, 3), "goal": goal,
                "met": None if v is None or math.isnan(v) else v >= goal}

    return {
        "fwd+bwd N=4096 speedup over flex": verdict(vs_flex, 1.5),
        "fwd+bwd N=4096 speedup over sdpa_dense": verdict(vs_sdpa, 3.0),
        "fwd N=4096 fraction of dense bf16 peak": verdict(frac, 0.5),
    }


def write(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
