"""Every GEMV shape of the decode loop alone, bf16 and int8 (one float32 scale per row, model/quant.py), on
the GPU: q3t_gemv (the split-K kernel up to K = 4096, the row kernel above) and the split-K kernel at any K
(q3t_gemv_batch with one vector), each in a captured graph of >= 240 back-to-back launches that rotate over
enough weight copies (>= 256 MB) that every launch reads HBM, not L2; microseconds per launch and achieved
GB/s (weight bytes, int8's scales included, / time), PDL on and off. Q3T_I8_DEEP=1 plans int8 for the most loads
in flight per lane (q3t_set_i8_deep); Q3T_I8_MMA=1 runs int8 on int8 tensor cores (q3t_set_i8_mma); GEMV_WEIGHTS=int8
(or bf16) times one kind only; GEMV_LIB=PATH times another build of the library (e.g. an older commit's, for an A/B
in one call; one that lacks an entry point of this package does not load).

Prints JSON lines, then a markdown table, which it also writes to $OUT/gemv_bench.md.
Usage: python kernels/device/bench_gemv.py
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch
from common import native_library

from wyoming_qwen3tts.backends.kernels.ops import ADD, STORE, SWIGLU, Matrix, Ops
from wyoming_qwen3tts.model.quant import quantize_rows

OUT = Path(os.environ.get("OUT") or "/tmp/q3t-out")
S, A, G = STORE, ADD, SWIGLU
# label, rows, K, mode, fused RMSNorm, bias, launches per frame (1.7B, 0.6B)
SHAPES = [
    ("1.7B Talker qkv", 4096, 2048, S, True, False, (28, 0)),
    ("1.7B Talker o_proj", 2048, 2048, A, False, False, (28, 0)),
    ("1.7B Talker gate/up", 12288, 2048, G, True, False, (28, 0)),
    ("1.7B Talker down", 2048, 6144, A, False, False, (28, 0)),
    ("1.7B codec_head", 3072, 2048, S, False, False, (1, 0)),
    ("1.7B small_to_mtp", 1024, 2048, S, False, True, (1, 0)),
    ("CP / 0.6B qkv", 4096, 1024, S, True, False, (80, 108)),
    ("CP / 0.6B o_proj", 1024, 2048, A, False, False, (80, 108)),
    ("CP / 0.6B gate/up", 6144, 1024, G, True, False, (80, 108)),
    ("CP / 0.6B down", 1024, 3072, A, False, False, (80, 108)),
    ("CP lm_head", 2048, 1024, S, True, False, (15, 15)),
    ("0.6B codec_head", 3072, 1024, S, False, False, (0, 1)),
]
KERNELS = ("gemv", "splitk")  # q3t_gemv as the frame calls it; the split-K kernel whatever K
WEIGHTS = ("bf16", "int8")


def time_shape(ops: Ops, label: str, n: int, k: int, mode: int, norm: bool, bias: bool, weights: str = "bf16") -> dict:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    nbytes = n * k * 2 if weights == "bf16" else n * k + n * 4
    copies = max(2, -(-256 * 2**20 // nbytes))
    reps = max(1, -(-240 // copies))
    w = [(torch.randn(n, k, device=dev, generator=g) * 0.05).to(torch.bfloat16) for _ in range(copies)]
    if weights == "int8":
        w = [Matrix(*quantize_rows(m)) for m in w]
    x = torch.randn(k, device=dev, generator=g)
    kw = dict(
        mode=mode,
        norm_w=torch.rand(k, device=dev, generator=g) + 0.5 if norm else None,
        eps=1e-6,
        bias=torch.randn(n, device=dev, generator=g) if bias else None,
    )
    y = torch.zeros(n // 2 if mode == G else n, device=dev)
    rec: dict = {
        "shape": label,
        "weights": weights,
        "n": n,
        "k": k,
        "mode": mode,
        "mb": round(nbytes / 1e6, 2),
        "launches": copies * reps,
    }

    def launch(kernel: str, c: int) -> None:
        if kernel == "gemv":
            ops.gemv(w[c], x, y, **kw)
        else:
            ops.gemv_batch(w[c], x[None], y[None], **kw)

    for pdl in (True, False):
        ops.set_pdl(pdl)
        for kernel in KERNELS:
            launch(kernel, 0)  # one launch outside the graph first (loads the kernel)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(reps):
                    for c in range(copies):
                        launch(kernel, c)
            graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(7):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(3):
                    graph.replay()
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1) * 1000 / (3 * copies * reps))
            us = statistics.median(times)
            tag = f"{kernel}{'_pdl' if pdl else ''}"
            rec[f"us_{tag}"] = round(us, 3)
            rec[f"gbs_{tag}"] = round(nbytes / us / 1e3, 1)
    ops.set_pdl(False)
    return rec


def table(rows: list[dict]) -> str:
    lines = [
        "## GEMV shapes (bf16, int8)",
        "",
        "Per launch in a chain of the same GEMV over rotating weights (HBM, not L2): us (GB/s).",
        "",
        "| shape | weights | rows x K | MB | " + " | ".join(f"{k} PDL | {k} no PDL" for k in KERNELS) + " |",
        "|---" * (4 + 2 * len(KERNELS)) + "|",
    ]
    for r in rows:
        cells = [f"{r[f'us_{k}_pdl']} ({r[f'gbs_{k}_pdl']}) | {r[f'us_{k}']}" for k in KERNELS]
        lines.append(f"| {r['shape']} | {r['weights']} | {r['n']}x{r['k']} | {r['mb']} | " + " | ".join(cells) + " |")
    lines.append("")
    for weights in WEIGHTS:
        for i, size in enumerate(("1.7b", "0.6b")):
            per = {label: frame[i] for label, *_, frame in SHAPES}
            total = sum(r["us_gemv_pdl"] * per[r["shape"]] for r in rows if r["weights"] == weights) / 1000
            lines.append(
                f"Sum over one {size} frame's GEMVs, {weights} (launches per frame x us, PDL): {total:.3f} ms  "
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ops = Ops(native_library())  # GEMV_LIB: another build
    # Q3T_I8_DEEP=1, Q3T_I8_MMA=1: the int8 plan and kernel options (module docstring); GEMV_WEIGHTS=int8: one kind.
    ops.set_i8_deep(os.environ.get("Q3T_I8_DEEP", "0") == "1")
    ops.set_i8_mma(os.environ.get("Q3T_I8_MMA", "0") == "1")
    kinds = tuple(w for w in WEIGHTS if w in os.environ.get("GEMV_WEIGHTS", ",".join(WEIGHTS)).split(","))
    rows = []
    for label, n, k, mode, norm, bias, _ in SHAPES:
        for weights in kinds:
            rows.append(time_shape(ops, label, n, k, mode, norm, bias, weights))
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    OUT.mkdir(parents=True, exist_ok=True)
    md = table(rows)
    (OUT / f"gemv_bench{os.environ.get('GEMV_TAG', '')}.md").write_text(md)
    print(md, flush=True)


if __name__ == "__main__":
    main()
