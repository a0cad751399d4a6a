"""The GEMVs on int8 weights (q3t.h Q3T_I8: int8 rows, a float32 scale each, model/quant.py's scheme) on a GPU,
then the kernel backends on a model quantized at load against the torch backend on the same model.

Every kernel family: q3t_gemv (split-K kernel up to K = 4096, row kernel above), q3t_gemv_batch (two vectors),
q3t_batched_gemv on its FMA kernel (no scratch) and its tensor-core kernel (scratch, sm_80+), every mode,
with and without the fused RMSNorm and the bias, the real shapes of both model sizes and odd ones.

Bounds (relative, ||got - ref|| / ||ref||): against float64 on the same dequantized weights
(q * scale per row) <= 1e-5 for the FMA kernels, <= 3e-5 for the tensor-core kernel (as for bf16: the
integers are exact in float32 and in bf16, so only the float32 sums round, and on tensor cores x is
bf16 hi + lo, ~16 mantissa bits); against the float32 weights the int8 came from <= 3e-2 where there are
many outputs (the quantization's own error, 0.8-0.9 % on these Gaussian rows: docs/int8.md; a scale
applied to the wrong row would be ~100 %). Bit for bit: run to run; q3t_batched_gemv's rows at every nb
against the same rows at nb = 1 (q3t_gemv_batch's vectors against one-vector q3t_gemv calls: int8 is a case of
test_kernels_gpu.test_gemv_batch_rows_equal_one_vector_calls).
Backends: float32 activations, greedy: the int8 kernel backend's codes equal the torch backend's on the
same quantized model, frame for frame, also through the engine (a batched decoder's int8 streams equal the
same streams alone: a case of test_batched_kernels_gpu.test_batched_decoder_streams_equal_alone).

Run: python3 -m pytest -q -x tests/kernels/test_int8_kernels_gpu.py (Q3T_REQUIRE=1 to fail instead of skip when
the library cannot be built; Q3T_PDL=1 launches with programmatic dependent launch).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gemv_checks import (
    BATCHED_GEMV_SHAPES,
    MODE_SHAPES,
    TC_TOL,
    gemv_reference,  # float64 y (mode) W @ xn, rows of x
    rows_alone_and_batched,
    tc_device,
)
from gpu_models import greedy_parity, load_model
from kernel_ops import assert_close, assert_equal, gen, ops, rel  # noqa: F401 - ops: the kernels' fixture

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import ADD, STORE, SWIGLU, Matrix, Ops
from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.model.quant import quantize_model, quantize_rows

pytestmark = pytest.mark.gpu

DEV = "cuda"
F32_TOL = 1e-5
QUANT_TOL = 3e-2
MODES = (STORE, ADD, SWIGLU)


def _int8(w32: torch.Tensor, offset: int = 0) -> tuple[Matrix, torch.Tensor]:
    """(the int8 Matrix of w32, the float64 matrix it stands for). offset > 0 starts the rows that many
    bytes into their buffer (not 16-byte aligned: the kernels' scalar path)."""
    q, scale = quantize_rows(w32)
    n, k = q.shape
    buf = torch.empty(n * k + offset, dtype=torch.int8, device=DEV)
    data = buf[offset:].view(n, k)
    data.copy_(q)
    return Matrix(data, scale), q.double() * scale.double()[:, None]


def _inputs(n: int, k: int, mode: int, rows: int, seed: int):
    g = gen(seed)
    w32 = torch.randn(n, k, device=DEV, generator=g) * 0.05
    x = torch.randn(rows, k, device=DEV, generator=g) * torch.linspace(0.5, 4.0, rows, device=DEV)[:, None]
    nw = torch.rand(k, device=DEV, generator=g) + 0.5
    bias = torch.randn(n, device=DEV, generator=g) if mode == STORE else None
    n_out = n // 2 if mode == SWIGLU else n
    y0 = torch.randn(rows, n_out, device=DEV, generator=g)  # ADD's residual; the poison STORE must overwrite
    return w32, x, nw, bias, y0


# ------------------------------------------------------------------------------------------ q3t_gemv


@pytest.fixture(params=["mma", "fma"])
def i8_kernel(ops: Ops, request: pytest.FixtureRequest):
    """q3t_gemv's and q3t_gemv_batch's int8 kernels: on int8 tensor cores (gemv_i8_mma.cu, q3t_set_i8_mma(1): where
    the device has them and the operands fit) or the FMA kernels (the default)."""
    ops.set_i8_mma(request.param == "mma")
    try:
        yield request.param
    finally:
        ops.set_i8_mma(False)


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("mode,n,k", MODE_SHAPES)
def test_int8_gemv(ops: Ops, i8_kernel: str, mode: int, with_norm: bool, n: int, k: int, aligned: bool) -> None:
    """q3t_gemv on int8 rows (16-byte loads of 16 weights where K % 16 == 0 and the rows are aligned, the
    scalar path otherwise: odd K, or rows 3 bytes into their buffer; with i8_kernel "mma" the aligned rows of
    K % 64 == 0 on int8 tensor cores) against float64 on the same dequantized weights, run-to-run identical,
    and the split-K kernel (q3t_gemv_batch, one vector) at any K within the same bound."""
    w32, x, nw, bias, y0 = _inputs(n, k, mode, 1, 7000 + n * 7 + k + 3 * mode + int(with_norm))
    w, wd = _int8(w32, offset=0 if aligned else 3)
    norm = nw if with_norm else None
    kw = dict(mode=mode, norm_w=norm, eps=1e-6, bias=bias)

    def run(split_k: bool = False) -> torch.Tensor:
        y = y0.clone()
        if split_k:
            ops.gemv_batch(w, x, y, **kw)
        else:
            ops.gemv(w, x[0], y[0], **kw)
        return y

    y = run()
    assert torch.isfinite(y).all()
    assert torch.equal(y, run()), "not run-to-run identical"
    assert_close(y, gemv_reference(wd, x, norm, bias, y0, mode, 1e-6), F32_TOL, "vs float64, same int8 weights")
    if n >= 64:  # a norm over many outputs (test_kernels_gpu.test_gemv says why)
        assert_close(y, gemv_reference(w32, x, norm, bias, y0, mode, 1e-6), QUANT_TOL, "int8 vs float32 weights")
    assert_close(run(split_k=True), y, F32_TOL, "split-K vs q3t_gemv")
    if k <= 4096:  # q3t_gemv is the split-K kernel there: the same bits
        assert torch.equal(run(split_k=True), y)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n,k", [(130, 128), (12, 64), (1024, 8192), (2048, 6144), (1024, 1024)])
def test_int8_mma_gemv_digits(ops: Ops, mode: int, n: int, k: int) -> None:
    """The int8 tensor-core GEMV (x as four int8 digits of one power-of-two scale) where its digits are
    stretched, against float64 on the same dequantized weights, and the FMA kernels beside it: one input
    element 10^4 times the rest (the scale follows the largest; the rest keep 2^-21 of it), all of x scaled by
    10^-15 and 10^15 without the norm (the power of two moves, the digits do not; with it float32's own sum of
    squares would under- or overflow), x of zeros (y is the bias or the residual),
    and an inf in x (every output NaN, as the FMA kernels' sums are not finite). Shapes: rows not a multiple
    of the warp's 8, one chunk of 64 k, the longest K (chunks past the up-front loads), the Talker's down_proj
    and a square one; one and two vectors."""
    w32, x, nw, bias, y0 = _inputs(n, k, mode, 2, 8100 + n + k + mode)
    w, wd = _int8(w32)

    def run(xin: torch.Tensor, mma: bool, nb: int = 1, norm: torch.Tensor | None = nw) -> torch.Tensor:
        ops.set_i8_mma(mma)
        try:
            y = y0[:nb].clone()
            if nb == 1:
                ops.gemv(w, xin[0], y[0], mode=mode, norm_w=norm, eps=1e-6, bias=bias)
            else:
                ops.gemv_batch(w, xin, y, mode=mode, norm_w=norm, eps=1e-6, bias=bias)
            return y
        finally:
            ops.set_i8_mma(False)

    nbs = (1, 2) if k <= 4096 else (1,)  # q3t_gemv_batch's two vectors: k <= 4096 (its FMA kernels' shared memory)
    spiked = x.clone()
    spiked[:, k // 3] *= 1e4
    for xin, norm in ((spiked, nw), (x * 1e-15, None), (x * 1e15, None)):
        ref = gemv_reference(wd, xin, norm, bias, y0, mode, 1e-6)
        for nb in nbs:
            got = run(xin, True, nb, norm)
            assert torch.isfinite(got).all()
            assert_close(got, ref[:nb], F32_TOL, f"mma nb {nb} vs float64")
            assert_close(got, run(xin, False, nb, norm), F32_TOL, f"mma nb {nb} vs FMA")
        if nbs[-1] == 2:
            assert torch.equal(run(xin, True, 2, norm)[0], run(xin, True, 1, norm)[0]), "a vector's bits depend on nb"
    zeros = torch.zeros_like(x)
    assert_close(run(zeros, True), gemv_reference(wd, zeros, nw, bias, y0, mode, 1e-6)[:1], F32_TOL, "x = 0")
    bad = x.clone()
    bad[0, 5] = float("inf")
    got = run(bad, True, nbs[-1])
    assert torch.isnan(got[0]).all(), "an inf in x must not give finite outputs"
    assert nbs[-1] == 1 or torch.isfinite(got[1]).all(), "the other vector keeps its outputs"
    assert not torch.isfinite(run(bad, False)[0]).all()


def test_int8_gemv_scale_argument(ops: Ops) -> None:
    """w_scale is required with int8 weights and refused with the others (q3t.h); an int8 tensor without
    its scales never reaches the library."""
    q = torch.zeros(4, 64, dtype=torch.int8, device=DEV)
    x, y, scale = torch.zeros(64, device=DEV), torch.zeros(4, device=DEV), torch.ones(4, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    for name, extra in (("q3t_gemv", ()), ("q3t_gemv_batch", (1,))):

        def call(
            dtype: int, w: torch.Tensor, w_scale: torch.Tensor | None, name: str = name, extra: tuple = extra
        ) -> None:
            ops.lib.call(
                name,
                dtype,
                w.data_ptr(),
                None if w_scale is None else w_scale.data_ptr(),
                4,
                64,
                x.data_ptr(),
                *extra,
                None,
                1e-6,
                None,
                y.data_ptr(),
                STORE,
                stream,
            )

        with pytest.raises(library.NativeError, match="need w_scale"):
            call(library.I8, q, None)
        with pytest.raises(library.NativeError, match="w_scale is for int8"):
            call(library.F32, torch.zeros(4, 64, device=DEV), scale)
        call(library.I8, q, scale)
    with pytest.raises(library.NativeError, match="need w_scale"):
        ops.lib.call(
            "q3t_batched_gemv",
            library.I8,
            q.data_ptr(),
            None,
            4,
            64,
            x.data_ptr(),
            1,
            None,
            1e-6,
            None,
            y.data_ptr(),
            STORE,
            None,
            0,
            stream,
        )
    with pytest.raises(ValueError, match="row scales"):
        ops.gemv(q, x, y)


# ------------------------------------------------------------------------------------------ q3t_batched_gemv

# The batched tests' shapes (their K all multiples of 16), then the rest of both model sizes' real
# shapes: the 1.7B gate/up (SwiGLU), its o_proj / codec_head rows, the CodePredictor gate/up, lm_head and
# small_to_mtp_projection (1024 x 2048); (32, 48): K not a multiple of the tensor-core kernel's 64-k chunk.
INT8_BATCHED_SHAPES = [
    *BATCHED_GEMV_SHAPES,
    (12288, 2048),
    (2048, 2048),
    (6144, 1024),
    (2048, 1024),
    (1024, 2048),
    (32, 48),
]
KERNELS = ["fma", "tc"]


def _scratch(ops: Ops, w: Matrix) -> torch.Tensor:
    return torch.zeros(max(ops.batched_gemv_scratch_floats([w]), 1), device=DEV)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("n,k", INT8_BATCHED_SHAPES)
def test_int8_batched_gemv(ops: Ops, kernel: str, mode: int, with_norm: bool, n: int, k: int) -> None:
    """At nb in 1, 2, 3, 5, 8, 16, 17, 40, 64: each row bit for bit its nb = 1 result (and again on a second call),
    within 1e-5 (tensor cores: 3e-5) of float64 on the same dequantized weights and of q3t_gemv, within
    3e-2 of the float32 weights."""
    w32, x, nw, bias, y0 = _inputs(n, k, mode, library.BATCH_MAX, n * 13 + k + 5 * mode + int(with_norm) + 77)
    w, wd = _int8(w32)
    norm = nw if with_norm else None
    scratch = _scratch(ops, w) if kernel == "tc" else None
    tol = TC_TOL if kernel == "tc" and tc_device() else F32_TOL

    def run(rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ops.batched_gemv(w, rows, y, mode=mode, norm_w=norm, eps=1e-6, bias=bias, scratch=scratch)
        return y

    alone = rows_alone_and_batched(run, x, y0)
    ref = gemv_reference(wd, x, norm, bias, y0, mode, 1e-6)
    assert_close(alone, ref, tol, "vs float64, same int8 weights")
    if n >= 64:
        assert_close(alone, gemv_reference(w32, x, norm, bias, y0, mode, 1e-6), QUANT_TOL, "int8 vs float32 weights")
    one = y0.clone()
    for r in range(x.shape[0]):
        ops.gemv(w, x[r], one[r], mode=mode, norm_w=norm, eps=1e-6, bias=bias)
    assert_close(alone, one, tol, "vs q3t_gemv")
    if scratch is not None:  # every call leaves its row-tile counters 0
        assert int(scratch.view(torch.int32)[:4096].count_nonzero()) == 0, "split-K counters not left 0"
    print(f"int8 {n}x{k} {kernel} mode {mode} norm {with_norm}: rel err vs float64 {rel(alone, ref):.2e}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_batched_gemv_rows_never_mix(ops: Ops, kernel: str) -> None:
    """A row of NaN (and one of huge values) in the batch changes no other row's bits."""
    n, k = 1024, 3072
    for mode in MODES:
        w32, x, nw, bias, y0 = _inputs(n, k, mode, 16, 199 + mode)
        w, _ = _int8(w32)
        scratch = _scratch(ops, w) if kernel == "tc" else None
        kw = dict(mode=mode, norm_w=nw, eps=1e-6, bias=bias, scratch=scratch)
        want = y0.clone()
        ops.batched_gemv(w, x, want, **kw)
        bad = x.clone()
        bad[3] = float("nan")
        bad[7] = 3e38
        got = y0.clone()
        ops.batched_gemv(w, bad, got, **kw)
        keep = [r for r in range(16) if r not in (3, 7)]
        assert_equal(got[keep], want[keep], f"mode {mode}: rows next to NaN / huge rows")
        assert got[3].isnan().all()


def test_int8_batched_gemv_tensor_cores_and_limits(ops: Ops) -> None:
    """With scratch on sm_80+ int8 takes the tensor-core kernel (other bits than the FMA kernel, same function);
    the split shapes need scratch; K must be a multiple of 16 (one 16-byte chunk of int8)."""
    z = torch.zeros(2 * 40, device=DEV)
    with pytest.raises(library.NativeError, match="multiple of 16"):
        w40, _ = _int8(torch.randn(4, 40, device=DEV))
        ops.batched_gemv(w40, z.view(2, 40), torch.zeros(2, 4, device=DEV))
    if not tc_device():
        pytest.skip("no tensor cores (sm_80+) on this GPU: the FMA kernel serves every call")
    n, k = 2048, 6144
    w32, x, nw, _, y0 = _inputs(n, k, ADD, 16, 5)
    w, _ = _int8(w32)
    need = ops.batched_gemv_scratch_floats([w])
    assert need > 4096, need  # K = 6144 is split over blocks: counters and partials
    tc, fma = y0.clone(), y0.clone()
    ops.batched_gemv(w, x, tc, mode=ADD, norm_w=nw, eps=1e-6, scratch=_scratch(ops, w))
    ops.batched_gemv(w, x, fma, mode=ADD, norm_w=nw, eps=1e-6)
    assert not torch.equal(tc, fma)
    assert_close(tc, fma, TC_TOL, "tensor cores vs FMA")
    with pytest.raises(library.NativeError, match="needs"):
        ops.batched_gemv(w, x, y0.clone(), scratch=torch.zeros(need - 1, device=DEV))


# ------------------------------------------------------------------------------------------ backends


def _quantized(model):
    report = quantize_model(model)
    assert report.modules > 0
    return model


@pytest.mark.parametrize("i8_mma", [False, True])
@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_int8_kernel_backend_greedy_codes_equal_torch(
    tiny_checkpoint: Path, tiny_checkpoint_06b: Path, ops: Ops, size: str, i8_mma: bool
) -> None:
    """The kernel backend (captured frame graph; the prompt prefilled by the torch Talker through QuantLinear,
    in a captured graph) on a float32 model quantized at load against the torch backend on that same model:
    greedy codes equal for 200 frames (EOS impossible, so all are compared), with (tiny) and without
    (tiny-0.6b) the Talker -> CodePredictor projection; the GEMVs on the FMA kernels and on int8 tensor cores."""
    model = load_model(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b, torch.float32)
    with torch.no_grad():
        model.talker.codec_head.weight[2150].zero_()  # EOS logit 0 (its int8 row too): never the max
    _quantized(model)
    try:
        n = greedy_parity(model, 200, options=KernelOptions(i8_mma=i8_mma))
    finally:
        ops.set_i8_mma(False)  # the backend set the library-wide flag
    print(f"int8 {size} i8_mma {i8_mma} greedy parity: {n} frames equal")
    assert n == 200


def test_int8_engine_kernels_equal_torch(tiny_checkpoint: Path, ops: Ops) -> None:
    """Through the engine (`weights = "int8"`, quantized at load; the kernel backend's prefill graphs
    warmed up and replayed) against the torch engine with the same setting: greedy codes equal."""
    from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest

    def engine(backend: str) -> Engine:
        options = EngineOptions(device="cuda", dtype="float32", backend=backend, weights="int8", max_streams=1)  # type: ignore[arg-type]
        e = Engine.from_pretrained(str(tiny_checkpoint), options)
        assert e.info.backend == backend, e.info.backend_reason
        return e

    kern, ref = engine("kernels"), engine("torch")
    assert kern.backend.weights.codec_head.dtype == torch.int8
    greedy = replace(SamplingParams.greedy(), suppress_eos=True)
    for text in ("The engine speaks this sentence on eight-bit weights.", "A second, shorter one."):
        request = SynthesisRequest(text=text, speaker="ryan", language="english", sampling=greedy)
        want = ref.backend.start(ref.prepare(request), greedy, 0, 60).next_frames(60)
        got = kern.backend.start(kern.prepare(request), greedy, 0, 60).next_frames(60)
        mism = np.argwhere(got != want)
        assert got.shape == want.shape and mism.size == 0, f"first mismatch at frame/code {mism[:1].tolist()}"
