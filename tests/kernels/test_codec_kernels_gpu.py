"""The codec decoder's fused SnakeBeta (q3t_snake_beta) against torch's ops, and the codec with it against the codec
without, on fresh random inputs. GPU only.

Bounds. The kernel rounds each of torch's five ops (x * alpha, sin, square, * inv_beta, + x) to the dtype as torch
does, so its output equals torch's bit for bit, save where sinf's last float bit differs between two builds of it
(torch's and ours): at most 1 sample in 1,000 may differ, and by at most one unit in the dtype's last place. The
codec with the kernel against the codec without: float32 within F32_BOUND, bf16 within BF16_MAX / BF16_RMS (one
flipped rounding runs through the ~30 layers after it; tests/support/codec_slots_check.py); the measured share of
equal samples is printed (pytest -s). A captured CodecSlots call with the kernel equals the eager call bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codec_slots_check import BF16_MAX, BF16_RMS, F32_BOUND, random_decoder
from kernel_ops import gen, ops  # noqa: F401 - ops: the kernels' fixture

from wyoming_qwen3tts.model.codec import SnakeBeta
from wyoming_qwen3tts.model.codec_slots import CodecSlots

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = [torch.float32, torch.bfloat16]
ULP = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7}


def _activation(channels: int, dtype: torch.dtype, seed: int) -> SnakeBeta:
    """A SnakeBeta with random log-scale parameters, as the checkpoint stores them."""
    g = gen(seed)
    alpha = torch.randn(channels, device=DEV, generator=g) * 0.5
    beta = torch.randn(channels, device=DEV, generator=g) * 0.5
    return SnakeBeta(alpha.to(dtype), beta.to(dtype))


def _assert_torch_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    differ = got != want
    share = differ.float().mean().item()
    assert share <= 1e-3, f"{share:.2%} of the samples differ from torch's"
    if differ.any():
        g, w = got[differ].double(), want[differ].double()
        assert bool(((g - w).abs() <= torch.maximum(g.abs(), w.abs()) * ULP[got.dtype]).all()), (g[:4], w[:4])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bf16"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("t", [1, 255, 1920 * 3 + 7])
def test_snake_beta_rounds_as_torch(ops, dtype, strided, t):
    """Rows of 1 to 5,767 samples (one to six chunks of a block), contiguous or a slice of a larger tensor (as a
    transposed conv's trimmed output is), values across several periods of the sine."""
    g = gen(7 + t)
    act = _activation(40, dtype, seed=t)
    if strided:
        base = (torch.randn(3, 50, t + 30, device=DEV, generator=g) * 4).to(dtype)
        x = base[:, 5:45, 10 : 10 + t]
    else:
        x = (torch.randn(3, 40, t, device=DEV, generator=g) * 4).to(dtype)
    want = act(x)
    act.fused = ops.snake_beta
    got = act(x)
    _assert_torch_rounding(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bf16"])
def test_snake_beta_writes_only_its_slice(ops, dtype):
    """Into a slice of the conv's input buffer (behind its left context), as with_context asks: the context stays."""
    act = _activation(24, dtype, seed=3)
    x = (torch.randn(2, 24, 333, device=DEV, generator=gen(3)) * 3).to(dtype)
    buf = torch.full((2, 24, 333 + 6), 7.0, dtype=dtype, device=DEV)
    want = act(x)
    act.fused = ops.snake_beta
    assert act(x, out=buf[..., 6:]).data_ptr() == buf[..., 6:].data_ptr()
    assert bool((buf[..., :6] == 7.0).all())
    _assert_torch_rounding(buf[..., 6:], want)


def test_snake_beta_refuses_what_it_cannot_take(ops):
    x = torch.randn(2, 8, 16, device=DEV)
    alpha, inv_beta = torch.ones(8, device=DEV), torch.ones(8, device=DEV)
    with pytest.raises(ValueError, match="unit last strides"):
        ops.snake_beta(x.transpose(1, 2), alpha[:1].expand(16), inv_beta[:1].expand(16), torch.empty(2, 16, 8))
    with pytest.raises(ValueError, match="alphas"):
        ops.snake_beta(x, torch.ones(7, device=DEV), inv_beta, torch.empty_like(x))
    with pytest.raises(ValueError, match="one dtype"):
        ops.snake_beta(x, alpha, inv_beta, torch.empty_like(x, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bf16"])
def test_codec_with_the_kernel_decodes_as_without(ops, dtype):
    """The full-size random codec: a stream (CodecStream) of 30 frames in groups of 1, 4 and 25, and three slots
    (CodecSlots) through calls of 1, 2 and 12 frames, once on torch's activations and once on the kernel."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dec = random_decoder(dtype, size="1.7b", device=DEV)
    rng = np.random.default_rng(2)
    groups = [rng.integers(0, 2048, (n, 16)) for n in (1, 4, 25)]
    calls = [rng.integers(0, 2048, (3, n, 16)) for n in (1, 2, 12, 12)]

    def decode() -> torch.Tensor:
        stream = dec.new_stream()
        waves = [stream.decode(torch.from_numpy(c).to(DEV)) for c in groups]
        slots = CodecSlots(dec, 3)
        ids = [slots.open() for _ in range(3)]
        waves += [slots.decode(ids, c).flatten() for c in calls]
        return torch.cat(waves).float()

    want = decode()
    dec.use_fused_ops(ops.snake_beta)
    try:
        got = decode()
    finally:
        dec.use_fused_ops(None)
    diff = (got - want).abs()
    print(f"{dtype}: {(diff == 0).float().mean().item():.4%} of samples equal, max {diff.max().item():.3g}")
    if dtype == torch.float32:
        assert diff.max().item() <= F32_BOUND["1.7b"]
    else:
        assert diff.max().item() <= BF16_MAX and diff.pow(2).mean().sqrt().item() <= BF16_RMS


def test_captured_codec_calls_with_the_kernel_equal_eager_ones(ops):
    """The server replays CodecSlots' captured calls: the kernel's launches must be in them, on the codec's stream."""
    dec = random_decoder(torch.bfloat16, size="1.7b", device=DEV)
    dec.use_fused_ops(ops.snake_beta)
    eager, graphed = CodecSlots(dec, 2), CodecSlots(dec, 2)
    assert graphed.warm_up([2, 12], most_rows=2, capture=True) == 4
    rng = np.random.default_rng(4)
    a, b = [eager.open() for _ in range(2)], [graphed.open() for _ in range(2)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for n in (2, 12, 12, 2):
            codes = rng.integers(0, 2048, (2, n, 16))
            want, got = eager.decode(a, codes), graphed.decode(b, codes)
            stream.synchronize()
            assert torch.equal(got, want), n
