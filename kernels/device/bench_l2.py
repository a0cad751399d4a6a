"""Per-frame decode time against the L2 prefetch distance of the frame's weight stream
(KernelBackend(l2_ahead_mb=...), Q3T_L2_AHEAD_MB; 0 = no prefetch), same model, same prompt,
graph replay, PDL on, default sampling. Random full-size bf16 models.

Prints one JSON line per size: ms per frame for each distance (MB), and the default's distance.
Usage: python kernels/device/bench_l2.py [0.6b 1.7b]   (L2_AHEADS="0 8 16 25 36" picks the distances)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cp import per_frame_ms  # noqa: E402
from common import random_model, text_ids  # noqa: E402

from wyoming_qwen3tts.backends.kernel_backend import KernelBackend, default_l2_ahead_mb  # noqa: E402
from wyoming_qwen3tts.model.prompt import build_prompt  # noqa: E402
from wyoming_qwen3tts.request import SamplingParams  # noqa: E402


def main(sizes: list[str]) -> None:
    aheads = [float(a) for a in os.environ.get("L2_AHEADS", "0 8 16 25 36").split()]
    for size in sizes:
        model = random_model(size, torch.bfloat16)  # EOS row zeroed: every run decodes all its frames
        prompt = build_prompt(model, text_ids(20), "ryan", "english")
        res: dict[str, object] = {"size": size, "gpu": torch.cuda.get_device_name(),
                                  "default_mb": default_l2_ahead_mb(model.device), "ms_per_frame": {}}  # fmt: skip
        # Two passes in opposite orders: clock drift shows as a spread between them.
        for order in (aheads, aheads[::-1]):
            for mb in order:
                kb = KernelBackend(model, pdl=True, l2_ahead_mb=mb)
                res["ms_per_frame"].setdefault(str(mb), []).append(round(per_frame_ms(kb, prompt, SamplingParams()), 4))
                del kb
                torch.cuda.empty_cache()
        print(json.dumps(res), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["0.6b", "1.7b"])
