"""The batched-step kernels (q3t.h, last section) on the GPU: per kernel, µs per launch and effective
GB/s at nb = 1, 2, 4, 8, 16 for the 1.7B and 0.6B shapes (bf16), each as a captured graph of >= 200
launches timed with CUDA events, programmatic dependent launch on (as the frame graph runs).

1. gemv: every GEMV shape of a batched step, over rotating weight copies (>= 256 MB, so HBM, not L2):
   µs of the step's kernel (tensor cores where the device has them) and of the FMA kernel, GB/s of weights read, that as a fraction of this GPU's measured copy bandwidth, TFLOP/s, and
   t(nb) / t(1): 1.00 is a kernel bound by its weight bytes alone. The one-vector q3t_gemv beside it, and
   cuBLAS (torch.mm, bf16) at 16 and 64 vectors as a yardstick for the 64-stream step.
2. ops: the Talker's split attention (contexts 200 and 1000, slots at once), the CodePredictor's short
   attention (one position, and the first two), the draws (code 0: top-k 50 + penalty; a CodePredictor
   code), the embedding sum, the final norm, the history store and counters.
3. step: per size and nb, the sum over one step of launches per step x µs (GEMVs, then everything):
   the kernel time of a step without gaps, and the frames/s it bounds (nb / step).

Is the GEMV memory-bound at nb 16? The table's last columns say it: GB/s against copy GB/s and
t(16)/t(1) per shape. (bf16 on an H200: at nb = 16 each weight takes 16 FMAs, 1.15x what the FMA pipes
do in the weight's HBM time at 4.8 TB/s, so expect t(16)/t(1) ~1.1-1.4 on the big matrices.)

Prints JSON lines, then markdown, also written to $OUT/batched_bench.md.
Usage: python kernels/device/bench_batched.py [gemv] [ops]   (default both); GEMV_LIB=PATH: another build of the
library (an A/B in one call), GEMV_TAG: a suffix for its table file; GEMV_WEIGHTS=int8: the GEMVs on int8 weights
(a float32 scale per row; no cuBLAS yardstick), where one vector on the tensor-core kernel meets q3t_gemv's
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemv
from common import native_library

from wyoming_qwen3tts.backends.kernels import library

OUT = Path(os.environ.get("OUT") or "/tmp/q3t-out")
INT8 = os.environ.get("GEMV_WEIGHTS", "bf16") == "int8"
DTYPE = library.I8 if INT8 else library.BF16
NBS = (1, 2, 4, 8, 16)
CUBLAS_NBS = (16, 64)  # vectors of the cuBLAS yardstick (torch.mm)
G = library.GEMV_SWIGLU
# label, rows, K, mode, fused RMSNorm, bias, launches per step (1.7B, 0.6B): bench_gemv's shapes and
# counts (the Talker's 28 layers, the CodePredictor's 16 positions x 5 layers one position at a time, the
# 0.6B Talker at the CodePredictor's shapes, 15 lm_heads, codec_head), except small_to_mtp: with the
# projected input tables (the default) only position 0 goes through it.
SHAPES = [(*shape[:6], (1, 0)) if "small_to_mtp" in shape[0] else shape for shape in bench_gemv.SHAPES]
rows_out: list[dict] = []


def emit(rec: dict) -> None:
    rows_out.append(rec)
    print(json.dumps(rec), flush=True)


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def time_graph(issue: Callable[[int], None], launches: int) -> float:
    """µs per launch of `launches` launches (issue(i) makes launch i) captured in one graph: one eager
    round first (loads the kernels), then the median of 7 timings of 3 replays."""
    for i in range(min(launches, 4)):
        issue(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            issue(i)
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
        times.append(e0.elapsed_time(e1) * 1000 / (3 * launches))
    del graph
    return statistics.median(times)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write), the reference for 'memory-bound'."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2**30 / time_graph(lambda i: dst.copy_(src), 20) / 1e3


def bench_gemv(lib: library.Native, copy_gbs: float) -> None:
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    for shape in SHAPES:
        emit(_bench_shape(lib, g, copy_gbs, *shape))
        torch.cuda.empty_cache()


def _bench_shape(
    lib: library.Native,
    g: torch.Generator,
    copy_gbs: float,
    label: str,
    n: int,
    k: int,
    mode: int,
    norm: bool,
    bias: bool,
    per_step: tuple[int, int],
) -> dict:
    nbytes = n * k * (1 if INT8 else 2)
    copies = max(2, -(-256 * 2**20 // nbytes))
    launches = copies * max(1, -(-240 // copies))
    if INT8:
        w = torch.randint(-127, 128, (copies, n, k), device="cuda", generator=g, dtype=torch.int8)
        w_scale = torch.rand(copies, n, device="cuda", generator=g) * 1e-3 + 1e-4
    else:
        w = (torch.randn(copies, n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
        w_scale = None

    def scale(i: int) -> int | None:
        return None if w_scale is None else w_scale[i % copies].data_ptr()

    x = torch.randn(16, k, device="cuda", generator=g)
    nw = torch.rand(k, device="cuda", generator=g) + 0.5 if norm else None
    b = torch.randn(n, device="cuda", generator=g) if bias else None
    y = torch.zeros(16, n // 2 if mode == G else n, device="cuda")
    ptrs = (nw.data_ptr() if nw is not None else None, b.data_ptr() if b is not None else None)
    rec: dict = {
        "part": "gemv",
        "shape": label,
        "n": n,
        "k": k,
        "mode": mode,
        "mb": round(nbytes / 1e6, 2),
        "per_step_1.7b": per_step[0],
        "per_step_0.6b": per_step[1],
    }
    rec["us_one_vector"] = round(
        time_graph(
            lambda i: lib.call(
                "q3t_gemv",
                DTYPE,
                w[i % copies].data_ptr(),
                scale(i),
                n,
                k,
                x.data_ptr(),
                ptrs[0],
                1e-6,
                ptrs[1],
                y.data_ptr(),
                mode,
                stream(),
            ),
            launches,
        ),
        3,
    )
    # The step's kernel (tensor cores where the device has them: with scratch), then the FMA kernel.
    floats = lib.lib.q3t_batched_gemv_scratch_floats(DTYPE, n, k)
    scratch = torch.zeros(max(floats, 1), device="cuda")
    for nb in NBS:
        for key, scr in (("", scratch), ("fma_", None)):
            us = time_graph(
                lambda i, nb=nb, scr=scr: lib.call(
                    "q3t_batched_gemv",
                    DTYPE,
                    w[i % copies].data_ptr(),
                    scale(i),
                    n,
                    k,
                    x.data_ptr(),
                    nb,
                    ptrs[0],
                    1e-6,
                    ptrs[1],
                    y.data_ptr(),
                    mode,
                    None if scr is None else scr.data_ptr(),
                    0 if scr is None else scr.numel(),
                    stream(),
                ),
                launches,
            )
            rec[f"us_{key}nb{nb}"] = round(us, 3)
        us = rec[f"us_nb{nb}"]
        rec[f"gbs_nb{nb}"] = round(nbytes / us / 1e3, 1)
        rec[f"copy_frac_nb{nb}"] = round(nbytes / us / 1e3 / copy_gbs, 3)
        rec[f"tflops_nb{nb}"] = round(2 * n * k * nb / us / 1e6, 2)
    # cuBLAS on the same weights (torch.mm, bf16 in and out, no fused norm, bias or SwiGLU): what a plain GEMM
    # costs at 16 and at 64 vectors, where the 64-stream step runs four of our launches of 16. A yardstick for
    # a wider batched GEMV, not a drop-in: its sums are not those of a stream alone.
    if INT8:
        return rec
    xb = torch.randn(CUBLAS_NBS[-1], k, device="cuda", generator=g).to(torch.bfloat16)
    yb = torch.empty(CUBLAS_NBS[-1], n, device="cuda", dtype=torch.bfloat16)
    for nb in CUBLAS_NBS:
        us = time_graph(lambda i, nb=nb: torch.mm(xb[:nb], w[i % copies].t(), out=yb[:nb]), launches)
        rec[f"us_cublas_nb{nb}"] = round(us, 3)
        rec[f"gbs_cublas_nb{nb}"] = round(nbytes / us / 1e3, 1)
    return rec


def bench_ops(lib: library.Native) -> None:
    from wyoming_qwen3tts.model.layers import rope_tables

    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev)
    g.manual_seed(1)
    hq, hkv, d, splits, max_seq, slots = 16, 8, 128, 32, 2048, 16
    cos, sin = (t.contiguous() for t in rope_tables(torch.arange(max_seq, device=dev), d, 1e6, torch.float32))
    qn, kn = torch.ones(d, device=dev), torch.ones(d, device=dev)
    row = (hq + 2 * hkv) * d
    qkv = torch.randn(16, 2, row, device=dev, generator=g)
    out = torch.zeros(16, 2, hq * d, device=dev)
    talker = (torch.randn(slots, 1, 2, max_seq, hkv, d, device=dev, generator=g) * 0.5).to(bf)
    cp = (torch.randn(16, 5, 2, 16, hkv, d, device=dev, generator=g) * 0.5).to(bf)
    per_row = hq * splits * (d + 2) + hq
    scratch = torch.zeros(16 * per_row, device=dev)
    slot = torch.arange(16, dtype=torch.int32, device=dev)
    pos = torch.zeros(slots, dtype=torch.int32, device=dev)
    step = torch.full((slots,), 5, dtype=torch.int32, device=dev)
    seed = torch.arange(slots, dtype=torch.int64, device=dev)
    rec_dtype = library.SAMPLE_PARAMS_DTYPE
    code0 = np.zeros(slots, dtype=rec_dtype)
    code0["flags"], code0["temperature"], code0["top_k"], code0["top_p"] = library.SAMPLE_DO_SAMPLE, 0.9, 50, 1.0
    code0["penalty"], code0["eos"], code0["min_new_tokens"] = 1.05, 2150, 2
    sub = code0.copy()
    sub["penalty"], sub["eos"], sub["min_new_tokens"] = 1.0, -1, 0
    params0 = torch.from_numpy(code0.view(np.uint8).copy()).to(dev)
    params_sub = torch.from_numpy(sub.view(np.uint8).copy()).to(dev)
    logits0 = torch.randn(16, 3072, device=dev, generator=g) * 3
    logits_cp = torch.randn(16, 2048, device=dev, generator=g) * 3
    seen = (torch.rand(slots, 3072, device=dev, generator=g) < 0.05).to(torch.uint8)
    codes = torch.zeros(16, 16, dtype=torch.int32, device=dev)
    cx = torch.zeros(16, 2048, device=dev)
    history = torch.zeros(slots, 4096, 16, dtype=torch.int32, device=dev)
    x2048 = torch.randn(16, 2048, device=dev, generator=g)
    hn = torch.zeros(16, 2048, device=dev)
    normw = torch.rand(2048, device=dev, generator=g) + 0.5
    emb = [torch.randn(3072 if j == 0 else 2048, 2048, device=dev, generator=g).to(bf) for j in range(16)]
    emb_ptrs = torch.tensor([t.data_ptr() for t in emb], dtype=torch.int64, device=dev)
    trailing = torch.randn(slots, 64, 2048, device=dev, generator=g)
    n_trailing = torch.full((slots,), 64, dtype=torch.int32, device=dev)
    pad = torch.randn(slots, 2048, device=dev, generator=g)
    scale = d**-0.5

    def talker_attn(n_splits: int) -> Callable[[int], Callable[[int], None]]:
        return lambda nb: (
            lambda i: lib.call(
                "q3t_batched_rope_attention_split",
                library.BF16,
                qkv.data_ptr(),
                qn.data_ptr(),
                kn.data_ptr(),
                1e-6,
                cos.data_ptr(),
                sin.data_ptr(),
                slot.data_ptr(),
                pos.data_ptr(),
                nb,
                hq,
                hkv,
                d,
                max_seq,
                scale,
                n_splits,
                scratch.data_ptr(),
                talker[0, 0, 0].data_ptr(),
                talker[0, 0, 1].data_ptr(),
                2 * max_seq,
                out.data_ptr(),
                stream(),
            )
        )

    # The split count is the decoder's (batched.attention_splits: 2 for 16 slots); 32 was the batch-1 frame's.
    ops: dict[str, Callable[[int], Callable[[int], None]]] = {
        f"talker attention ctx {ctx} splits {n}": talker_attn(n) for ctx in (200, 1000) for n in (2, 4, 8, 32)
    }
    ops |= {
        "CP attention (position 8)": lambda nb: (
            lambda i: lib.call(
                "q3t_batched_rope_attention",
                library.BF16,
                qkv.data_ptr(),
                qn.data_ptr(),
                kn.data_ptr(),
                1e-6,
                cos.data_ptr(),
                sin.data_ptr(),
                None,
                8,
                nb,
                hq,
                hkv,
                d,
                16,
                scale,
                cp[0, 2, 0].data_ptr(),
                cp[0, 2, 1].data_ptr(),
                5 * 2 * 16,
                out.data_ptr(),
                stream(),
            )
        ),
        "CP attention (positions 0, 1)": lambda nb: (
            lambda i: lib.call(
                "q3t_batched_rope_attention_first",
                library.BF16,
                qkv.data_ptr(),
                qn.data_ptr(),
                kn.data_ptr(),
                1e-6,
                cos.data_ptr(),
                sin.data_ptr(),
                2,
                nb,
                hq,
                hkv,
                d,
                16,
                scale,
                cp[0, 2, 0].data_ptr(),
                cp[0, 2, 1].data_ptr(),
                5 * 2 * 16,
                out.data_ptr(),
                stream(),
            )
        ),
        "sample code 0 (top-k 50, penalty)": lambda nb: (
            lambda i: lib.call(
                "q3t_batched_sample",
                logits0.data_ptr(),
                3072,
                nb,
                slot.data_ptr(),
                params0.data_ptr(),
                seed.data_ptr(),
                step.data_ptr(),
                seen.data_ptr(),
                2048,
                3072,
                0,
                codes.data_ptr(),
                16,
                library.BF16,
                emb[0].data_ptr(),
                3072,
                2048,
                cx.data_ptr(),
                2048,
                stream(),
            )
        ),
        "sample CP code (top-k 50)": lambda nb: (
            lambda i: lib.call(
                "q3t_batched_sample",
                logits_cp.data_ptr(),
                2048,
                nb,
                slot.data_ptr(),
                params_sub.data_ptr(),
                seed.data_ptr(),
                step.data_ptr(),
                None,
                0,
                0,
                3,
                codes[:, 3:].data_ptr(),
                16,
                library.BF16,
                emb[4].data_ptr(),
                2048,
                2048,
                cx.data_ptr(),
                2048,
                stream(),
            )
        ),
        "embed_sum (h 2048)": lambda nb: (
            lambda i: lib.call(
                "q3t_batched_embed_sum",
                library.BF16,
                emb_ptrs.data_ptr(),
                16,
                3072,
                2048,
                2048,
                codes.data_ptr(),
                nb,
                slot.data_ptr(),
                trailing.data_ptr(),
                64,
                n_trailing.data_ptr(),
                pad.data_ptr(),
                step.data_ptr(),
                x2048.data_ptr(),
                stream(),
            )
        ),
        "rmsnorm (2048)": lambda nb: (
            lambda i: lib.call(
                "q3t_batched_rmsnorm", x2048.data_ptr(), normw.data_ptr(), hn.data_ptr(), 2048, nb, 1e-6, stream()
            )
        ),
        "store_codes + advance": lambda nb: (
            lambda i: (
                lib.call(
                    "q3t_batched_store_codes",
                    codes.data_ptr(),
                    16,
                    nb,
                    slot.data_ptr(),
                    step.data_ptr(),
                    history.data_ptr(),
                    4096,
                    stream(),
                )
                if i % 2 == 0
                else lib.call("q3t_batched_advance", slot.data_ptr(), nb, None, None, stream())
            )
        ),
    }
    kv_bytes_per_pos = 2 * hkv * d * 2
    for name, make in ops.items():
        rec: dict = {"part": "op", "op": name}
        ctx = 200 if "ctx 200" in name else 1000 if "ctx 1000" in name else None
        if ctx is not None:
            pos.fill_(ctx - 1)
        for nb in NBS:
            scratch.zero_()  # the split counters start at 0 for whatever split count comes next
            us = time_graph(make(nb), 200)
            rec[f"us_nb{nb}"] = round(us, 3)
            if ctx is not None:
                rec[f"kv_gbs_nb{nb}"] = round(nb * ctx * kv_bytes_per_pos / us / 1e3, 1)
        emit(rec)


# Launches of each op in one batched step of either size (the CodePredictor one position at a time;
# the Talker's attention at a context of 200).
STEP_OPS = {
    "talker attention ctx 200 splits 2": 28,
    "CP attention (position 8)": 80,
    "sample code 0 (top-k 50, penalty)": 1,
    "sample CP code (top-k 50)": 15,
    "embed_sum (h 2048)": 1,
    "rmsnorm (2048)": 1,
    "store_codes + advance": 2,
}


def table(copy_gbs: float) -> str:
    lines = [
        f"## Batched-step kernels ({'int8' if INT8 else 'bf16'}), {torch.cuda.get_device_name()}",
        "",
        f"Device-to-device copy: {copy_gbs:.0f} GB/s (read + write).",
        "",
    ]
    gemv = [r for r in rows_out if r["part"] == "gemv"]
    if gemv:
        lines += [
            "### GEMV: µs per launch (GB/s of weights; the FMA kernel's µs); t(nb)/t(1); q3t_gemv for one vector",
            "",
            "| shape | rows x K | MB | q3t_gemv | "
            + " | ".join(f"nb {nb}" for nb in NBS)
            + " | t(16)/t(1) | nb 16 GB/s / copy | nb 16 TFLOP/s |",
            "|---" * (7 + len(NBS)) + "|",
        ]
        for r in gemv:
            cells = [f"{r[f'us_nb{nb}']} ({r[f'gbs_nb{nb}']}; FMA {r[f'us_fma_nb{nb}']})" for nb in NBS]
            lines.append(
                f"| {r['shape']} | {r['n']}x{r['k']} | {r['mb']} | {r['us_one_vector']} | "
                + " | ".join(cells)
                + f" | {r['us_nb16'] / r['us_nb1']:.2f} | {r['copy_frac_nb16']:.2f} | {r['tflops_nb16']} |"
            )
        big = [r for r in gemv if r["mb"] >= 16]
        if big:
            frac = min(r["copy_frac_nb16"] for r in big)
            ratio = max(r["us_nb16"] / r["us_nb1"] for r in big)
            lines += [
                "",
                f"Matrices of >= 16 MB at nb 16: at least {frac:.0%} of copy bandwidth, at most "
                f"{ratio:.2f}x the nb-1 time: "
                + ("memory-bound" if frac >= 0.6 and ratio <= 1.5 else "NOT memory-bound (FMA- or latency-bound)")
                + ".",
            ]
        lines.append("")
        for size, col in (("1.7B", "per_step_1.7b"), ("0.6B", "per_step_0.6b")):
            ms = {key: sum(r[key] * r[col] for r in gemv) / 1000 for key in ("us_one_vector", "us_nb1", "us_fma_nb1")}
            lines.append(
                f"{size}, one vector: a step's GEMVs {ms['us_one_vector']:.3f} ms on q3t_gemv, {ms['us_nb1']:.3f} ms "
                f"on the step's kernel, {ms['us_fma_nb1']:.3f} ms on the FMA kernel."
            )
        if not INT8:
            lines += [
                "",
                "### Against cuBLAS (torch.mm, bf16 in and out): µs per launch (GB/s of weights)",
                "",
                "| shape | ours nb 16 | cuBLAS nb 16 | ours x4 (64 vectors, as the 64-stream step) | cuBLAS nb 64 |",
                "|---|---|---|---|---|",
            ]
            for r in gemv:
                lines.append(
                    f"| {r['shape']} | {r['us_nb16']} ({r['gbs_nb16']}) | {r['us_cublas_nb16']} "
                    f"({r['gbs_cublas_nb16']}) | {4 * r['us_nb16']:.3f} | {r['us_cublas_nb64']} ({r['gbs_cublas_nb64']}) |"
                )
            for size, col in (("1.7B", "per_step_1.7b"), ("0.6B", "per_step_0.6b")):
                ours64 = sum(4 * r["us_nb16"] * r[col] for r in gemv) / 1000
                cublas64 = sum(r["us_cublas_nb64"] * r[col] for r in gemv) / 1000
                lines.append(f"\n{size}: a 64-stream step's GEMVs {ours64:.3f} ms ours, {cublas64:.3f} ms cuBLAS.")
    ops = [r for r in rows_out if r["part"] == "op"]
    if ops:
        lines += [
            "",
            "### Other batched kernels: µs per launch",
            "",
            "| op | " + " | ".join(f"nb {nb}" for nb in NBS) + " |",
            "|---" * (1 + len(NBS)) + "|",
        ]
        for r in ops:
            extra = [f" ({r[f'kv_gbs_nb{nb}']} GB/s)" if f"kv_gbs_nb{nb}" in r else "" for nb in NBS]
            lines.append(f"| {r['op']} | " + " | ".join(f"{r[f'us_nb{nb}']}{e}" for nb, e in zip(NBS, extra)) + " |")
    if gemv:
        lines += [
            "",
            "### One step: sum of kernel times (no gaps), and the frames/s it bounds",
            "",
            "| size | " + " | ".join(f"nb {nb}: GEMV ms / all ms / frames/s" for nb in NBS) + " |",
            "|---" * (1 + len(NBS)) + "|",
        ]
        op_us = {r["op"]: r for r in ops}
        for size, col in (("1.7B", "per_step_1.7b"), ("0.6B", "per_step_0.6b")):
            cells = []
            for nb in NBS:
                gemv_ms = sum(r[f"us_nb{nb}"] * r[col] for r in gemv) / 1000
                other_ms = (
                    sum(op_us[name][f"us_nb{nb}"] * count for name, count in STEP_OPS.items() if name in op_us) / 1000
                )
                total = gemv_ms + other_ms
                cells.append(f"{gemv_ms:.3f} / {total:.3f} / {1000 * nb / total:.0f}")
            lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(parts: list[str]) -> None:
    lib = native_library()  # GEMV_LIB: another build of the library (an A/B in one call)
    lib.call("q3t_set_pdl", 1 if torch.cuda.get_device_capability()[0] >= 9 else 0)
    copy_gbs = copy_bandwidth()
    emit({"part": "copy", "gbs": round(copy_gbs, 1)})
    for part in parts:
        try:
            if part == "gemv":
                bench_gemv(lib, copy_gbs)
            else:
                bench_ops(lib)
        except Exception as err:
            emit({"part": "error", "what": part, "error": repr(err)})
    OUT.mkdir(parents=True, exist_ok=True)
    md = table(copy_gbs)
    (OUT / f"batched_bench{os.environ.get('GEMV_TAG', '')}.md").write_text(md)
    print(md, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["gemv", "ops"])
