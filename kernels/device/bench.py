"""Per-frame decode time, kernel backend vs torch backend, on random full-size models (bf16).

Prints one JSON line per measurement. Usage: python kernels/device/bench.py [0.6b 1.7b]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_model, text_ids, timed

from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.backends.torch_backend import TorchBackend
from wyoming_qwen3tts.model.prompt import build_prompt
from wyoming_qwen3tts.request import SamplingParams


def replay_ms(graph: torch.cuda.CUDAGraph, n: int = 100) -> float:
    """Graph replay alone, timed by CUDA events."""
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(n):
        graph.replay()
    ev1.record()
    torch.cuda.synchronize()
    return ev0.elapsed_time(ev1) / n


def kernel_profile(kb: KernelBackend, s: SamplingParams, size: str) -> dict[str, object]:
    """Kernel durations of 5 eager frames (sum of kernel time vs the graph's wall time shows how much
    is launch/dependency latency)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            kb.launch_frame(s)
        torch.cuda.synchronize()
    rows = []
    total = 0.0
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if t <= 0:
            continue
        total += t
        rows.append((t / 5, ev.count // 5, ev.key[:60]))
    rows.sort(reverse=True)
    return {
        "size": size,
        "kernel_us_per_frame_total": round(total / 5, 1),
        "top": [[round(a, 1), c, k] for a, c, k in rows[:12]],
    }


def main(sizes: list[str]) -> None:
    for size in sizes:
        model = random_model(size, torch.bfloat16)
        prompt = build_prompt(model, text_ids(20), "ryan", "english")
        s = SamplingParams()
        res: dict[str, object] = {
            "size": size,
            "dtype": "bf16",
            "prompt_len": prompt.length,
            "gpu": torch.cuda.get_device_name(),
        }
        torch_session = TorchBackend(model).start(prompt, s, 0, 10_000)
        torch_session.next_frames(2)
        _, dt = timed(lambda: torch_session.next_frames(8))
        res["torch_ms_per_frame"] = round(1000 * dt / 8, 3)
        for pdl in (False, True):
            tag = "_pdl" if pdl else ""
            kb = KernelBackend(model, KernelOptions(pdl=pdl))
            first, t_first = timed(lambda: kb.start(prompt, s, 0, 1000))
            first.next_frames(4)
            _, dt = timed(lambda: first.next_frames(200))
            res[f"kernel_ms_per_frame_group200{tag}"] = round(1000 * dt / 200, 4)
            again, t_again = timed(lambda: kb.start(prompt, s, 1, 1000))
            _, dt8 = timed(lambda: [again.next_frames(8) for _ in range(25)])
            res[f"kernel_ms_per_frame_group8{tag}"] = round(1000 * dt8 / 200, 4)
            res[f"start_ms_first_capture{tag}"] = round(1000 * t_first, 1)
            res[f"start_ms_cached_graph{tag}"] = round(1000 * t_again, 1)
            res[f"kernel_graph_replay_ms{tag}"] = round(replay_ms(kb.frame_graph(s)), 4)
        # Greedy (argmax instead of top-k draws), PDL as the last setting
        greedy = kb.start(prompt, SamplingParams.greedy(), 0, 1000)
        greedy.next_frames(4)
        _, dt = timed(lambda: greedy.next_frames(200))
        res["kernel_ms_per_frame_greedy_pdl"] = round(1000 * dt / 200, 4)
        best = min(res["kernel_ms_per_frame_group200"], res["kernel_ms_per_frame_group200_pdl"])
        res["speedup_best"] = round(res["torch_ms_per_frame"] / best, 1)
        print(json.dumps(res), flush=True)
        try:
            no_pdl = KernelBackend(model, KernelOptions(pdl=False))
            no_pdl.start(prompt, s, 0, 1000)
            print(json.dumps(kernel_profile(no_pdl, s, size)), flush=True)
            del no_pdl
        except Exception as err:
            print(json.dumps({"profile_error": repr(err)}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["0.6b", "1.7b"])
