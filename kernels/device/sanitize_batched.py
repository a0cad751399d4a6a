"""A short batched decode (tiny random model), for compute-sanitizer memcheck/racecheck.

Usage: python kernels/device/sanitize_batched.py [SIZE ...] [float32|bfloat16 ...] [eager|graphs]

Three streams join a 4-slot BatchedDecoder at steps 0, 0 and 2 (two admitted in one batched prefill, one
greedy and two sampled), the first leaves after 3 steps and a fourth takes its slot: the kernels see padding
rows, every bucket up to 4 (the CodePredictor's first two positions paired), a reused slot and both the
tensor-core (bf16) and FMA (float32) GEMVs; then the others leave and three lone steps run (lone.py).
Eager by default (the sanitizer sees each launch; graphs replays the captured buckets instead).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_model, text_ids

from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder
from wyoming_qwen3tts.model.prompt import build_prompt
from wyoming_qwen3tts.request import SamplingParams

args = sys.argv[1:]
sizes = [a for a in args if a.startswith("tiny")] or ["tiny", "tiny-0.6b"]
dtypes = [getattr(torch, a) for a in args if a in ("float32", "bfloat16")] or [torch.float32, torch.bfloat16]
graphs = "graphs" in args
for size in sizes:
    for dtype in dtypes:
        model = random_model(size, dtype)
        kb = KernelBackend(model, capacity=64)
        dec = BatchedDecoder(model, kb.ops, kb.weights, slots=4, max_seq=96, max_trailing=32, graphs=graphs)

        def admission(slot: int, n_text: int, speaker: str, sampled: bool, seed: int) -> Admission:
            prompt = build_prompt(model, text_ids(n_text), speaker, "english")
            return Admission(slot, prompt, SamplingParams() if sampled else SamplingParams.greedy(), seed)

        dec.admit_all([admission(0, 8, "ryan", False, 1), admission(1, 5, "vivian", True, 2)])
        for step in range(8):
            if step == 2:
                dec.admit_all([admission(2, 11, "ryan", True, 3)])
            if step == 3:
                dec.release(0)
            if step == 4:
                dec.admit_all([admission(0, 6, "vivian", False, 4)])
            dec.step()
        dec.release(1)
        dec.release(2)
        for _ in range(3):  # slot 0 alone: lone steps (the batch-1 frame's kernels over its slot)
            dec.step()
        assert dec.lone_steps == 3
        torch.cuda.synchronize()
        print(size, dtype, "graphs" if graphs else "eager", dec.history[:3, :4, 0].tolist(), flush=True)
print("sanitize_batched: done")
