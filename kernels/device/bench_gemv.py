"""GEMV v1 (gemv.cu, the default) against v2 (gemv_v2.cu, Q3T_GEMV=v2), side by side, on the GPU.

Two parts, one process (the variant is switched by re-running q3t_init with Q3T_GEMV set):
1. Every GEMV shape of the decode loop alone, bf16: a captured graph of >= 240 back-to-back
   launches that rotate over enough weight copies (>= 256 MB) that every launch reads HBM, not
   L2; microseconds per launch and achieved GB/s (weight bytes / time), PDL on and off.
2. The whole frame on random full-size models (bf16, default sampling, 200 frames after
   warm-up, PDL on): ms/frame for v1, v2, v1, v2 (interleaved, so clock drift shows as spread),
   graph replay ms, and from 5 eager frames under the torch profiler (PDL off) the GEMV kernel
   time per frame.

Prints JSON lines, then a markdown table, which it also writes to $OUT/gemv_bench.md (the
device check tees the rest to $OUT/bench_gemv.log). Usage: python kernels/device/bench_gemv.py [shapes] [0.6b] [1.7b]
(default: all three parts).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_model, text_ids, timed  # noqa: E402

from wyoming_qwen3tts import native  # noqa: E402

OUT = Path(os.environ.get("OUT") or "/tmp/q3t-out")
VARIANTS = ("v1", "v2")  # the frame part
# The shape part also tries v2 with other Q3T_GEMV_FILL values ("v2@4": fill 4), PDL on only.
SHAPE_VARIANTS = tuple(os.environ.get("GEMV_VARIANTS", "v1 v2 v2@1 v2@4").split())
S, A, G = native.GEMV_STORE, native.GEMV_ADD, native.GEMV_SWIGLU
# label, rows, K, mode, fused RMSNorm, bias, launches per frame (1.7B, 0.6B)
SHAPES = [
    ("1.7B Talker qkv", 4096, 2048, S, True, False, (28, 0)),
    ("1.7B Talker o_proj", 2048, 2048, A, False, False, (28, 0)),
    ("1.7B Talker gate/up", 12288, 2048, G, True, False, (28, 0)),
    ("1.7B Talker down", 2048, 6144, A, False, False, (28, 0)),
    ("1.7B codec_head", 3072, 2048, S, False, False, (1, 0)),
    ("1.7B small_to_mtp", 1024, 2048, S, False, True, (16, 0)),
    ("CP / 0.6B qkv", 4096, 1024, S, True, False, (80, 108)),
    ("CP / 0.6B o_proj", 1024, 2048, A, False, False, (80, 108)),
    ("CP / 0.6B gate/up", 6144, 1024, G, True, False, (80, 108)),
    ("CP / 0.6B down", 1024, 3072, A, False, False, (80, 108)),
    ("CP lm_head", 2048, 1024, S, True, False, (15, 15)),
    ("0.6B codec_head", 3072, 1024, S, False, False, (0, 1)),
]
rows_out: list[dict] = []


def emit(rec: dict) -> None:
    rows_out.append(rec)
    print(json.dumps(rec), flush=True)


def use_variant(lib: native.Native, variant: str) -> None:
    """"v1", "v2" or "v2@FILL": sets Q3T_GEMV / Q3T_GEMV_FILL and re-runs q3t_init, which reads them."""
    name, _, fill = variant.partition("@")
    os.environ["Q3T_GEMV"] = name
    if fill:
        os.environ["Q3T_GEMV_FILL"] = fill
    else:
        os.environ.pop("Q3T_GEMV_FILL", None)
    lib.init(0)


def bench_shapes(lib: native.Native) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    for label, n, k, mode, norm, bias, per_frame in SHAPES:
        nbytes = n * k * 2
        copies = max(2, -(-256 * 2**20 // nbytes))
        reps = max(1, -(-240 // copies))
        w = (torch.randn(copies, n, k, device=dev, generator=g) * 0.05).to(torch.bfloat16)
        x = torch.randn(k, device=dev, generator=g)
        nw = torch.rand(k, device=dev, generator=g) + 0.5
        b = torch.randn(n, device=dev, generator=g) if bias else None
        y = torch.zeros(n // 2 if mode == G else n, device=dev)
        rec: dict = {"part": "shape", "shape": label, "n": n, "k": k, "mode": mode, "mb": round(nbytes / 1e6, 2),
                     "launches": copies * reps, "per_frame_1.7b": per_frame[0], "per_frame_0.6b": per_frame[1]}  # fmt: skip
        for pdl, variants in ((1, SHAPE_VARIANTS), (0, VARIANTS)):
            for variant in variants:
                use_variant(lib, variant)
                lib.call("q3t_set_pdl", pdl)
                # One launch outside the graph first (loads the kernel), then the captured chain.
                lib.call("q3t_gemv", native.BF16, w[0].data_ptr(), n, k, x.data_ptr(), nw.data_ptr() if norm else None,
                         1e-6, b.data_ptr() if b is not None else None, y.data_ptr(), mode,
                         torch.cuda.current_stream().cuda_stream)  # fmt: skip
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    st = torch.cuda.current_stream().cuda_stream
                    for _ in range(reps):
                        for c in range(copies):
                            lib.call("q3t_gemv", native.BF16, w[c].data_ptr(), n, k, x.data_ptr(),
                                     nw.data_ptr() if norm else None, 1e-6,
                                     b.data_ptr() if b is not None else None, y.data_ptr(), mode, st)  # fmt: skip
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
                tag = f"{variant}{'_pdl' if pdl else ''}"
                rec[f"us_{tag}"] = round(us, 3)
                rec[f"gbs_{tag}"] = round(nbytes / us / 1e3, 1)
                del graph
        lib.call("q3t_set_pdl", 0)
        emit(rec)
        del w
        torch.cuda.empty_cache()


def bench_frames(lib: native.Native, size: str) -> None:
    from wyoming_qwen3tts.backends.kernel_backend import KernelBackend
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.request import SamplingParams

    model = random_model(size, torch.bfloat16)
    prompt = build_prompt(model, text_ids(20), "ryan", "english")
    s = SamplingParams()
    kb = KernelBackend(model, pdl=True)
    res: dict = {"part": "frame", "size": size, "gpu": torch.cuda.get_device_name()}
    for variant in (*VARIANTS, *VARIANTS):
        use_variant(lib, variant)
        kb._graph = None  # re-capture: the graph holds the kernels chosen at capture time
        kb.pdl = True
        sess = kb.start(prompt, s, 0, 1000)
        sess.next_frames(4)
        got, seconds = timed(lambda: sess.next_frames(200))
        assert len(got) == 200, len(got)
        res.setdefault(f"ms_per_frame_{variant}", []).append(round(1000 * seconds / 200, 4))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(50):
            kb._graph.replay()
        e1.record()
        torch.cuda.synchronize()
        res.setdefault(f"graph_replay_ms_{variant}", []).append(round(e0.elapsed_time(e1) / 50, 4))
    # Kernel time per frame from 5 eager frames, PDL off (as kernels/device/bench.py profiles).
    try:
        from torch.profiler import ProfilerActivity, profile

        kb.pdl = False
        kb._set_pdl()
        stream = torch.cuda.current_stream().cuda_stream
        for variant in VARIANTS:
            use_variant(lib, variant)
            kb._frame_calls(s, stream)  # warm-up
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    kb._frame_calls(s, stream)
                torch.cuda.synchronize()
            total = gemv = 0.0
            n_gemv = 0
            for ev in prof.key_averages():
                t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
                if t <= 0:
                    continue
                total += t
                if "gemv" in ev.key:
                    gemv += t
                    n_gemv += ev.count
            res[f"eager_kernel_us_per_frame_{variant}"] = round(total / 5, 1)
            res[f"eager_gemv_us_per_frame_{variant}"] = round(gemv / 5, 1)
            res[f"gemv_launches_per_frame_{variant}"] = n_gemv // 5
    except Exception as err:  # noqa: BLE001 - the profile is extra information only
        res["profile_error"] = repr(err)
    emit(res)
    del kb, model
    torch.cuda.empty_cache()


def table() -> str:
    lines = ["## GEMV v1 vs v2 (bf16)", ""]
    shapes = [r for r in rows_out if r["part"] == "shape"]
    if shapes:
        lines += ["Per launch in a chain of the same GEMV over rotating weights (HBM, not L2): us (GB/s).", "",
                  "| shape | rows x K | MB | " + " | ".join(f"{v} PDL" for v in SHAPE_VARIANTS)
                  + " | v2/v1 PDL | " + " | ".join(f"{v} no PDL" for v in VARIANTS) + " |",
                  "|---" * (4 + len(SHAPE_VARIANTS) + len(VARIANTS)) + "|"]  # fmt: skip
        for r in shapes:
            cells = [f"{r.get(f'us_{v}_pdl')} ({r.get(f'gbs_{v}_pdl')})" for v in SHAPE_VARIANTS]
            ratio = r["us_v2_pdl"] / r["us_v1_pdl"] if r.get("us_v1_pdl") and r.get("us_v2_pdl") else float("nan")
            lines.append(f"| {r['shape']} | {r['n']}x{r['k']} | {r['mb']} | " + " | ".join(cells)
                         + f" | {ratio:.2f} | " + " | ".join(str(r.get(f"us_{v}")) for v in VARIANTS) + " |")  # fmt: skip
        lines.append("")
        for size, col in (("1.7b", "per_frame_1.7b"), ("0.6b", "per_frame_0.6b")):
            sums = [f"{v} {sum(r.get(f'us_{v}_pdl', 0) * r[col] for r in shapes) / 1000:.3f} ms" for v in SHAPE_VARIANTS]
            lines.append(f"Sum over one {size} frame's GEMVs (launches per frame x us, PDL): " + ", ".join(sums) + "  ")
    frames = [r for r in rows_out if r["part"] == "frame"]
    if frames:
        lines += ["", "| size | v1 ms/frame | v2 ms/frame | v1 replay ms | v2 replay ms | v1 GEMV us/frame (eager) | "
                  "v2 GEMV us/frame (eager) | v1 / v2 all kernels us (eager) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in frames:
            lines.append(
                f"| {r['size']} | {r['ms_per_frame_v1']} | {r['ms_per_frame_v2']} | {r['graph_replay_ms_v1']} | "
                f"{r['graph_replay_ms_v2']} | {r.get('eager_gemv_us_per_frame_v1')} | {r.get('eager_gemv_us_per_frame_v2')} | "
                f"{r.get('eager_kernel_us_per_frame_v1')} / {r.get('eager_kernel_us_per_frame_v2')} |"
            )
    return "\n".join(lines) + "\n"


def main(parts: list[str]) -> None:
    lib = native.load(0)
    saved = os.environ.get("Q3T_GEMV")
    try:
        for part in parts:
            try:
                if part == "shapes":
                    bench_shapes(lib)
                else:
                    bench_frames(lib, part)
            except Exception as err:  # noqa: BLE001 - one failed part must not lose the others' numbers
                emit({"part": "error", "what": part, "error": repr(err)})
    finally:
        if saved is None:
            os.environ.pop("Q3T_GEMV", None)
        else:
            os.environ["Q3T_GEMV"] = saved
        lib.init(0)
    OUT.mkdir(parents=True, exist_ok=True)
    md = table()
    (OUT / "gemv_bench.md").write_text(md)
    print(md, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["shapes", "0.6b", "1.7b"])
