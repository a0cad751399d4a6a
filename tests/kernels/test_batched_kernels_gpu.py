"""The batched-step kernels (q3t.h, last section) on fresh random inputs: each against a torch float64
reference or the one-stream kernel it batches, and each row bit for bit its own result at nb = 1
(row independence: a stream's numbers never depend on its batch-mates or on nb). Then the batched
decoder (backends/kernels/batched.py) on a tiny float32 model against the one-stream kernel backend.
GPU only.

Bounds: batched GEMV against float64 on the same weights <= 1e-5 relative (float32 accumulation)
for float32 and bf16 weights (the tensor-core kernel, x as bf16 hi + lo: <= 3e-5), bf16 against
float32 weights <= 1e-2, against the one-vector q3t_gemv <= 1e-5 (3e-5) (the kernels sum in
different fixed orders; where they happen to agree they are equal). The Talker's batched attention (a KV
group's heads in one block) against float64 over its cache <= 1e-5, against the one-stream kernel <= 1e-5,
its appended cache rows equal to the one-stream kernel's bit for bit. Every other batched kernel runs the
one-stream kernel's block code per row: equal to it bit for bit.
Run: python3 -m pytest -q -x tests/kernels/test_batched_kernels_gpu.py (seconds on an H200).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from attention_check import check_attention_step
from gemv_checks import BATCHED_GEMV_SHAPES, TC_TOL, gemv_reference, rows_alone_and_batched, tc_device
from gpu_models import load_model_without_eos, text_ids
from kernel_ops import assert_close, assert_equal, gen, ops, rel  # noqa: F401 - ops: the kernels' fixture

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import Ops

pytestmark = pytest.mark.gpu

DEV = "cuda"
F32_TOL = 1e-5
BF16_TOL = 1e-2
ROWS = library.BATCH_MAX  # the GEMV tests' vectors: past 16 the batched GEMV takes them 16 a launch


# ------------------------------------------------------------------------------------------ GEMV


def _gemv_inputs(n: int, k: int, dtype: torch.dtype, mode: int, seed: int):
    g = gen(seed)
    w32 = torch.randn(n, k, device=DEV, generator=g) * 0.05
    w = w32.to(dtype)
    x = torch.randn(ROWS, k, device=DEV, generator=g) * torch.linspace(0.5, 4.0, ROWS, device=DEV)[:, None]
    nw = torch.rand(k, device=DEV, generator=g) + 0.5
    bias = torch.randn(n, device=DEV, generator=g) if mode == library.GEMV_STORE else None
    n_out = n // 2 if mode == library.GEMV_SWIGLU else n
    y0 = torch.randn(ROWS, n_out, device=DEV, generator=g)  # ADD's residual; the poison STORE must overwrite
    return w, w32, x, nw, bias, y0


def _scratch(ops: Ops, w: torch.Tensor) -> torch.Tensor:
    """A zeroed scratch for w's shape: with it, bf16 weights take the tensor-core kernel (sm_80+)."""
    return torch.zeros(max(ops.batched_gemv_scratch_floats([w]), 1), device=DEV)


