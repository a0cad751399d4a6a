"""The batched step's matrix products on the vendor BLAS (backends/kernels/gemm.py) and their glue kernels
(kernels/src/norm.cu's rows to bf16, gemm_glue.cu's SwiGLU), against torch on fresh random inputs; and a decoder whose 32- and 64-stream steps
multiply there, against one that stays on the batched GEMV.

Bounds: the glue's bf16 outputs are the float32 value rounded to nearest even, so within bf16's unit roundoff (2^-8
relative, plus float32's own error) of torch's float64 value; its float32 SwiGLU within 1e-5. A product on the BLAS multiplies the bf16
rounded inputs with float32 sums, so each output is within 1e-4 of the float64 product of the same bf16 inputs
(relative to the sum of |w x|), plus the float32 operand it adds to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_models import load_model_without_eos, text_ids
from kernel_ops import DEV, gen, ops  # noqa: F401 - the kernels' fixture (skips without a build)

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.gemm import BlasProducts, blas_supported
from wyoming_qwen3tts.backends.kernels.ops import Matrix, Ops

pytestmark = pytest.mark.gpu

BF16_ROUNDOFF = 2.0**-8  # bf16's unit roundoff: 8 significand bits, round to nearest


def _rms_ref(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.double()
    if w is None:
        return x
    return w.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("rows, n", [(1, 2048), (33, 1024), (128, 6144), (64, 8192), (3, 1001), (2, 9000)])
@pytest.mark.parametrize("norm", [False, True])
def test_rows_bf16_round_each_value_once(ops: Ops, rows: int, n: int, norm: bool) -> None:
    """Rows of a multiple of 4 up to 8,192 floats take the float4 kernel, the others (1001, 9000) the plain one."""
    g = gen(rows + n + norm)
    x = torch.randn(rows, n, generator=g, device=DEV) * 3
    w = torch.randn(n, generator=g, device=DEV) if norm else None
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    ops.batched_rows_bf16(x, out, norm_w=w, eps=1e-6)
    ref = _rms_ref(x, w, 1e-6)
    err = (out.double() - ref).abs()
    assert torch.all(err <= (BF16_ROUNDOFF + 1e-5) * ref.abs() + 1e-30), float((err / ref.abs()).max())


@pytest.mark.parametrize("rows, n", [(1, 3072), (64, 6144), (128, 1024), (5, 1001)])
def test_swiglu_gives_float32_and_its_bf16(ops: Ops, rows: int, n: int) -> None:
    """Even widths take two outputs a thread (one float4 of gate/up), an odd one (1001) one at a time."""
    g = gen(100 + rows + n)
    gate_up = torch.randn(rows, 2 * n, generator=g, device=DEV) * 4
    out = torch.zeros(rows, n, device=DEV)
    out_b = torch.zeros(rows, n, dtype=torch.bfloat16, device=DEV)
    ops.batched_swiglu(gate_up, out, out_b)
    gu = gate_up.double().view(rows, n, 2)
    ref = torch.nn.functional.silu(gu[..., 0]) * gu[..., 1]
    assert torch.all((out.double() - ref).abs() <= 1e-5 * ref.abs() + 1e-12)
    assert torch.all((out_b.double() - out.double()).abs() <= BF16_ROUNDOFF * out.double().abs())


def test_bad_arguments_are_refused(ops: Ops) -> None:
    x = torch.zeros(129, 8, device=DEV)
    with pytest.raises(library.NativeError, match="q3t_batched_rows_bf16: bad arguments"):
        ops.batched_rows_bf16(x, torch.zeros(129, 8, dtype=torch.bfloat16, device=DEV))


@pytest.mark.parametrize("rows", [2, 32, 64])
@pytest.mark.parametrize(
    "mode, norm, bias",
    [
        (library.GEMV_STORE, False, False),
        (library.GEMV_STORE, True, False),
        (library.GEMV_STORE, False, True),
        (library.GEMV_ADD, False, False),
        (library.GEMV_SWIGLU, True, False),
    ],
)
def test_products_keep_the_gemv_contract(ops: Ops, rows: int, mode: int, norm: bool, bias: bool) -> None:
    """Each mode of ops.batched_gemv (fused norm, bias, residual add, SwiGLU) on the BLAS, against float64 on the
    same bf16-rounded inputs; the SwiGLU's down projection then takes the staged bf16 rows as they are."""
    if not blas_supported(torch.device(DEV)):
        pytest.skip("this torch has no bf16 -> float32 torch.mm (out_dtype)")
    g = gen(rows * 7 + mode)
    n, k = (6144, 2048) if mode == library.GEMV_SWIGLU else (3072, 1024)
    w = Matrix((torch.randn(n, k, generator=g, device=DEV) * k**-0.5).to(torch.bfloat16))
    x = torch.randn(rows, k, generator=g, device=DEV)
    norm_w = torch.randn(k, generator=g, device=DEV) if norm else None
    b = torch.randn(n, generator=g, device=DEV) if bias else None
    n_out = n // 2 if mode == library.GEMV_SWIGLU else n
    y = torch.randn(rows, n_out, generator=g, device=DEV)
    y_old = y.clone()
    blas = BlasProducts(ops, [w], 64, torch.device(DEV))
    stream = torch.cuda.current_stream().cuda_stream
    blas(w, x, y, stream, mode=mode, norm_w=norm_w, eps=1e-6, bias=b)
    xb = _rms_ref(x, norm_w, 1e-6).to(torch.bfloat16).double()  # the one rounding the inputs get
    wd = w.data.double()
    prod = xb @ wd.t()
    scale = xb.abs() @ wd.abs().t()
    if mode == library.GEMV_SWIGLU:
        g_, u = prod[:, 0::2], prod[:, 1::2]
        ref = torch.nn.functional.silu(g_) * u
        # d(silu(g) u) = silu'(g) u dg + silu(g) du, |silu'| <= 1.1
        bound = 1e-4 * (1.1 * u.abs() * scale[:, 0::2] + torch.nn.functional.silu(g_).abs() * scale[:, 1::2])
    else:
        ref = prod + (y_old.double() if mode == library.GEMV_ADD else 0) + (b.double() if b is not None else 0)
        bound = 1e-4 * scale
    err = (y.double() - ref).abs()
    assert torch.all(err <= bound + 1e-6 * ref.abs() + 1e-7), float((err - bound).max())
    if mode == library.GEMV_SWIGLU:  # the down projection reads the SwiGLU's staged bf16 rows, not new ones
        down = Matrix((torch.randn(k, n_out, generator=g, device=DEV) * n_out**-0.5).to(torch.bfloat16))
        blas2 = BlasProducts(ops, [w, down], 64, torch.device(DEV))
        blas2(w, x, y, stream, mode=mode, norm_w=norm_w, eps=1e-6)
        assert blas2.staged == (y.data_ptr(), tuple(y.shape))
        out = torch.zeros(rows, k, device=DEV)
        blas2(down, y, out, stream)
        assert blas2.staged is None
        ref_down = y.to(torch.bfloat16).double() @ down.data.double().t()
        assert torch.all(
            (out.double() - ref_down).abs()
            <= 1e-4 * (y.to(torch.bfloat16).double().abs() @ down.data.double().abs().t()) + 1e-7
        )


