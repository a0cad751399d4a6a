"""The batched Talker attention (q3t_batched_rope_attention_split) at the models' shapes, for compute-sanitizer
memcheck and racecheck: 16 rows at positions 0..1,000 (one tile, many tiles, many chunks merged), one padding
row, bf16 and float32 caches, 1, 4 and 32 chunks a head, KV groups of 2 q heads (the models') and of 1 and 4.
Each call's output is checked finite and the merge counters back at 0.

Usage: python kernels/device/sanitize_attention.py
"""

from __future__ import annotations

import torch

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import Ops
from wyoming_qwen3tts.model.layers import rope_tables


def main() -> None:
    ops = Ops(library.load(0))
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    max_seq, nb = 1024, 16
    pos = torch.linspace(0, 1000, nb).round().to(torch.int32).cuda()
    slot = torch.arange(nb, dtype=torch.int32, device="cuda").flip(0)
    slot[3] = -1  # a padding row
    calls = 0
    for hq, hkv, d in ((16, 8, 128), (16, 16, 128), (16, 4, 64)):
        cos, sin = (t.contiguous() for t in rope_tables(torch.arange(max_seq, device="cuda"), d, 1e6, torch.float32))
        for dtype in (torch.bfloat16, torch.float32):
            cache = torch.randn(nb, 2, max_seq, hkv, d, device="cuda", generator=g).to(dtype)
            qkv = torch.randn(nb, (hq + 2 * hkv) * d, device="cuda", generator=g)
            qn = torch.rand(d, device="cuda", generator=g) + 0.5
            kn = torch.rand(d, device="cuda", generator=g) + 0.5
            for splits in (1, 4, 32):
                per_row = hq * splits * (d + 2) + hq
                scratch = torch.zeros(nb * per_row, device="cuda")
                out = torch.zeros(nb, hq * d, device="cuda")
                ops.batched_rope_attention_split(
                    qkv,
                    qn,
                    kn,
                    cos,
                    sin,
                    cache[0, 0],
                    cache[0, 1],
                    out,
                    slot=slot,
                    pos=pos,
                    slot_rows=2 * max_seq,
                    eps=1e-6,
                    scale=d**-0.5,
                    splits=splits,
                    scratch=scratch,
                )
                torch.cuda.synchronize()
                rows = [r for r in range(nb) if r != 3]
                assert bool(out[rows].isfinite().all()), (hq, hkv, d, dtype, splits)
                counters = scratch.view(nb, per_row)[:, hq * splits * (d + 2) :]
                assert not counters.any(), "merge counters not back to 0"
                calls += 1
    print(f"{calls} calls, outputs finite, counters 0")


if __name__ == "__main__":
    main()