def _batched_gemv(
    ops: Ops,
    w: torch.Tensor,
    x: torch.Tensor,
    nw: torch.Tensor | None,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    mode: int,
    eps: float = 1e-6,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    ops.batched_gemv(w, x, y, mode=mode, norm_w=nw, eps=eps, bias=bias, scratch=scratch)
    return y


# The two kernels: "fma" (no scratch; every device, float32 and bf16) and "tc" (tensor cores: bf16 with
# a scratch on sm_80+). The tensor-core kernel keeps x as bf16 hi + lo (~16 mantissa bits), so its
# bound against float64 on the same weights is TC_TOL (3e-5), not float32's 1e-5.
KERNELS = [(torch.float32, "fma"), (torch.bfloat16, "fma"), (torch.bfloat16, "tc")]


@pytest.mark.parametrize("dtype,kernel", KERNELS)
@pytest.mark.parametrize("mode", [library.GEMV_STORE, library.GEMV_ADD, library.GEMV_SWIGLU])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("n,k", BATCHED_GEMV_SHAPES)
def test_batched_gemv(ops: Ops, dtype: torch.dtype, kernel: str, mode: int, with_norm: bool, n: int, k: int) -> None:
    """At nb in 1, 2, 3, 5, 8, 16, 17, 40, 64: every row within 1e-5 (tensor cores: 3e-5) of float64 on the same
    weights (bf16: 1e-2 of float32 weights), each row bit for bit its nb = 1 result, the same bits
    again on a second call, and within the same bound of q3t_gemv."""
    w, w32, x, nw, bias, y0 = _gemv_inputs(n, k, dtype, mode, n * 13 + k + 5 * mode + int(with_norm))
    norm = nw if with_norm else None
    scratch = _scratch(ops, w) if kernel == "tc" else None
    tol = TC_TOL if kernel == "tc" and tc_device() else F32_TOL

    def run(rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _batched_gemv(ops, w, rows, norm, bias, y, mode, scratch=scratch)

    alone = rows_alone_and_batched(run, x, y0)
    ref = gemv_reference(w.float(), x, norm, bias, y0, mode, 1e-6)
    assert_close(alone, ref, tol, "vs float64, same weights")
    if dtype == torch.bfloat16 and n >= 64:  # a norm over many outputs (see test_kernels_gpu.test_gemv_v2)
        assert_close(alone, gemv_reference(w32, x, norm, bias, y0, mode, 1e-6), BF16_TOL, "bf16 vs float32 weights")
    one = y0.clone()
    for r in range(x.shape[0]):
        ops.gemv(w, x[r], one[r], mode=mode, norm_w=norm, eps=1e-6, bias=bias)
    assert_close(alone, one, tol, "vs q3t_gemv")
    if scratch is not None:  # every call leaves its row-tile counters 0 (the next shape relies on it)
        assert int(scratch.view(torch.int32)[:4096].count_nonzero()) == 0, "split-K counters not left 0"
    print(
        f"{n}x{k} {dtype} {kernel} mode {mode} norm {with_norm}: rel err vs float64 {rel(alone, ref):.2e}, "
        f"bit-equal to q3t_gemv: {torch.equal(alone, one)}"
    )


@pytest.mark.parametrize("dtype,kernel", KERNELS)
def test_batched_gemv_rows_never_mix(ops: Ops, dtype: torch.dtype, kernel: str) -> None:
    """A row of NaN (and one of huge values) in the batch changes no other row's bits, in its launch's 16
    vectors and in the other launches'."""
    n, k = 1024, 3072
    for mode in (library.GEMV_STORE, library.GEMV_ADD, library.GEMV_SWIGLU):
        w, _, x, nw, bias, y0 = _gemv_inputs(n, k, dtype, mode, 99 + mode)
        scratch = _scratch(ops, w) if kernel == "tc" else None
        want = _batched_gemv(ops, w, x, nw, bias, y0.clone(), mode, scratch=scratch)
        bad = x.clone()
        bad[3] = float("nan")
        bad[7] = 3e38
        got = _batched_gemv(ops, w, bad, nw, bias, y0.clone(), mode, scratch=scratch)
        keep = [r for r in range(ROWS) if r not in (3, 7)]
        assert_equal(got[keep], want[keep], f"mode {mode}: rows next to NaN / huge rows")
        assert got[3].isnan().all()


def test_batched_gemv_tensor_cores_take_bf16_with_scratch(ops: Ops) -> None:
    """Where the device has tensor cores (sm_80+), a bf16 call with scratch runs another kernel than
    without (other bits, same function); the split shapes need scratch, and a short one is refused."""
    if not tc_device():
        pytest.skip("no tensor cores (sm_80+) on this GPU: the FMA kernel serves every call")
    n, k = 2048, 6144
    w, _, x, nw, _, y0 = _gemv_inputs(n, k, torch.bfloat16, library.GEMV_ADD, 5)
    need = ops.batched_gemv_scratch_floats([w])
    assert need > 4096, need  # K = 6144 is split over blocks: counters and partials
    assert ops.batched_gemv_scratch_floats([w.float()]) == 0  # float32 weights: the FMA kernel only
    tc = _batched_gemv(ops, w, x, nw, None, y0.clone(), library.GEMV_ADD, scratch=_scratch(ops, w))
    fma = _batched_gemv(ops, w, x, nw, None, y0.clone(), library.GEMV_ADD)
    assert not torch.equal(tc, fma)
    assert_close(tc, fma, TC_TOL, "tensor cores vs FMA")
    with pytest.raises(library.NativeError, match="needs"):
        ops.batched_gemv(w, x, y0.clone(), scratch=torch.zeros(need - 1, device=DEV))


# The split shapes of a 1.7B / 0.6B step whose row tiles run as thread-block clusters on sm_90 (2..8 splits):
# Talker qkv, CodePredictor qkv, o, gate_up, down (6 splits) and lm_head; Talker down (12) keeps the scratch path.
CLUSTER_SHAPES = [(4096, 2048), (4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 1024), (2048, 6144)]


@pytest.mark.parametrize("pdl", [False, True])
def test_batched_gemv_clusters_equal_scratch_path(ops: Ops, pdl: bool) -> None:
    """On sm_90 the tensor-core kernel splits K across a cluster's blocks (distributed shared memory) where
    the plan has 2..8 splits; with q3t_set_gemv_clusters(0) it keeps the partials in global scratch. Both sum
    in the same order: bf16 and int8 weights, every mode, nb 1..16, with and without PDL, bit for bit. The
    scratch's partials show which path ran: every matrix writes them without clusters, and with clusters at
    least one (the CodePredictor's) writes none, so the comparison is not of one path with itself."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90")
    from wyoming_qwen3tts.backends.kernels.ops import Matrix
    from wyoming_qwen3tts.model.quant import quantize_rows

    args = []
    for i, (n, k) in enumerate(CLUSTER_SHAPES):
        mode = (library.GEMV_STORE, library.GEMV_ADD, library.GEMV_SWIGLU)[i % 3]
        w, w32, x, nw, bias, y0 = _gemv_inputs(n, k, torch.bfloat16, mode, 700 + i)
        args.append((w, x, nw if i % 2 == 0 else None, bias, y0, mode))
        args.append((Matrix(*quantize_rows(w32)), x, nw if i % 2 == 1 else None, bias, y0, mode))
    outs: dict[bool, list[torch.Tensor]] = {}
    records: dict[bool, list[int]] = {}
    ops.set_pdl(pdl)
    try:
        for clusters in (True, False):
            ops.set_gemv_clusters(clusters)
            outs[clusters], records[clusters] = [], []
            for w, x, nw, bias, y, mode in args:
                scratch = torch.zeros(max(ops.batched_gemv_scratch_floats([w]), 1), device=DEV)
                for nb in (1, 5, 8, 16):
                    yy = y[:nb].clone()
                    ops.batched_gemv(
                        w, x[:nb].contiguous(), yy, mode=mode, norm_w=nw, eps=1e-6, bias=bias, scratch=scratch
                    )
                    outs[clusters].append(yy.cpu())
                records[clusters].append(int(scratch[4096:].count_nonzero()))  # partials past the counters
    finally:  # the module's library as the fixture left it
        ops.set_gemv_clusters(True)
        ops.set_pdl(os.environ.get("Q3T_PDL", "0") == "1")
    assert all(n > 0 for n in records[False]), records[False]
    assert 0 in records[True], records[True]
    assert len(outs[True]) == 2 * 4 * len(CLUSTER_SHAPES)
    for i, (a, b) in enumerate(zip(outs[True], outs[False])):
        what = f"shape {CLUSTER_SHAPES[i // 8]} {('bf16', 'int8')[i // 4 % 2]}, call {i % 4}"
        assert torch.isfinite(a).all(), f"{what}: not finite"
        assert_equal(a, b, f"{what}: clusters vs scratch")


def test_batched_gemv_rejects_bad_arguments(ops: Ops) -> None:
    over = library.BATCH_MAX + 1
    z = torch.zeros(over * 64 + 4, device=DEV)
    w, y = z[: 4 * 64].view(4, 64), z[: over * 4].view(over, 4)
    with pytest.raises(library.NativeError, match=f"nb={over}"):
        ops.batched_gemv(w, z[: over * 64].view(over, 64), y)
    with pytest.raises(library.NativeError, match="nb=0"):  # raw: an empty tensor has no data pointer
        ops.lib.call(
            "q3t_batched_gemv",
            library.F32,
            w.data_ptr(),
            None,
            4,
            64,
            z.data_ptr(),
            0,
            None,
            1e-6,
            None,
            y.data_ptr(),
            library.GEMV_STORE,
            None,
            0,
            torch.cuda.current_stream().cuda_stream,
        )
    with pytest.raises(library.NativeError, match="multiple of 8"):  # bf16 rows of K = 100 are not 16-byte chunks
        ops.batched_gemv(torch.zeros(4, 100, dtype=torch.bfloat16, device=DEV), z[:200].view(2, 100), y)
    with pytest.raises(library.NativeError, match="aligned"):
        ops.batched_gemv(w, z[1 : 1 + 128].view(2, 64), y)
    with pytest.raises(library.NativeError, match="even row count"):
        ops.batched_gemv(z[: 5 * 64].view(5, 64), z[:128].view(2, 64), y, mode=library.GEMV_SWIGLU)


# ------------------------------------------------------------------------------------------ attention


def _rope_tables(max_seq: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    from wyoming_qwen3tts.model.layers import rope_tables

    cos, sin = rope_tables(torch.arange(max_seq, device=DEV), d, 1e6, torch.float32)
    return cos.contiguous(), sin.contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(16, 8, 128), (4, 2, 16), (8, 8, 64), (16, 4, 32)])
@pytest.mark.parametrize("splits", [1, 4, 32])
def test_batched_rope_attention_split_rows(
    ops: Ops, dtype: torch.dtype, hq: int, hkv: int, d: int, splits: int
) -> None:
    """Rows in shuffled slots at different positions (0 .. 1000: one chunk of 1,001 positions read in many
    shared-memory tiles, or many chunks merged), one padding row, KV groups of 2, 1 and 4 q heads: each
    slot's cache gets q3t_rope_attention_split's row bit for bit (the slots no row uses and the other layer
    untouched); each row's output is the float64 attention over its cache within 1e-5, agrees with the
    one-stream kernel to float32 rounding, and is bit for bit the same when the row runs alone (nb = 1);
    the merge counters end at 0 (twice in a row)."""
    slots, layers, layer, max_seq, eps = 6, 2, 1, 1024, 1e-6
    g = gen(hq * 7 + d + splits + hkv)
    cache0 = torch.randn(slots, layers, 2, max_seq, hkv, d, device=DEV, generator=g).to(dtype)
    pos = torch.tensor([700, 0, 333, 16, 1000, 5], dtype=torch.int32, device=DEV)
    slot = torch.tensor([4, 1, -1, 0, 2], dtype=torch.int32, device=DEV)  # row 2 pads
    nb = slot.numel()
    row = (hq + 2 * hkv) * d
    qkv = torch.randn(nb, row, device=DEV, generator=g)
    qn = torch.rand(d, device=DEV, generator=g) + 0.5
    kn = torch.rand(d, device=DEV, generator=g) + 0.5
    cos, sin = _rope_tables(max_seq, d)
    scale = d**-0.5
    per_row = hq * splits * (d + 2) + hq
    scratch = torch.zeros(nb * per_row, device=DEV)
    for i in range(nb):
        scratch[i * per_row : i * per_row + hq * splits * (d + 2)] = float("nan")  # partials: always written first
    cache = cache0.clone()
    out = torch.full((nb, hq * d), float("nan"), device=DEV)
    call = partial(
        ops.batched_rope_attention_split,
        q_norm=qn,
        k_norm=kn,
        cos=cos,
        sin=sin,
        eps=eps,
        scale=scale,
        splits=splits,
        slot_rows=layers * 2 * max_seq,
        pos=pos,
    )
    for _ in range(2):
        cache.copy_(cache0)
        call(qkv, k_cache=cache[0, layer, 0], v_cache=cache[0, layer, 1], out=out, slot=slot, scratch=scratch)
        counters = torch.stack([scratch[i * per_row + hq * splits * (d + 2) : (i + 1) * per_row] for i in range(nb)])
        assert not counters.any(), "merge counters not back to 0"
    want_cache = cache0.clone()
    for r, s in enumerate(slot.tolist()):
        if s < 0:
            continue
        p = int(pos[s])
        what = f"row {r} (slot {s}, position {p})"
        kc, vc = want_cache[s, layer, 0], want_cache[s, layer, 1]
        one_scratch = torch.zeros(per_row, device=DEV)
        one = torch.full((hq * d,), float("nan"), device=DEV)
        ops.rope_attention_split(
            qkv[r], qn, kn, cos, sin, kc, vc, one, eps=eps, scale=scale, splits=splits, scratch=one_scratch, pos=pos[s:]
        )
        assert_close(out[r], one, F32_TOL, f"{what} against the one-stream kernel")
        # Against float64 (q, k normed and rotated by the model's functions) over the rows the kernel left, the
        # appended row against float64 too and every other row of the slot's cache untouched.
        check_attention_step(
            qkv[r],
            qn,
            kn,
            cos,
            sin,
            cache0[s, layer, 0],
            cache0[s, layer, 1],
            cache[s, layer, 0],
            cache[s, layer, 1],
            out[r],
            p,
            hq,
            scale,
        )
        alone_cache = cache0.clone()
        alone = torch.full((1, hq * d), float("nan"), device=DEV)
        call(
            qkv[r : r + 1],
            k_cache=alone_cache[0, layer, 0],
            v_cache=alone_cache[0, layer, 1],
            out=alone,
            slot=slot[r : r + 1],
            scratch=torch.zeros(per_row, device=DEV),
        )
        assert_equal(alone[0], out[r], f"{what} alone (nb = 1) against in the batch")
    assert_equal(cache, want_cache, "caches (written rows, untouched slots and layers)")
    assert not torch.equal(cache, cache0)


def _short_inputs(g: torch.Generator, nb: int, n: int, hq: int, hkv: int, d: int, dtype: torch.dtype):
    max_seq, layers = 16, 3
    cache0 = torch.randn(nb, layers, 2, max_seq, hkv, d, device=DEV, generator=g).to(dtype)
    qkv = torch.randn(nb, n, (hq + 2 * hkv) * d, device=DEV, generator=g)
    qn = torch.rand(d, device=DEV, generator=g) + 0.5
    kn = torch.rand(d, device=DEV, generator=g) + 0.5
    return max_seq, layers, cache0, qkv, qn, kn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(16, 8, 128), (2, 1, 16)])
@pytest.mark.parametrize("nb", [1, 3, 16])
def test_batched_rope_attention_rows_equal_one_stream(
    ops: Ops, dtype: torch.dtype, hq: int, hkv: int, d: int, nb: int
) -> None:
    """The CodePredictor's short attention for nb rows (each its own cache, one shared position) and
    its first-positions form: every row's output and cache are the one-stream kernels' bit for bit."""
    g = gen(nb * 31 + d + hq)
    max_seq, layers, cache0, qkv, qn, kn = _short_inputs(g, nb, 2, hq, hkv, d, dtype)
    cos, sin = _rope_tables(max_seq, d)
    scale, layer, row_rows = d**-0.5, 2, layers * 2 * max_seq
    p = torch.tensor([6], dtype=torch.int32, device=DEV)  # position 6 + 3
    cache = cache0.clone()
    out = torch.full((nb, hq * d), float("nan"), device=DEV)
    qkv0 = qkv[:, 0].contiguous()  # one position per row
    ops.batched_rope_attention(
        qkv0,
        qn,
        kn,
        cos,
        sin,
        cache[0, layer, 0],
        cache[0, layer, 1],
        out,
        row_rows=row_rows,
        eps=1e-6,
        scale=scale,
        pos=p,
        pos_add=3,
    )
    want_cache = cache0.clone()
    for r in range(nb):
        want = torch.full((hq * d,), float("nan"), device=DEV)
        ops.rope_attention(
            qkv0[r],
            qn,
            kn,
            cos,
            sin,
            want_cache[r, layer, 0],
            want_cache[r, layer, 1],
            want,
            eps=1e-6,
            scale=scale,
            pos=p,
            pos_add=3,
        )
        assert_equal(out[r], want, f"row {r} output")
    assert_equal(cache, want_cache, "caches")

    n = 2
    cache = cache0.clone()
    out = torch.full((nb, n, hq * d), float("nan"), device=DEV)
    ops.batched_rope_attention_first(
        qkv, qn, kn, cos, sin, cache[0, layer, 0], cache[0, layer, 1], out, row_rows=row_rows, eps=1e-6, scale=scale
    )
    want_cache = cache0.clone()
    for r in range(nb):
        want = torch.full((n, hq * d), float("nan"), device=DEV)
        ops.rope_attention_first(
            qkv[r], qn, kn, cos, sin, want_cache[r, layer, 0], want_cache[r, layer, 1], want, eps=1e-6, scale=scale
        )
        assert_equal(out[r], want, f"row {r} first-positions output")
    assert_equal(cache, want_cache, "caches after the first positions")


def test_batched_attention_rejects_bad_shapes(ops: Ops) -> None:
    # Raw calls on purpose: the typed wrappers read these sizes off consistent tensors.
    lib, stream = ops.lib, torch.cuda.current_stream().cuda_stream
    z = torch.zeros(64, device=DEV)
    p = z.data_ptr()
    over = library.BATCH_MAX + 1
    with pytest.raises(library.NativeError, match=f"nb={over}"):
        lib.call(
            "q3t_batched_rope_attention_split",
            library.F32,
            p,
            p,
            p,
            1e-6,
            p,
            p,
            p,
            p,
            over,
            4,
            2,
            16,
            64,
            0.25,
            1,
            None,
            p,
            p,
            128,
            p,
            stream,
        )
    with pytest.raises(library.NativeError, match="slot_rows"):  # slots closer than one cache apart
        lib.call(
            "q3t_batched_rope_attention_split",
            library.F32,
            p,
            p,
            p,
            1e-6,
            p,
            p,
            p,
            p,
            2,
            4,
            2,
            16,
            64,
            0.25,
            1,
            None,
            p,
            p,
            32,
            p,
            stream,
        )
    with pytest.raises(library.NativeError, match="a multiple of 8"):  # d = 12
        lib.call(
            "q3t_batched_rope_attention_split",
            library.F32,
            p,
            p,
            p,
            1e-6,
            p,
            p,
            p,
            p,
            2,
            4,
            2,
            12,
            64,
            0.25,
            1,
            None,
            p,
            p,
            128,
            p,
            stream,
        )
    with pytest.raises(library.NativeError, match="1, 2 or 4"):  # 3 q heads a KV head
        lib.call(
            "q3t_batched_rope_attention_split",
            library.F32,
            p,
            p,
            p,
            1e-6,
            p,
            p,
            p,
            p,
            2,
            6,
            2,
            16,
            64,
            0.25,
            1,
            None,
            p,
            p,
            128,
            p,
            stream,
        )
    with pytest.raises(library.NativeError, match="max_seq"):
        lib.call(
            "q3t_batched_rope_attention",
            library.F32,
            p,
            p,
            p,
            1e-6,
            p,
            p,
            None,
            0,
            2,
            2,
            1,
            16,
            65,
            0.25,
            p,
            p,
            130,
            p,
            stream,
        )


# ------------------------------------------------------------------------------------------ sampling


def _params(records: list[dict]) -> torch.Tensor:
    """q3t_sample_params records on the device (the decoder's own packing)."""
    from wyoming_qwen3tts.backends.kernels.batched import sample_params

    return sample_params(records, torch.device(DEV))


def test_batched_sample_rows_equal_q3t_sample(ops: Ops) -> None:
    """Rows in shuffled slots with a mix of settings (greedy; sampled with temperature, top-k and
    top-p; repetition penalty over each slot's seen set; EOS masked below min-new-tokens), each slot
    its own seed and step: each row's code, seen set and embedding row are q3t_sample's with that
    slot's arguments, bit for bit; a padding row writes nothing."""
    v, slots, sup = 3072, 5, (2048, 3072)
    eos = 2150
    g = gen(7)
    table = torch.randn(v, 48, device=DEV, generator=g)
    records = [
        dict(flags=0, temperature=1.0, top_k=0, top_p=1.0, penalty=1.05, eos=eos, min_new_tokens=2),
        dict(
            flags=library.SAMPLE_DO_SAMPLE,
            temperature=0.9,
            top_k=50,
            top_p=1.0,
            penalty=1.05,
            eos=eos,
            min_new_tokens=2,
        ),
        dict(
            flags=library.SAMPLE_DO_SAMPLE, temperature=1.3, top_k=0, top_p=0.8, penalty=1.0, eos=eos, min_new_tokens=0
        ),
        dict(
            flags=library.SAMPLE_DO_SAMPLE, temperature=0.7, top_k=20, top_p=0.9, penalty=1.2, eos=-1, min_new_tokens=0
        ),
        dict(flags=0, temperature=1.0, top_k=0, top_p=1.0, penalty=1.0, eos=eos, min_new_tokens=9),
    ]
    params = _params(records)
    seed = torch.tensor([11, 2**62 + 3, -5, 0, 77], dtype=torch.int64, device=DEV)
    step = torch.tensor([0, 1, 5, 40, 3], dtype=torch.int32, device=DEV)
    slot = torch.tensor([3, 0, 4, -1, 2, 1], dtype=torch.int32, device=DEV)
    nb = slot.numel()
    for trial in range(6):
        logits = torch.randn(nb, v, device=DEV, generator=g) * 3
        logits[:, eos] = 8.0  # EOS on top: masked where the slot's step is below its min-new-tokens
        seen0 = (torch.rand(slots, v, device=DEV, generator=g) < 0.02).to(torch.uint8)
        seen = seen0.clone()
        codes = torch.full((nb, 16), -7, dtype=torch.int32, device=DEV)
        rows = torch.full((nb, 64), float("nan"), device=DEV)
        ops.batched_sample(
            logits,
            codes[:, 3:],
            slot=slot,
            params=params,
            seed=seed,
            step=step,
            seen=seen,
            suppress=sup,
            stream_id=4,
            out_stride=16,
            row_table=table,
            row_out=rows,
            row_stride=64,
        )
        want_seen = seen0.clone()
        for r, s in enumerate(slot.tolist()):
            if s < 0:
                assert (codes[r] == -7).all() and rows[r].isnan().all(), "padding row written"
                continue
            rec = records[s]
            out = torch.zeros(1, dtype=torch.int32, device=DEV)
            row = torch.full((48,), float("nan"), device=DEV)
            ops.sample(
                logits[r],
                out,
                seen=want_seen[s],
                penalty=rec["penalty"],
                eos=rec["eos"],
                min_new_tokens=rec["min_new_tokens"],
                suppress=sup,
                do_sample=bool(rec["flags"] & library.SAMPLE_DO_SAMPLE),
                temperature=rec["temperature"],
                top_k=rec["top_k"],
                top_p=rec["top_p"],
                seed=seed[s:],
                stream_id=4,
                step=step[s:],
                row_table=table,
                row_out=row,
            )
            assert int(codes[r, 3]) == int(out), f"trial {trial} row {r} (slot {s}): {int(codes[r, 3])} vs {int(out)}"
            assert_equal(rows[r, :48], row, f"row {r} embedding row")
            assert (codes[r, :3] == -7).all() and (codes[r, 4:] == -7).all(), "wrote outside its code"
        assert_equal(seen, want_seen, f"trial {trial} seen sets")
        step += 1


def test_batched_sample_seeded_draws_ignore_batch_mates(ops: Ops) -> None:
    """A sampled slot draws the same ids alone (nb = 1) as in a batch of 8 with other slots, other
    logits and other settings; its draws follow its own seed (another seed gives other ids)."""
    v = 2048
    g = gen(3)
    records = [
        dict(
            flags=library.SAMPLE_DO_SAMPLE,
            temperature=1.5,
            top_k=100,
            top_p=0.95,
            penalty=1.0,
            eos=-1,
            min_new_tokens=0,
        )
    ] * 8
    params = _params(records)
    seed = torch.arange(100, 108, dtype=torch.int64, device=DEV)
    step = torch.zeros(8, dtype=torch.int32, device=DEV)
    alone_slot = torch.tensor([5], dtype=torch.int32, device=DEV)
    batch_slot = torch.tensor([0, 7, 5, 1, 2, 3, 4, 6], dtype=torch.int32, device=DEV)
    alone, batched = [], []
    for _ in range(40):
        logits = torch.randn(8, v, device=DEV, generator=g)
        out1 = torch.zeros(1, dtype=torch.int32, device=DEV)
        out8 = torch.zeros(8, dtype=torch.int32, device=DEV)
        ops.batched_sample(logits[2:3], out1, slot=alone_slot, params=params, seed=seed, step=step)
        ops.batched_sample(logits, out8, slot=batch_slot, params=params, seed=seed, step=step)
        alone.append(int(out1))
        batched.append(int(out8[2]))
        step += 1
    assert alone == batched
    assert len(set(alone)) > 10  # really sampled
    # Another seed, the same logits and steps: other draws.
    draws = {}
    for value in (105, 106):
        seed[5] = value
        step.zero_()
        logits = torch.zeros(1, v, device=DEV)  # uniform: the draw is all seed
        out = []
        for _ in range(10):
            out1 = torch.zeros(1, dtype=torch.int32, device=DEV)
            ops.batched_sample(logits, out1, slot=alone_slot, params=params, seed=seed, step=step)
            out.append(int(out1))
            step += 1
        draws[value] = out
    assert draws[105] != draws[106]


# ------------------------------------------------------------------------------------------ embed, norm, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_embed_sum_rows_equal_q3t_embed_sum(ops: Ops, dtype: torch.dtype) -> None:
    """Each row's 16-code sum plus its slot's trailing row (or pad past the slot's own trailing length)
    is q3t_embed_sum's bit for bit; a padding row is zeros."""
    g = gen(5)
    h, rows0, rows, slots, max_trailing = 96, 3072, 2048, 4, 6
    tables = [torch.randn(rows0, h, device=DEV, generator=g).to(dtype)]
    tables += [torch.randn(rows, h, device=DEV, generator=g).to(dtype) for _ in range(15)]
    ptrs = torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device=DEV)
    trailing = torch.randn(slots, max_trailing, h, device=DEV, generator=g)
    n_trailing = torch.tensor([6, 0, 3, 9], dtype=torch.int32, device=DEV)  # 9: capped at max_trailing
    pad = torch.randn(slots, h, device=DEV, generator=g)
    step = torch.tensor([2, 0, 3, 5], dtype=torch.int32, device=DEV)  # slot 2 is one past its 3 rows
    slot = torch.tensor([2, -1, 0, 3, 1], dtype=torch.int32, device=DEV)
    nb = slot.numel()
    codes = torch.randint(0, rows, (nb, 16), device=DEV, generator=g, dtype=torch.int32)
    codes[:, 0] = torch.tensor([2150, 5, 3000, 17, 2047], dtype=torch.int32)
    out = torch.full((nb, h), float("nan"), device=DEV)
    ops.batched_embed_sum(
        tables, ptrs, codes, out, slot=slot, trailing=trailing, n_trailing=n_trailing, pad=pad, step=step
    )
    for r, s in enumerate(slot.tolist()):
        if s < 0:
            assert not out[r].any(), "padding row not zeros"
            continue
        want = torch.full((h,), float("nan"), device=DEV)
        n = min(int(n_trailing[s]), max_trailing)
        ops.embed_sum(tables, ptrs, codes[r], trailing[s, :n], pad[s], step[s:], want)
        assert_equal(out[r], want, f"row {r} (slot {s})")
    ref = sum(tables[j][codes[2, j].long()].double() for j in range(16)) + trailing[0, 2].double()
    assert_close(out[2], ref, F32_TOL, "row 2 (slot 0, trailing row 2) vs float64")
    ref = sum(tables[j][codes[0, j].long()].double() for j in range(16)) + pad[2].double()
    assert_close(out[0], ref, F32_TOL, "row 0 (slot 2, past its trailing rows: pad) vs float64")


def test_batched_rmsnorm_rows_equal_q3t_rmsnorm(ops: Ops) -> None:
    g = gen(8)
    for n, nb in ((64, 1), (2048, 5), (1024, 16)):
        x = torch.randn(nb, n, device=DEV, generator=g) * torch.linspace(0.1, 10, nb, device=DEV)[:, None]
        w = torch.rand(n, device=DEV, generator=g) + 0.5
        y = torch.full_like(x, float("nan"))
        ops.batched_rmsnorm(x, w, y, eps=1e-6)
        for r in range(nb):
            want = torch.full((n,), float("nan"), device=DEV)
            ops.rmsnorm(x[r], w, want, eps=1e-6)
            assert_equal(y[r], want, f"n={n} row {r}")


def test_batched_store_codes_and_advance(ops: Ops) -> None:
    slots, max_frames = 4, 5
    pos = torch.tensor([10, 20, 30, 40], dtype=torch.int32, device=DEV)
    step = torch.tensor([0, 3, 4, 5], dtype=torch.int32, device=DEV)  # slot 3 is past its history
    history = torch.full((slots, max_frames, 16), -1, dtype=torch.int32, device=DEV)
    slot = torch.tensor([1, -1, 3, 0], dtype=torch.int32, device=DEV)
    codes = torch.arange(4 * 16, dtype=torch.int32, device=DEV).view(4, 16)
    ops.batched_store_codes(codes, history, slot=slot, step=step)
    ops.batched_advance(slot, pos=pos, step=step)
    ops.batched_advance(slot, pos=None, step=step)
    want = torch.full_like(history, -1)
    want[1, 3] = codes[0]
    want[0, 0] = codes[3]
    assert_equal(history, want, "history")
    assert pos.tolist() == [11, 21, 30, 41]  # slot 2 has no row
    assert step.tolist() == [2, 5, 4, 7]


# ------------------------------------------------------------------------------------------ a batched frame loop


def _run_plan(dec, plan: list[tuple[int, int, object, object, int, int]]) -> dict[int, np.ndarray]:
    """plan: (join step, slot, prompt, sampling, seed, frames) per stream, on a BatchedDecoder; a stream
    leaves (release) after its frames and a later stream may take its slot. Returns each stream's codes
    [frames, 16] by its index in the plan (read as it leaves: a later stream overwrites the slot)."""
    out: dict[int, np.ndarray] = {}
    last = max(join + frames for join, *_, frames in plan)
    for t in range(last + 1):
        for i, (join, slot, _prompt, _sampling, _seed, frames) in enumerate(plan):
            if t == join + frames:
                torch.cuda.synchronize()
                out[i] = dec.history[slot, :frames].cpu().numpy().astype(np.int64)
                dec.release(slot)
        for join, slot, prompt, sampling, seed, _frames in plan:
            if t == join:
                dec.admit(slot, prompt, sampling, seed)
        dec.step()
    return out


@pytest.mark.parametrize("lone", [False, True])
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_batched_decoder_equals_one_stream_backend(
    tiny_checkpoint: Path, tiny_checkpoint_06b: Path, ops: Ops, size: str, graphs: bool, lone: bool
) -> None:
    """BatchedDecoder (eager, and through its captured graphs; with and without lone steps, where the last
    stream runs alone for its last 8 frames): streams of different speakers, languages and prompt lengths
    joining at different steps, one leaving early and a fourth taking its slot (a reused slot carries
    nothing over), the step bucket growing past padding rows: float32 greedy codes of each equal the
    one-stream kernel backend's, frame for frame. Then seeded sampling, every step batched (lone off: batch
    invariant): a stream's codes are the same alone as next to others (they do not depend on their
    batch-mates), and another seed changes them."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import BatchedDecoder
    from wyoming_qwen3tts.backends.kernels.options import KernelOptions
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.request import SamplingParams

    model = load_model_without_eos(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    # The decoder prefills eagerly: the backend too, for the same torch matmuls and the same prompt state.
    kb = KernelBackend(model, KernelOptions(graph_prefill=False))
    prompts = [
        build_prompt(model, text_ids(12, 1), "ryan", "english"),
        build_prompt(model, text_ids(5, 2), "vivian", "chinese"),
        build_prompt(model, text_ids(30, 3), "ryan", "english", non_streaming_text=False),
        build_prompt(model, text_ids(8, 4), "vivian", "english", non_streaming_text=False),
    ]
    greedy = SamplingParams.greedy()
    frames = [20, 32, 24, 18]
    want = [kb.start(p, greedy, 0, n).next_frames(n) for p, n in zip(prompts, frames)]

    def decoder(slots: int, lone: bool = lone) -> BatchedDecoder:
        return BatchedDecoder(
            model,
            kb.ops,
            kb.weights,
            slots=slots,
            max_seq=256,
            max_trailing=64,
            attn_splits=kb.options.attn_splits,
            graphs=graphs,
            invariant=not lone,
            lone_splits=kb.options.attn_splits,
        )

    # Slot 0 from step 0 to 20, slot 2 from 0 (bucket 4, slot 1 padding until step 5), slot 1 from
    # step 5; slot 0 again from step 22 (a new stream in a used slot), alone from step 32.
    plan = [
        (0, 0, prompts[0], greedy, 0, frames[0]),
        (0, 2, prompts[1], greedy, 0, frames[1]),
        (5, 1, prompts[2], greedy, 0, frames[2]),
        (22, 0, prompts[3], greedy, 0, frames[3]),
    ]
    dec = decoder(5)
    got = _run_plan(dec, plan)
    for i in range(len(plan)):
        mism = np.argwhere(got[i] != want[i])
        assert mism.size == 0, f"stream {i}: first mismatch at frame/code {mism[0].tolist()} of {frames[i]}"
    assert dec.lone_steps == (8 if lone else 0), dec.lone_steps

    decoder = partial(decoder, lone=False)
    sampled = SamplingParams()
    alone = _run_plan(decoder(1), [(0, 0, prompts[0], sampled, 42, 24)])
    mates = _run_plan(
        decoder(5),
        [(0, 1, prompts[1], sampled, 7, 30), (2, 4, prompts[0], sampled, 42, 24), (0, 0, prompts[2], greedy, 0, 26)],
    )
    assert np.array_equal(alone[0], mates[1]), "a sampled stream's codes changed with its batch-mates"
    other = _run_plan(decoder(1), [(0, 0, prompts[0], sampled, 43, 24)])
    assert not np.array_equal(alone[0], other[0])


@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_batched_decoder_streams_equal_alone(
    tiny_checkpoint: Path, tiny_checkpoint_06b: Path, ops: Ops, size: str, weights: str
) -> None:
    """bf16 weights, or a float32 model's matrices quantized to int8 (model/quant.py) (the tensor-core GEMV
    where the device has one, through the captured graphs):
    streams joining at different steps in buckets 1-4, one leaving and a stream reusing its slot,
    each get exactly the greedy codes they get alone in a one-slot decoder (nb = 1), since no batched
    kernel lets a row see another; and seeded sampling likewise (lone steps off: batch invariant). With
    lone steps, a stream alone decodes exactly what the one-stream kernel backend decodes, greedy and
    sampled: the same GEMV, attention and norm kernels, and draws that q3t_sample makes bit for bit."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import BatchedDecoder
    from wyoming_qwen3tts.backends.kernels.options import KernelOptions
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.model.quant import quantize_model
    from wyoming_qwen3tts.request import SamplingParams

    path = tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b
    if weights == "int8":
        model = load_model_without_eos(path)
        assert quantize_model(model).modules > 0
    else:
        model = load_model_without_eos(path, torch.bfloat16)
    kb = KernelBackend(model, KernelOptions(graph_prefill=False))

    def decoder(slots: int) -> BatchedDecoder:
        return BatchedDecoder(
            model,
            kb.ops,
            kb.weights,
            slots=slots,
            max_seq=256,
            max_trailing=64,
            attn_splits=kb.options.attn_splits,
            invariant=True,
        )

    prompts = [
        build_prompt(model, text_ids(12, 1), "ryan", "english"),
        build_prompt(model, text_ids(5, 2), "vivian", "chinese"),
        build_prompt(model, text_ids(30, 3), "ryan", "english", non_streaming_text=False),
        build_prompt(model, text_ids(8, 4), "vivian", "english", non_streaming_text=False),
    ]
    greedy, sampled = SamplingParams.greedy(), SamplingParams()
    runs = [
        (prompts[0], greedy, 0, 20),
        (prompts[1], sampled, 11, 32),
        (prompts[2], greedy, 0, 24),
        (prompts[3], sampled, 12, 18),
    ]
    alone = [_run_plan(decoder(1), [(0, 0, p, smp, seed, n)])[0] for p, smp, seed, n in runs]
    plan = [(0, 0, *runs[0]), (0, 2, *runs[1]), (5, 1, *runs[2]), (22, 0, *runs[3])]
    got = _run_plan(decoder(4), plan)
    for i in range(len(plan)):
        mism = np.argwhere(got[i] != alone[i])
        assert mism.size == 0, f"stream {i}: first mismatch at frame/code {mism[0].tolist()} of {runs[i][3]}"
    # Lone steps against the one-stream backend, both prompts prefilled by the same captured graph.
    single = KernelBackend(model)
    assert single.warm_up() > 0
    lone = BatchedDecoder(
        model,
        single.ops,
        single.weights,
        slots=4,
        max_seq=256,
        max_trailing=64,
        prefills=single.prefills,
        prefill_cache=single.state.cache,
        lone_splits=single.options.attn_splits,
    )
    for i, (p, smp, seed, n) in enumerate(runs):
        want = single.start(p, smp, seed, n).next_frames(n)
        got_lone = _run_plan(lone, [(0, 3 - i, p, smp, seed, n)])[0]  # slots 3..0: each slot's own graph
        mism = np.argwhere(got_lone != want)
        assert mism.size == 0, f"lone stream {i}: first mismatch at frame/code {mism[0].tolist()} of {n}"
    assert lone.lone_steps == sum(n for *_, n in runs) and lone.graphed_admissions == len(runs)


@pytest.mark.parametrize("clusters", [True, False])
def test_batched_gemv_groups_in_one_launch_equal_launches_of_16(ops: Ops, clusters: bool) -> None:
    """q3t_set_gemv_groups(1): the tensor-core kernel takes nb > 16 vectors in one launch, 16 at a time inside each
    block. Every vector's bits equal those of the launches of 16 (the default), at nb 17, 40 and 64, bf16 and int8,
    every mode, split K in clusters and in scratch (its per-group counters left 0), within 3e-5 of float64."""
    if not tc_device():
        pytest.skip("no tensor cores (sm_80+) on this GPU: the FMA kernel serves every call")
    from wyoming_qwen3tts.backends.kernels.ops import Matrix
    from wyoming_qwen3tts.model.quant import quantize_rows

    cases = []
    for i, (n, k) in enumerate([*CLUSTER_SHAPES, (3072, 1024), (130, 16)]):
        mode = (library.GEMV_STORE, library.GEMV_ADD, library.GEMV_SWIGLU)[i % 3]
        w, w32, x, nw, bias, y0 = _gemv_inputs(n, k, torch.bfloat16, mode, 900 + i)
        cases.append((f"{n}x{k} bf16", w, w32, x, nw if i % 2 == 0 else None, bias, y0, mode))
        cases.append((f"{n}x{k} int8", Matrix(*quantize_rows(w32)), None, x, nw, bias, y0, mode))
    ops.set_gemv_clusters(clusters)
    try:
        for what, w, w32, x, nw, bias, y, mode in cases:
            scratch = torch.zeros(max(ops.batched_gemv_scratch_floats([w]), 1), device=DEV)
            for nb in (17, 40, 64):
                got = {}
                for groups in (False, True):
                    ops.set_gemv_groups(groups)
                    yy = y[:nb].clone()
                    ops.batched_gemv(
                        w, x[:nb].contiguous(), yy, mode=mode, norm_w=nw, eps=1e-6, bias=bias, scratch=scratch
                    )
                    got[groups] = yy
                    assert int(scratch.view(torch.int32)[:4096].count_nonzero()) == 0, f"{what}: counters not 0"
                assert torch.isfinite(got[True]).all(), f"{what} nb={nb}: not finite"
                assert_equal(got[True], got[False], f"{what} nb={nb}: one launch vs launches of 16")
                if w32 is not None:
                    ref = gemv_reference(w.float(), x[:nb], nw, bias, y[:nb], mode, 1e-6)
                    assert_close(got[True], ref, TC_TOL, f"{what} nb={nb}: vs float64")
    finally:  # the module's library as the fixture left it
        ops.set_gemv_groups(False)
        ops.set_gemv_clusters(True)
