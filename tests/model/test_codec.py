"""Codec decoder: our torch decoder against the reference Qwen3TTSTokenizerV2Model (tiny, random weights), and our
stateful streaming decode against our own full decode."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from wyoming_qwen3tts.errors import ModelLoadError
from wyoming_qwen3tts.model.codec import CodecDecoder
from wyoming_qwen3tts.model.config import CodecDecoderConfig

ref_cfg_mod = pytest.importorskip("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
ref_model_mod = pytest.importorskip("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")

SPF = 1920  # samples per frame

# Tiny geometry; everything that shapes the data flow (16 quantizers, 2048 codes, window 72, the upsample rates)
# stays as released.  num_key_value_heads 1 < heads 2 exercises grouped-query attention too.
DECODER = dict(
    hidden_size=32,
    latent_dim=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    decoder_dim=32,
    codebook_dim=32,
    codebook_size=2048,
    num_quantizers=16,
    sliding_window=72,
    upsample_rates=[8, 5, 4, 3],
    upsampling_ratios=[2, 2],
    rms_norm_eps=1e-5,
    rope_theta=10000,
)
# The encoder is built by the reference class but never used; keep it small.
ENCODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    codebook_dim=32,
    num_filters=4,
    num_quantizers=16,
    num_residual_layers=1,
    vector_quantization_hidden_dimension=32,
    upsample_groups=32,
)


def _randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Replace the init values (many are 0 or 1, which would hide mistakes) by random ones of a realistic size."""

    def normal(p: torch.Tensor, mean: float, std: float) -> torch.Tensor:
        return mean + std * torch.randn(p.shape, generator=gen)

    for name, p in model.decoder.named_parameters():
        if name.endswith("cluster_usage"):
            new = 0.5 + 1.5 * torch.rand(p.shape, generator=gen)
        elif name.endswith("embedding_sum"):
            new = normal(p, 0.0, 1.0)
        elif name.endswith((".alpha", ".beta")):  # SnakeBeta, log scale
            new = normal(p, 0.0, 0.3)
        elif name.endswith(("layernorm.weight", "norm.weight")):
            new = normal(p, 1.0, 0.1)
        elif name.endswith(("layer_scale.scale", ".gamma")):
            new = 0.1 + 0.3 * torch.rand(p.shape, generator=gen)
        elif name.endswith(".bias"):
            new = normal(p, 0.0, 0.05)
        else:  # weight matrices and conv kernels: ~unit gain so 30 layers neither vanish nor saturate
            if "upsample" in name and name.endswith("0.conv.weight") or ".block.1.conv.weight" in name:
                fan_in = p.shape[0]  # transposed conv [in, out, k]: each output sums in_channels terms (k/stride=2)
            else:
                fan_in = p[0].numel()
            new = normal(p, 0.0, min(0.1, max(0.02, 1.0 / math.sqrt(fan_in))))
        with torch.no_grad():
            p.copy_(new)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, CodecDecoderConfig, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    cfg = ref_cfg_mod.Qwen3TTSTokenizerV2Config(encoder_config=ENCODER, decoder_config=DECODER)
    ref = ref_model_mod.Qwen3TTSTokenizerV2Model(cfg).eval()
    _randomize(ref, torch.Generator().manual_seed(1234))
    ours_cfg = CodecDecoderConfig.from_dict({"model_type": "qwen3_tts_tokenizer_12hz", "decoder_config": DECODER})
    tensors = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    return ref, ours_cfg, tensors


@pytest.fixture(scope="module")
def decoder(tiny) -> CodecDecoder:
    _, cfg, tensors = tiny
    return CodecDecoder.from_tensors(cfg, tensors)


def _codes(t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (t, 16), generator=torch.Generator().manual_seed(seed))