def test_a_product_on_another_stream_is_refused(ops: Ops) -> None:
    if not blas_supported(torch.device(DEV)):
        pytest.skip("this torch has no bf16 -> float32 torch.mm (out_dtype)")
    w = Matrix(torch.zeros(64, 32, dtype=torch.bfloat16, device=DEV))
    blas = BlasProducts(ops, [w], 4, torch.device(DEV))
    side = torch.cuda.Stream()
    with pytest.raises(RuntimeError, match="current stream"):
        blas(w, torch.zeros(4, 32, device=DEV), torch.zeros(4, 64, device=DEV), side.cuda_stream)


@pytest.mark.parametrize("streams", [40, 64])
def test_a_decoder_on_the_blas_steps_as_the_gemv_one(tiny_checkpoint: Path, ops: Ops, streams: int) -> None:
    """A bf16 decoder whose steps of 32+ streams multiply on the BLAS (captured graphs) against one on the batched
    GEMV (eager), the same streams admitted together: the first step's code-0 logits agree to bf16 rounding, most
    rows draw the same 16 greedy codes (a tie within rounding may flip one), and those rows' next Talker state
    agrees too; a wiring slip (a mode, a norm, the staged SwiGLU rows) would be off by the values' own size."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder
    from wyoming_qwen3tts.backends.kernels.options import KernelOptions
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.request import SamplingParams

    model = load_model_without_eos(tiny_checkpoint, torch.bfloat16)
    if not blas_supported(model.device):
        pytest.skip("this torch has no bf16 -> float32 torch.mm (out_dtype)")
    kb = KernelBackend(model, KernelOptions(graph_prefill=False))
    greedy = SamplingParams.greedy()
    prompts = [
        build_prompt(model, text_ids(3 + i, 12 + i % 9), ("ryan", "vivian")[i % 2], "english") for i in range(streams)
    ]
    decoders = []
    for blas_rows, graphs in ((32, True), (0, False)):
        dec = BatchedDecoder(
            model, kb.ops, kb.weights, slots=64, max_seq=96, max_trailing=64, graphs=graphs, blas_rows=blas_rows
        )
        assert (dec.blas is not None) == bool(blas_rows)
        dec.admit_all([Admission(i, prompts[i], greedy, 0) for i in range(streams)])
        decoders.append(dec)
    blas_dec, gemv_dec = decoders
    hn0 = [d.hn[:64].clone() for d in decoders]
    for d in decoders:
        d.step()
    torch.cuda.synchronize()
    assert blas_dec.on_blas and not gemv_dec.on_blas
    assert float((hn0[0] - hn0[1]).norm() / hn0[1].norm()) < 1e-6  # the same prefill: the step is all that differs
    la, lb = blas_dec.logits[:streams].double(), gemv_dec.logits[:streams].double()
    assert float((la - lb).norm() / lb.norm()) < 1e-2
    same = torch.all(blas_dec.cur[:streams] == gemv_dec.cur[:streams], dim=1).cpu().numpy()
    assert same.mean() >= 0.75, f"{int(same.sum())} of {streams} rows drew the same codes"
    rows = torch.from_numpy(np.flatnonzero(same)).to(model.device)
    ha, hb = blas_dec.hn[rows].double(), gemv_dec.hn[rows].double()
    assert float((ha - hb).norm() / hb.norm()) < 3e-2
