"""A batched step's matrix products on the vendor BLAS from 32 streams up (torch.mm: cuBLAS, or hipBLASLt / rocBLAS).

Up to 16 streams the batched GEMV (gemv_batched*.cu) reads each weight once for all of them and sums every row in
an order that does not depend on the others. Past 16 it runs 16 vectors a launch, so at 64 streams it reads every
matrix four times and its step costs ~3.5x the 16-stream one (docs/performance.md). A GEMM on tensor cores reads
each weight once for all rows; what a GEMV fuses becomes glue around it: the float32 rows (RMS-normalised where the
GEMV fuses the norm) made bf16 inputs (norm.cu), and the SwiGLU (gemm_glue.cu); the residual add and the bias ride on the
GEMM's own C operand (addmm with beta 1). The library picks its kernel by the row count, so a stream's sums, and at
a tie its codes, then depend on how many streams step beside it: the decoder uses this only where batch invariance
is off (`batch_invariant = false`, the default), and only for bf16 weights (int8 stays on the GEMV).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import library
from .ops import Matrix, Ops


def blas_supported(device: torch.device) -> bool:
    """Whether torch multiplies bf16 into float32 on this device (torch.mm's out_dtype, torch >= 2.8)."""
    try:
        a = torch.ones(2, 8, dtype=torch.bfloat16, device=device)
        out = torch.empty(2, 2, dtype=torch.float32, device=device)
        torch.mm(a, a.t(), out_dtype=torch.float32, out=out)
        torch.addmm(out, a, a.t(), out_dtype=torch.float32, out=out)
        return bool(out[0, 0].item() == 16.0)
    except (TypeError, RuntimeError):
        return False


class BlasProducts:
    """The GEMV's contract (ops.batched_gemv: y = W x with a fused norm, bias, residual add or SwiGLU) for rows of
    float32 vectors, done as glue + torch GEMM on the caller's stream (it must be torch's current stream, as in
    the decoder's steps and captures). Work buffers for up to `rows` rows of any of `matrices`."""

    def __init__(self, ops: Ops, matrices: list[Matrix], rows: int, device: torch.device) -> None:
        self.ops = ops
        max_n = max(m.data.shape[0] for m in matrices)
        # A product's bf16 input rows, or a SwiGLU's output staged there for the down projection (N / 2 wide).
        widest = max(max(m.data.shape[1] for m in matrices), max_n // 2)
        self.inputs = torch.zeros(rows * widest, dtype=torch.bfloat16, device=device)
        self.gate_up = torch.zeros(rows * max_n, dtype=torch.float32, device=device)
        # The float32 rows (data pointer, shape) whose bf16 copy `inputs` already holds: the SwiGLU writes the
        # down projection's input there itself.
        self.staged: tuple[int, tuple[int, ...]] | None = None

    @staticmethod
    def takes(w: Matrix) -> bool:
        return w.scale is None and w.data.dtype == torch.bfloat16

    def __call__(
        self,
        w: Matrix,
        x: Tensor,
        y: Tensor,
        stream: int,
        *,
        mode: int = library.GEMV_STORE,
        norm_w: Tensor | None = None,
        eps: float = 0.0,
        bias: Tensor | None = None,
    ) -> None:
        if torch.cuda.current_stream(x.device).cuda_stream != stream:
            raise RuntimeError("BlasProducts runs on torch's current stream; the step launched on another")
        rows, k = x.shape
        n = w.data.shape[0]
        xb = self.inputs[: rows * k].view(rows, k)
        if norm_w is not None or self.staged != (x.data_ptr(), tuple(x.shape)):
            self.ops.batched_rows_bf16(x, xb, norm_w=norm_w, eps=eps, stream=stream)
        self.staged = None
        wt = w.data.t()  # [K, N] column-major: the BLAS reads W as stored
        if mode == library.GEMV_ADD:
            torch.addmm(y, xb, wt, out_dtype=torch.float32, out=y)
        elif mode == library.GEMV_SWIGLU:
            gate_up = self.gate_up[: rows * n].view(rows, n)
            torch.mm(xb, wt, out_dtype=torch.float32, out=gate_up)
            staged = self.inputs[: rows * (n // 2)].view(rows, n // 2)
            self.ops.batched_swiglu(gate_up, y, staged, stream=stream)
            self.staged = (y.data_ptr(), tuple(y.shape))
        elif bias is not None:
            torch.addmm(bias, xb, wt, out_dtype=torch.float32, out=y)
        else:
            torch.mm(xb, wt, out_dtype=torch.float32, out=y)

    def forget(self) -> None:
        """Something other than this wrote rows since: the next product converts its input afresh."""
        self.staged = None
