"""The tensor-core batched GEMV at the shapes of a 1.7B step, eager, for ncu and compute-sanitizer.

Usage: python kernels/device/gemv_shapes.py [NB ...]   (default 8 16)

Each shape (Talker qkv and gate_up, CodePredictor qkv, o, gate_up, down, lm_head) runs once to warm, then once
per nb (bf16 weights, then int8) with the mode and norm the step uses; each result is checked against float64
on the same weights (3e-5 relative, the tensor-core bound of tests/kernels/test_batched_kernels_gpu.py). Under ncu,
profile the second launch of each (--launch-skip / --kernel-name k_bgemv_mma).
"""

from __future__ import annotations

import sys

import torch

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import Matrix, Ops
from wyoming_qwen3tts.model.quant import quantize_rows

SHAPES = {  # name: (rows, k, mode, norm)
    "talker.qkv": (4096, 2048, library.GEMV_STORE, True),
    "talker.gate_up": (12288, 2048, library.GEMV_SWIGLU, True),
    "cp.qkv": (4096, 1024, library.GEMV_STORE, True),
    "cp.o": (1024, 2048, library.GEMV_ADD, False),
    "cp.gate_up": (6144, 1024, library.GEMV_SWIGLU, True),
    "cp.down": (1024, 3072, library.GEMV_ADD, False),
    "cp.lm_head": (2048, 1024, library.GEMV_STORE, True),
}


def reference(w: torch.Tensor, x: torch.Tensor, nw: torch.Tensor | None, y0: torch.Tensor, mode: int) -> torch.Tensor:
    xd = x.double()
    if nw is not None:
        xd = nw.double() * (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6))
    r = xd @ w.double().t()
    if mode == library.GEMV_SWIGLU:
        return torch.nn.functional.silu(r[:, 0::2]) * r[:, 1::2]
    return y0.double() + r if mode == library.GEMV_ADD else r


def main() -> None:
    nbs = [int(a) for a in sys.argv[1:]] or [8, 16]
    ops = Ops(library.load(0))
    ops.use_pdl(False)
    g = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for name, (n, k, mode, norm) in SHAPES.items():
        w32 = torch.randn(n, k, device="cuda", generator=g) * 0.05
        q, scale = quantize_rows(w32)
        for label, w, wref in (
            ("bf16", w32.bfloat16(), w32.bfloat16().float()),
            ("int8", Matrix(q, scale), q.float() * scale[:, None]),
        ):
            scratch = torch.zeros(max(ops.batched_gemv_scratch_floats([w]), 1), device="cuda")
            nw = torch.rand(k, device="cuda", generator=g) + 0.5 if norm else None
            x = torch.randn(16, k, device="cuda", generator=g)
            n_out = n // 2 if mode == library.GEMV_SWIGLU else n
            y0 = torch.randn(16, n_out, device="cuda", generator=g)
            for nb in [nbs[0], *nbs]:  # the first launch warms
                y = y0[:nb].clone()
                ops.batched_gemv(w, x[:nb].contiguous(), y, mode=mode, norm_w=nw, eps=1e-6, scratch=scratch)
                ref = reference(wref, x[:nb], nw, y0[:nb], mode)
                err = float((y.double() - ref).norm() / ref.norm())
                worst = max(worst, err)
                assert err < 3e-5, f"{name} {label} nb={nb}: relative error {err:.2e}"
            torch.cuda.synchronize()
            print(f"{name} {label} ({n}x{k}): nb {nbs} ok")
    print(f"worst relative error against float64: {worst:.2e}")


if __name__ == "__main__":
    main()