def _ref_decode(ref: torch.nn.Module, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return ref.decode(codes[None]).audio_values[0]


def test_output_is_not_degenerate(tiny, decoder):
    wav = decoder.decode(_codes(50, 0))
    assert wav.dtype == torch.float32
    assert wav.std() > 0.02  # the random weights must produce a real signal ...
    assert (wav.abs() >= 1.0).float().mean() < 0.05  # ... that is not stuck at the clamp


@pytest.mark.parametrize("frames", [1, 7, 100, 300])
def test_full_decode_matches_reference(tiny, decoder, frames):
    ref, _, _ = tiny
    codes = _codes(frames, frames)
    expected = _ref_decode(ref, codes)
    got = decoder.decode(codes)
    assert got.shape == (frames * SPF,) == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff <= 1e-4, diff


def test_sliding_window_matters(tiny):
    """Guard for the comparison above: with these weights a wider attention window visibly changes the output, so
    matching the reference at 100 and 300 frames really checks the 72-position window."""
    ref, _, _ = tiny
    codes = _codes(120, 5)
    expected = _ref_decode(ref, codes)
    layers = ref.decoder.pre_transformer.layers
    try:
        ref.decoder.config.sliding_window = 200
        for layer in layers:
            layer.self_attn.sliding_window = 200
        wide = _ref_decode(ref, codes)
    finally:
        ref.decoder.config.sliding_window = 72
        for layer in layers:
            layer.self_attn.sliding_window = 72
    assert (wide - expected).abs().max() > 1e-3


def test_bf16_matches_reference_bf16(tiny):
    """Dtype handling as in the reference (codebook division in the model dtype, fp32 norm statistics and RoPE
    tables): in bf16 we agree with the reference far below bf16's own error (~1e-2 against fp32)."""
    ref, cfg, tensors = tiny
    ref_bf16 = copy.deepcopy(ref).to(torch.bfloat16)
    rotary = ref_bf16.decoder.pre_transformer.rotary_emb
    # Module.to() also rounds the RoPE inv_freq buffer; from_pretrained(dtype=bf16) leaves it fp32.  Undo it.
    rotary.inv_freq = rotary.original_inv_freq.float()
    codes = _codes(40, 6)
    expected = _ref_decode(ref_bf16, codes).float()
    got = CodecDecoder.from_tensors(cfg, tensors, dtype=torch.bfloat16).decode(codes)
    assert got.dtype == torch.float32 and got.shape == (40 * SPF,)
    fp32 = _ref_decode(ref, codes)
    assert (expected - fp32).abs().max() > 2e-3  # bf16 really rounds here ...
    assert (got - expected).abs().max().item() <= 1e-3  # ... and we round the same way


def _stream(decoder: CodecDecoder, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    stream = decoder.new_stream()
    out, start = [], 0
    for n in sizes:
        piece = stream.decode(codes[start : start + n])
        assert piece.shape == (min(n, codes.shape[0] - start) * SPF,)
        out.append(piece)
        start += n
    assert start >= codes.shape[0]
    assert stream.frames == codes.shape[0]
    return torch.cat(out)


@pytest.mark.parametrize("group", [1, 2, 3, 5, 8, 25])
def test_stream_matches_full_decode(decoder, group):
    codes = _codes(160, 77)
    full = decoder.decode(codes)
    streamed = _stream(decoder, codes, [group] * math.ceil(160 / group))
    assert streamed.shape == full.shape == (160 * SPF,)
    diff = (streamed - full).abs().max().item()
    assert diff <= 1e-5, diff


def test_stream_uneven_groups(decoder):
    codes = _codes(170, 78)
    sizes = [1, 4, 2, 30, 1, 1, 9, 71, 3, 48]
    assert sum(sizes) == 170
    diff = (_stream(decoder, codes, sizes) - decoder.decode(codes)).abs().max().item()
    assert diff <= 1e-5, diff


def test_long_stream_has_no_seams(tiny, decoder):
    """400 frames: beyond the reference's 300-frame single pass.  Our stream equals our full decode everywhere, and
    (causality) the first 300 frames equal the reference's single pass over those 300 frames."""
    ref, _, _ = tiny
    codes = _codes(400, 79)
    full = decoder.decode(codes)
    assert full.shape == (400 * SPF,)
    diff = (_stream(decoder, codes, [6] * 67) - full).abs().max().item()
    assert diff <= 1e-5, diff
    head = _ref_decode(ref, codes[:300])
    assert (full[: 300 * SPF] - head).abs().max().item() <= 1e-4


def test_empty_group_keeps_state(decoder):
    codes = _codes(20, 80)
    stream = decoder.new_stream()
    a = stream.decode(codes[:10])
    assert stream.decode(codes[:0]).shape == (0,)
    b = stream.decode(codes[10:])
    assert (torch.cat([a, b]) - decoder.decode(codes)).abs().max().item() <= 1e-5


def test_bad_code_shape(decoder):
    with pytest.raises(ValueError, match="16"):
        decoder.decode(torch.zeros(4, 8, dtype=torch.long))


def test_missing_and_misshapen_tensors(tiny):
    _, cfg, tensors = tiny
    broken = dict(tensors)
    del broken["decoder.pre_transformer.layers.1.mlp.up_proj.weight"]
    del broken["decoder.decoder.2.block.3.conv1.conv.bias"]
    broken["decoder.pre_conv.conv.weight"] = torch.zeros(64, 32, 5)
    with pytest.raises(ModelLoadError) as err:
        CodecDecoder.from_tensors(cfg, broken)
    msg = str(err.value)
    assert "decoder.pre_transformer.layers.1.mlp.up_proj.weight" in msg
    assert "decoder.decoder.2.block.3.conv1.conv.bias" in msg
    assert "decoder.pre_conv.conv.weight" in msg and "(64, 32, 5)" in msg


def test_encoder_keys_ignored(tiny):
    _, cfg, tensors = tiny
    only_decoder = {k: v for k, v in tensors.items() if k.startswith("decoder.")}
    assert len(only_decoder) < len(tensors)
    dec = CodecDecoder.from_tensors(cfg, only_decoder)
    codes = _codes(3, 81)
    assert dec.decode(codes).shape == (3 * SPF,)


def _decode_as_stream_and_slots(dec: CodecDecoder, codes: list[torch.Tensor]) -> torch.Tensor:
    """The groups `codes` through a fresh stream, then (with each group's frames reversed as a second row) through
    fresh slots: all samples in one tensor."""
    from wyoming_qwen3tts.model.codec_slots import CodecSlots

    stream = dec.new_stream()
    slots = CodecSlots(dec, 2)
    ids = [slots.open(), slots.open()]
    waves = [stream.decode(c) for c in codes]
    waves += [slots.decode(ids, torch.stack([c, c.flip(0)]).numpy()).flatten() for c in codes]
    return torch.cat(waves)


def test_a_fused_activation_is_plumbed_where_torch_ops_were(tiny):
    """use_fused_ops with a stand-in for the kernel (torch's own ops, written into `out`): every SnakeBeta runs on
    it, the ones before a conv write behind its left context in one buffer, and a stream and slots decode the same
    samples as on torch's ops, bit for bit; None puts torch's ops back."""
    _, cfg, tensors = tiny
    dec = CodecDecoder.from_tensors(cfg, tensors)
    codes = [_codes(n, seed=n) for n in (1, 3, 5)]

    def decode() -> torch.Tensor:
        return _decode_as_stream_and_slots(dec, codes)

    calls: list[tuple[int, int]] = []  # (out's channel stride, its length): a stride above it is a context buffer

    def stand_in(x, alpha, inv_beta, out):
        assert alpha.shape == inv_beta.shape == (x.shape[1],) and out.shape == x.shape and x.stride(-1) == 1
        calls.append((out.stride(1), out.shape[-1]))
        out.copy_(x + inv_beta[:, None] * torch.sin(x * alpha[:, None]).pow(2))

    want = decode()
    dec.use_fused_ops(stand_in)
    got = decode()
    assert torch.equal(got, want)
    acts = 1 + 7 * len(cfg.upsample_rates)  # the output's, and each block's: its own and two in each of 3 units
    assert len(calls) == acts * len(codes) * 2
    # Those before a conv with a left context (each block's own and its units' first: 4 a block, and the output's)
    # wrote behind it in that conv's input buffer; the units' second feed a 1-wide conv and wrote a tensor of their own.
    behind = sum(1 for stride, length in calls if stride > length)
    assert behind == (1 + 4 * len(cfg.upsample_rates)) * len(codes) * 2
    dec.use_fused_ops(None)
    calls.clear()
    assert torch.equal(decode(), want) and not calls


@pytest.mark.parametrize("dilation", [1, 3, 9])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_as_gemm_is_the_conv(dilation, bias):
    """conv_as_gemm with the weight as use_gemm_convs lays it out computes F.conv1d's output (float32, CPU)."""
    from wyoming_qwen3tts.model.codec import conv_as_gemm

    gen = torch.Generator().manual_seed(dilation)
    w = torch.randn(24, 16, 7, generator=gen)
    b = torch.randn(24, generator=gen) if bias else None
    x = torch.randn(3, 16, 6 * dilation + 40, generator=gen)
    got = conv_as_gemm(x, w.permute(0, 2, 1).reshape(24, 7 * 16).contiguous(), b, 7, dilation)
    want = torch.nn.functional.conv1d(x, w, b, dilation=dilation)
    assert got.shape == want.shape == (3, 24, 40)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemm_convs_decode_as_the_convs(tiny):
    """use_gemm_convs(N): the convs of kernel > 1 with >= N input channels run as GEMMs (not the output conv, one
    channel out, nor the ConvNeXt's depthwise ones); a stream and slots then decode what the convs decode to
    float32 rounding, and 0 puts F.conv1d back, bit for bit."""
    _, cfg, tensors = tiny
    dec = CodecDecoder.from_tensors(cfg, tensors)
    codes = [_codes(n, seed=n) for n in (1, 3, 5)]

    def decode() -> torch.Tensor:
        return _decode_as_stream_and_slots(dec, codes)

    want = decode()
    picked = dec.use_gemm_convs(1)
    # pre_conv, conv_in and each block's three dilated convs whose 8 or more channels out (tiny: 16, 8, 4, 2).
    dd = cfg.decoder_dim
    blocks = sum(1 for i in range(len(cfg.upsample_rates)) if dd >> (i + 1) >= 8)
    assert len(picked) == 2 + 3 * blocks, picked
    assert any(p.endswith("d9") for p in picked) and not any(p.endswith("->1 k7 d1") for p in picked)
    got = decode()
    assert not torch.equal(got, want)  # another order of sums: the GEMMs ran
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert dec.use_gemm_convs(128) == []
    assert torch.equal(decode(), want)


def test_timed_gemm_convs_choose_per_input_shape(tiny, monkeypatch):
    """use_gemm_convs(N, timed=True): each candidate conv asks gemm_is_faster once per input shape it meets (here a
    stand-in that picks the GEMM for dilation 9 only) and runs that path at that shape from then on; the samples
    equal the convs' to float32 rounding, and gemm_conv_shapes counts the choices."""
    from wyoming_qwen3tts.model import codec

    _, cfg, tensors = tiny
    dec = CodecDecoder.from_tensors(cfg, tensors)
    codes = [_codes(n, seed=n) for n in (1, 3, 3)]
    want = _decode_as_stream_and_slots(dec, codes)
    asked: list[tuple[int, tuple[int, ...]]] = []

    def stand_in(conv, x):
        asked.append((conv.dilation, tuple(x.shape)))
        return conv.dilation == 9

    monkeypatch.setattr(codec, "gemm_is_faster", stand_in)
    gemm_calls: list[int] = []
    real = codec.conv_as_gemm
    monkeypatch.setattr(codec, "conv_as_gemm", lambda x, w, b, k, d: gemm_calls.append(d) or real(x, w, b, k, d))
    picked = dec.use_gemm_convs(1, timed=True)
    got = _decode_as_stream_and_slots(dec, codes)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert gemm_calls and set(gemm_calls) == {9}
    # Once per conv and shape: the stream's groups of 1 and 3 frames (the second 3 met again) and the slots' 2 rows.
    assert len(asked) == len(set(asked)) == len(picked) * 4
    as_gemm, timed = dec.gemm_conv_shapes()
    assert timed == len(asked) and as_gemm == sum(1 for d, _ in asked if d == 9) > 0
    asked.clear()
    _decode_as_stream_and_slots(dec, codes)
    assert not asked  # every shape already chosen
