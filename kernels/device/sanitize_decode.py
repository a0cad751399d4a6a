"""A short decode on the kernel backend (tiny random model), for compute-sanitizer memcheck/racecheck.

Usage: python kernels/device/sanitize_decode.py [SIZE ...] [float32|bfloat16 ...] [greedy|sampled ...]
(default: all of each; racecheck is slow, so a subset helps)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_model, text_ids

from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
from wyoming_qwen3tts.model.prompt import build_prompt
from wyoming_qwen3tts.request import SamplingParams

args = sys.argv[1:]
sizes = [a for a in args if a.startswith("tiny")] or ["tiny", "tiny-0.6b"]
dtypes = [getattr(torch, a) for a in args if a in ("float32", "bfloat16")] or [torch.float32, torch.bfloat16]
samplings = [SamplingParams.greedy() if a == "greedy" else SamplingParams() for a in args if a in ("greedy", "sampled")]
samplings = samplings or [SamplingParams.greedy(), SamplingParams()]
for size in sizes:
    for dtype in dtypes:
        model = random_model(size, dtype)
        prompt = build_prompt(model, text_ids(8), "ryan", "english")
        kb = KernelBackend(model, capacity=64)
        for sampling in samplings:
            codes = kb.start(prompt, sampling, 7, 4).next_frames(4)
            print(size, dtype, sampling.do_sample, codes[:, :4].tolist(), flush=True)
torch.cuda.synchronize()
print("sanitize_decode: done")
