"""Per-frame decode time with the persistent CodePredictor kernel (Q3T_CP=fused) vs one launch per
op (Q3T_CP=layers), same model, same prompt, graph replay, PDL on. Random full-size bf16 models.

Prints one JSON line per size. Usage: python kernels/device/bench_cp.py [0.6b 1.7b]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_model, text_ids, timed  # noqa: E402

from wyoming_qwen3tts.backends.kernel_backend import KernelBackend  # noqa: E402
from wyoming_qwen3tts.model.prompt import build_prompt  # noqa: E402
from wyoming_qwen3tts.request import SamplingParams  # noqa: E402


def per_frame_ms(kb: KernelBackend, prompt, sampling: SamplingParams, frames: int = 200) -> float:  # noqa: ANN001
    sess = kb.start(prompt, sampling, 0, frames + 8)
    sess.next_frames(8)  # capture + warm-up
    got, seconds = timed(lambda: sess.next_frames(frames))
    assert len(got) == frames, len(got)
    return 1000 * seconds / frames


def cp_kernel_us(kb: KernelBackend) -> float | None:
    """GPU time of one q3t_code_predictor launch (median of 20 graph replays' kernel records)."""
    from torch.profiler import ProfilerActivity, profile

    g = kb._graph
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events() if "code_predictor" in e.name]
    return round(sorted(times)[len(times) // 2], 1) if times else None


def main(sizes: list[str]) -> None:
    for size in sizes:
        model = random_model(size, torch.bfloat16)  # EOS row zeroed: every run decodes all its frames
        prompt = build_prompt(model, text_ids(20), "ryan", "english")
        res: dict[str, object] = {"size": size, "gpu": torch.cuda.get_device_name()}
        for fused in (False, True):
            kb = KernelBackend(model, cp_fused=fused, pdl=True)
            tag = "fused" if fused else "layers"
            res[f"{tag}_sampled_ms"] = round(per_frame_ms(kb, prompt, SamplingParams()), 4)
            res[f"{tag}_greedy_ms"] = round(per_frame_ms(kb, prompt, SamplingParams.greedy()), 4)
            if fused:
                res["fused_cp_kernel_us"] = cp_kernel_us(kb)
            del kb
            torch.cuda.empty_cache()
        res["fps_layers"] = round(1000 / res["layers_sampled_ms"], 1)
        res["fps_fused"] = round(1000 / res["fused_sampled_ms"], 1)
        res["speedup"] = round(res["layers_sampled_ms"] / res["fused_sampled_ms"], 3)
        print(json.dumps(res), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["0.6b", "1.7b"])
