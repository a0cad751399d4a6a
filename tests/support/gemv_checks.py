"""The GEMV shapes the kernel tests run, and the checks of a GEMV's result: the float64 reference of the batched
GEMV (rows of x) and the row-independence check (each row bit for bit its result alone)."""

from __future__ import annotations

import torch
from kernel_ops import assert_equal

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import ADD, STORE, SWIGLU

# Every GEMV shape of the decode loop (rows, K), both model sizes, then odd ones.
GEMV_SHAPES = [
    # 1.7B Talker: qkv, o_proj, gate/up (interleaved, SwiGLU), down_proj, codec_head
    (4096, 2048),
    (2048, 2048),
    (12288, 2048),
    (2048, 6144),
    (3072, 2048),
    # CodePredictor (both sizes) and the 0.6B Talker: qkv, o_proj / small_to_mtp_projection, gate/up,
    # down_proj, lm_head, 0.6B codec_head
    (4096, 1024),
    (1024, 2048),
    (6144, 1024),
    (1024, 3072),
    (2048, 1024),
    (3072, 1024),
    # odd K (scalar path for bf16 and f32), K = 4 mod 8 (vector path for f32 only), K = 1, long odd
    # K, the largest K, odd row counts, fewer rows than a block holds
    (38, 333),
    (37, 333),
    (64, 100),
    (6, 1),
    (10, 4097),
    (2, 8192),
    (130, 16),
    (1, 64),
]
# Every mode at every shape, but SwiGLU only where the rows come in gate/up pairs.
MODE_SHAPES = [(mode, n, k) for mode in (STORE, ADD, SWIGLU) for n, k in GEMV_SHAPES if not (mode == SWIGLU and n % 2)]

# (rows, K): the 1.7B Talker's qkv and down_proj (K = 6144: several K tiles at every nb), a
# CodePredictor down_proj (few rows: the grid rule halves the rows per warp), the 0.6B codec_head,
# then small and odd ones (130 rows: a partial block; K = 16 fewer chunks than lanes).
BATCHED_GEMV_SHAPES = [(4096, 2048), (2048, 6144), (1024, 3072), (3072, 1024), (64, 96), (130, 16)]
NBS = (1, 2, 3, 5, 8, 16, 17, 40, 64)  # the batches (rows at once) rows_alone_and_batched runs

# The tensor-core batched GEMV keeps x as bf16 hi + lo (~16 mantissa bits), so its bound against float64 on the
# same weights is 3e-5, not float32's 1e-5.
TC_TOL = 3e-5


def tc_device() -> bool:
    """The tensor-core kernels run here (sm_80+)."""
    return torch.cuda.get_device_capability()[0] >= 8


def gemv_reference(
    w: torch.Tensor,
    x: torch.Tensor,
    nw: torch.Tensor | None,
    bias: torch.Tensor | None,
    y0: torch.Tensor,
    mode: int,
    eps: float,
) -> torch.Tensor:
    xd = x.double()
    if nw is not None:
        xd = nw.double() * (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps))
    r = xd @ w.double().t()
    if mode == library.GEMV_SWIGLU:
        return torch.nn.functional.silu(r[:, 0::2]) * r[:, 1::2]
    if mode == library.GEMV_ADD:
        return y0.double() + r
    return r + bias.double() if bias is not None else r


def rows_alone_and_batched(run, x: torch.Tensor, y0: torch.Tensor) -> torch.Tensor:
    """run(rows, y) for each row of x alone (returned), then at every nb of NBS up to x's rows and again at all
    of them: each row bit for bit its nb = 1 result (row independence) and finite."""
    rows = x.shape[0]
    alone = torch.stack([run(x[r : r + 1], y0[r : r + 1].clone())[0] for r in range(rows)])
    for nb in (nb for nb in NBS if nb <= rows):
        got = run(x[:nb].contiguous(), y0[:nb].clone())
        assert torch.isfinite(got).all(), f"nb={nb}: not finite"
        assert_equal(got, alone[:nb], f"nb={nb} rows vs the same rows at nb=1")
    assert_equal(run(x.contiguous(), y0.clone()), alone, f"a second call at nb={rows}")
    return alone
