"""The CodePredictor's positions 2..15 (one frame's passes 2-15, the real shapes, random bf16 weights): the layered
launches and the persistent kernel (q3t_cp_passes), each captured in a graph and replayed, PDL on, greedy and
sampled (top-k 50, temperature 0.9); then where the persistent kernel's time goes, from block 0's clock marks
(q3t.h: start, input staged, weights landed, computed, past the barrier, per phase).

Usage: python kernels/device/trace_cp.py [--reps 200] [--out DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))

from test_cp_passes_gpu import CP, Start, _weights

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.frame import NUM_GROUPS, launch_cp_passes, launch_layers
from wyoming_qwen3tts.backends.kernels.ops import Ops

DEV = "cuda"
KINDS = ("qkv", "attention", "o", "gate/up", "down")
STEPS = ("stage", "weights", "compute", "barrier")


def timed(fn, reps: int) -> float:
    """µs per replay of fn captured in a graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(stream.cuda_stream)  # eager first: loads the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn(stream.cuda_stream)
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def main(argv: list[str]) -> None:
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 200
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    ops = Ops(library.load(0))
    ops.set_pdl(True)
    w = _weights(1, torch.float32)
    b, x = Start(2).buffers()
    logits = torch.zeros(CP.vocab_size, device=DEV)
    codes = torch.zeros(NUM_GROUPS, dtype=torch.int32, device=DEV)
    sync = torch.zeros(2, dtype=torch.int32, device=DEV)
    seed = torch.tensor([7], dtype=torch.int64, device=DEV)
    step = torch.tensor([3], dtype=torch.int32, device=DEV)
    results: dict[str, float | dict] = {"gpu": torch.cuda.get_device_name(), "reps": reps}
    for mode, draw in (
        ("greedy", {}),
        ("sampled", {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0}),
    ):

        def layered(stream: int, draw=draw) -> None:
            for j in range(2, NUM_GROUPS):
                launch_layers(ops, w.code_predictor, b, x, stream, pos_add=j)
                ops.gemv(w.lm_heads[j - 1], x, logits, norm_w=w.cp_norm, eps=CP.rms_norm_eps, stream=stream)
                table = w.cp_inputs[j] if j + 1 < NUM_GROUPS else None
                ops.sample(
                    logits,
                    codes[j : j + 1],
                    do_sample=draw.get("do_sample", False),
                    temperature=draw.get("temperature", 1.0),
                    top_k=draw.get("top_k", 0),
                    top_p=draw.get("top_p", 1.0),
                    seed=seed,
                    stream_id=j,
                    step=step,
                    row_table=table,
                    row_out=x if table is not None else None,
                    stream=stream,
                )

        def persistent(stream: int, draw=draw, trace=None) -> None:
            launch_cp_passes(
                ops,
                w,
                b,
                x=x,
                logits=logits,
                codes=codes,
                sync=sync,
                stream=stream,
                seed=seed,
                step=step,
                trace=trace,
                **draw,
            )

        t_layered, t_persistent = timed(layered, reps), timed(persistent, reps)
        results[mode] = {"layered_us": t_layered, "persistent_us": t_persistent}
        print(
            f"{mode}: positions 2..15 layered {t_layered:.1f} µs, persistent {t_persistent:.1f} µs "
            f"({t_layered / t_persistent:.2f}x); per position {t_layered / 14:.1f} vs {t_persistent / 14:.1f} µs"
        )

        # Block 0's clock marks of one eager launch, turned into µs by the launch's own duration.
        per_pos = 23 * CP.num_hidden_layers + 6
        trace = torch.zeros(14 * per_pos, dtype=torch.int64, device=DEV)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        persistent(torch.cuda.current_stream().cuda_stream, trace=trace)
        end.record()
        torch.cuda.synchronize()
        marks = trace.cpu().double()
        span_us = start.elapsed_time(end) * 1000
        per_clock = span_us / float(marks[-1] - marks[0])  # µs per clock, near enough (the launch's ramp apart)
        sums = {k: {s: 0.0 for s in STEPS} for k in (*KINDS, "head")}
        draw_us = 0.0
        for p in range(14):
            m = marks[p * per_pos : (p + 1) * per_pos]
            i = 0
            for _ in range(CP.num_hidden_layers):
                for kind in KINDS:
                    if kind == "attention":
                        sums[kind]["compute"] += float(m[i + 1] - m[i]) * per_clock
                        sums[kind]["barrier"] += float(m[i + 2] - m[i + 1]) * per_clock
                        i += 3
                    else:
                        for s_i, s in enumerate(STEPS):
                            sums[kind][s] += float(m[i + s_i + 1] - m[i + s_i]) * per_clock
                        i += 5
            for s_i, s in enumerate(STEPS):
                sums["head"][s] += float(m[i + s_i + 1] - m[i + s_i]) * per_clock
            draw_us += float(m[i + 5] - m[i + 4]) * per_clock
            if p + 1 < 14:  # the gap to the next position's first mark is the draw's tail: counted there
                draw_us += float(marks[(p + 1) * per_pos] - m[i + 5]) * per_clock
        print(f"  block 0's marks ({span_us:.1f} µs launch), µs per position, by phase and step:")
        print("  | phase | " + " | ".join(STEPS) + " | total |")
        for kind, steps in sums.items():
            tot = sum(steps.values()) / 14
            print(f"  | {kind} | " + " | ".join(f"{v / 14:.2f}" for v in steps.values()) + f" | {tot:.2f} |")
        print(f"  | draw | | | {draw_us / 14:.2f} | | {draw_us / 14:.2f} |")
        results[mode]["trace_us_per_position"] = {k: {s: v / 14 for s, v in st.items()} for k, st in sums.items()}
        results[mode]["draw_us_per_position"] = draw_us / 14
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "trace_cp.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
