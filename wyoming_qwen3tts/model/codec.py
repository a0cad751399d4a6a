"""The 12 Hz codec decoder: codes [T,16] -> 24 kHz waveform [T*1920], in one causal pass, as a stateful stream, or
for many streams at once.

Every part of the decoder is causal (see docs §6.2), so a stream that carries the right state between calls gives
the same samples as one pass over all frames.  The state is:
  * for each causal conv, the last (k-1)*dilation input samples it has seen;
  * for each causal transposed conv, the last (k-1)//stride input samples (one, for kernel 2*stride);
  * for each pre_transformer layer, the rotated keys and values of the last sliding_window-1 positions, plus the
    absolute position of the next frame, so RoPE positions keep counting across calls.
`CodecDecoder.decode` is simply the first call of a fresh stream.  The reference instead re-decodes overlapping
300-frame chunks from scratch; up to 300 frames that is the same single pass as ours.

`CodecSlots` (codec_slots.py) holds that state for many streams, a row per stream in one preallocated tensor, and decodes a group of
equal length for several of them in one call (batch B instead of 1, the same layers and kernels), each row continuing
its own stream as a CodecStream would.

Numerics follow the reference so bf16 matches too: codebooks are embedding_sum / clamp(cluster_usage, 1e-5) done
in the model dtype, RMSNorm statistics in fp32, RoPE tables in fp32 cast to the model dtype. Two opt-ins, which the
kernel backend takes on a GPU, trade that for speed: a fused SnakeBeta (use_fused_ops: the same samples) and convs
as GEMMs where timed faster than cuDNN (use_gemm_convs: the samples differ in the last bits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from .config import CodecDecoderConfig
from .layers import rms_norm, rope_tables, rotate_half
from .weights import NamedWeights

if TYPE_CHECKING:
    from .codec_slots import SlotRows

Tensor = torch.Tensor
# What the convs keep their left contexts in: one stream's, or the rows of a batched call.
ConvState: TypeAlias = "CodecStream | SlotRows"
# A fused SnakeBeta (the kernel backend's Ops.snake_beta): (x, alpha [C], inv_beta [C], out) writes out, x and out
# [B, C, T] with unit last strides, each op rounded as torch's (CodecDecoder.use_fused_ops).
SnakeOp: TypeAlias = Callable[[Tensor, Tensor, Tensor, Tensor], None]

# Weight names in speech_tokenizer/model.safetensors all start with this; encoder.* is codec_encoder.py's.
_PREFIX = "decoder."


# --------------------------------------------------------------------------------------------------------------------
# Stream state
# --------------------------------------------------------------------------------------------------------------------


class CodecStream:
    """One audio stream through a CodecDecoder: feed it consecutive groups of frames, get consecutive samples.

    Holds all state the causal decoder needs between calls (conv left contexts, per-layer sliding-window KV, the
    RoPE position).  Not thread-safe; use one stream per utterance.  A call that raises leaves it unusable.
    """

    def __init__(self, decoder: CodecDecoder) -> None:
        self.decoder = decoder
        self.frames = 0  # frames decoded so far == RoPE position of the next frame
        # Keyed by the conv layer object: the last input samples it saw, [1, C, keep].
        self._tails: dict[object, Tensor] = {}
        # Per transformer layer: rotated keys and values of the last sliding_window-1 positions, [1, kv_heads, P, D].
        self._kv: list[tuple[Tensor, Tensor] | None] = [None] * len(decoder.layers)

    @torch.inference_mode()
    def decode(self, codes_group: Tensor) -> Tensor:
        """codes_group [n,16] int -> float32 waveform [n*1920] that continues the samples of earlier calls."""
        return self.decoder._run(codes_group, self)

    def fork(self) -> CodecStream:
        """An independent stream in this one's state, e.g. after a cloned voice's context: decode the context once,
        fork it for every request. Cheap: decoding replaces state tensors and never writes into them, so the two
        streams can share the ones they hold now."""
        other = CodecStream(self.decoder)
        other.frames = self.frames
        other._tails = dict(self._tails)
        other._kv = list(self._kv)
        return other

    def _left_context(self, layer: object, x: Tensor, keep: int, act: SnakeBeta | None = None) -> Tensor:
        """Prepend the last `keep` input samples this layer saw (zeros at the start) to act(x) and remember the
        new ones."""
        if keep == 0:
            return x if act is None else act(x)
        tail = self._tails.get(layer)
        if tail is None:
            # Zeros are exactly what the reference's left padding feeds the first frame.
            tail = x.new_zeros(x.shape[0], x.shape[1], keep)
        x = with_context(tail, x, act)
        # clone so the stored tail does not keep this call's whole activation alive.
        self._tails[layer] = x[..., x.shape[-1] - keep :].clone()
        return x


def with_context(tail: Tensor, x: Tensor, act: SnakeBeta | None) -> Tensor:
    """[tail, act(x)] along time: a conv's input after its left context. A fused act writes its output behind the
    tail in one buffer, which saves the concatenation's pass over the activation."""
    if act is None:
        return torch.cat([tail, x], dim=-1)
    if act.fused is None:
        return torch.cat([tail, act(x)], dim=-1)
    keep = tail.shape[-1]
    buf = x.new_empty(x.shape[0], x.shape[1], keep + x.shape[-1])
    buf[..., :keep].copy_(tail)
    act(x, out=buf[..., keep:])
    return buf


# --------------------------------------------------------------------------------------------------------------------
# Layers (plain tensors + functional ops)
# --------------------------------------------------------------------------------------------------------------------


class _CausalConv:
    """Conv1d, stride 1, left-padded by (k-1)*dilation so output t sees inputs <= t only."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int = 1, groups: int = 1) -> None:
        self.weight, self.bias, self.dilation, self.groups = weight, bias, dilation, groups
        # ndim != 3 only for the empty placeholder of a missing tensor (loading then fails with the full list).
        self.keep = (weight.shape[-1] - 1) * dilation if weight.ndim == 3 else 0
        self.channels = weight.shape[1] * groups if weight.ndim == 3 else 0  # input channels: the context's rows
        # The weight as [out, k * in] (tap-major) when this conv may run as one GEMM (CodecDecoder.use_gemm_convs),
        # and per input shape whether it does (timed when first met); None: always.
        self.gemm_weight: Tensor | None = None
        self.gemm_for_shape: dict[tuple[int, ...], bool] | None = None

    def __call__(self, x: Tensor, st: ConvState, act: SnakeBeta | None = None) -> Tensor:
        """The conv of act(x) (of x without act), after its left context."""
        x = st._left_context(self, x, self.keep, act)
        if self.gemm_weight is not None and self._as_gemm(x):
            return conv_as_gemm(x, self.gemm_weight, self.bias, self.weight.shape[-1], self.dilation)
        return F.conv1d(x, self.weight, self.bias, dilation=self.dilation, groups=self.groups)

    def _as_gemm(self, x: Tensor) -> bool:
        if self.gemm_for_shape is None:
            return True
        key = tuple(x.shape)
        choice = self.gemm_for_shape.get(key)
        if choice is None:
            choice = self.gemm_for_shape[key] = gemm_is_faster(self, x)
        return choice


def gemm_is_faster(conv: _CausalConv, x: Tensor, runs: int = 3) -> bool:
    """Whether conv_as_gemm runs `conv` on x faster than cuDNN (F.conv1d), timed on the current CUDA stream: the best
    of `runs` each, after one untimed run that meets both libraries' plans for the shape. Why timed and per shape:
    cuDNN's heuristic runs a few shapes on kernels 5-10x slower than the GEMM (the 768-channel convs of dilation 3
    and 9 at 16 rows, the 384-channel one of dilation 9 at every row count, on an H100), and its own timed search
    (torch.backends.cudnn.benchmark) finds nothing better, while it wins the narrow convs, where the GEMM's extra
    pass over k views costs more. A few ms for each conv and shape, once: the codec worker's warm-up meets the
    shapes of its calls before it captures them. Off the GPU (nothing to time) the GEMM."""
    if x.device.type != "cuda":
        return True
    if torch.cuda.is_current_stream_capturing():  # a capture follows an eager call of its shape, so never here
        return False
    k = conv.weight.shape[-1]
    gemm_weight = conv.gemm_weight
    assert gemm_weight is not None
    paths = (
        lambda: F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation),
        lambda: conv_as_gemm(x, gemm_weight, conv.bias, k, conv.dilation),
    )
    best = []
    for run in paths:
        run()
        times = []
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        best.append(min(times))
    return best[1] < best[0]


def conv_as_gemm(x: Tensor, gemm_weight: Tensor, bias: Tensor | None, k: int, dilation: int) -> Tensor:
    """F.conv1d(x, w, bias, dilation=dilation) for x [B, C, L] (stride 1, no padding, one group) as one batched GEMM
    on the vendor BLAS: the k taps' shifted views of x stacked along channels [B, k*C, T] times `gemm_weight` =
    w.permute(0, 2, 1) as [O, k*C] (CodecDecoder.use_gemm_convs). Why: at a few of the vocoder's dilated conv shapes
    cuDNN picks kernels without tensor cores, 5-10x slower (gemm_is_faster); a GEMM runs on tensor cores at every
    shape, for one extra pass that writes the k views. The sums run in another order than cuDNN's, so the samples
    differ in the last bits (bf16: the bias is added after the rounding)."""
    t = x.shape[-1] - (k - 1) * dilation
    cols = torch.cat([x[..., j * dilation : j * dilation + t] for j in range(k)], dim=1)
    y = torch.matmul(gemm_weight, cols)  # the weight broadcast over B: one strided batched GEMM
    return y if bias is None else y.add_(bias[:, None])


class _CausalConvTranspose:
    """ConvTranspose1d (kernel k, stride r) keeping only the first n*r outputs, as the reference trims k-r on the
    right.  Output block i then depends on inputs i-(k-1)//r .. i, so that many earlier inputs are the state."""

    def __init__(self, weight: Tensor, bias: Tensor, stride: int) -> None:
        self.weight, self.bias, self.stride = weight, bias, stride
        self.keep = (weight.shape[-1] - 1) // stride if weight.ndim == 3 else 0
        self.channels = weight.shape[0] if weight.ndim == 3 else 0

    def __call__(self, x: Tensor, st: ConvState, act: SnakeBeta | None = None) -> Tensor:
        """The transposed conv of act(x) (of x without act), after its left context."""
        n = x.shape[-1]
        x = st._left_context(self, x, self.keep, act)
        y = F.conv_transpose1d(x, self.weight, self.bias, stride=self.stride)
        # Drop the blocks that belong to the context inputs (already emitted) and the unfinished right overhang.
        return y[..., self.keep * self.stride : (self.keep + n) * self.stride]


class SnakeBeta:
    """x + sin^2(x*e^alpha) / (e^beta + 1e-9), per channel; the exps are taken once here, in the model dtype.
    With `fused` (CodecDecoder.use_fused_ops) one kernel computes it, rounding each op as torch's five do."""

    def __init__(self, alpha: Tensor, beta: Tensor) -> None:
        self.alpha = torch.exp(alpha)[:, None]
        self.inv_beta = (1.0 / (torch.exp(beta) + 1e-9))[:, None]
        self.fused: SnakeOp | None = None

    def __call__(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """act(x), into `out` when given."""
        if self.fused is None:
            y = x + self.inv_beta * torch.sin(x * self.alpha).pow(2)
            return y if out is None else out.copy_(y)
        if x.stride(-1) != 1:
            x = x.contiguous()
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.fused(x, self.alpha.view(-1), self.inv_beta.view(-1), out)
        return out


class _TransformerLayer:
    """Pre-norm block: sliding-window attention (plain RoPE, no q/k norm) and SwiGLU, each scaled by LayerScale."""

    def __init__(self, w: NamedWeights, i: int, cfg: CodecDecoderConfig) -> None:
        p = f"pre_transformer.layers.{i}."
        hd, h, kvh, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim, self.eps = h, kvh, d, cfg.rms_norm_eps
        self.in_norm = w(p + "input_layernorm.weight", (hd,))
        self.post_norm = w(p + "post_attention_layernorm.weight", (hd,))
        self.wq = w(p + "self_attn.q_proj.weight", (h * d, hd))
        self.wk = w(p + "self_attn.k_proj.weight", (kvh * d, hd))
        self.wv = w(p + "self_attn.v_proj.weight", (kvh * d, hd))
        self.wo = w(p + "self_attn.o_proj.weight", (hd, h * d))
        # The released config has attention_bias false; take biases only if a checkpoint ships them.
        self.bq, self.bk, self.bv, self.bo = (
            w(p + f"self_attn.{n}_proj.bias") if w.has(p + f"self_attn.{n}_proj.bias") else None
            for n in ("q", "k", "v", "o")
        )
        self.attn_scale = w(p + "self_attn_layer_scale.scale", (hd,))
        self.w_gate = w(p + "mlp.gate_proj.weight", (cfg.intermediate_size, hd))
        self.w_up = w(p + "mlp.up_proj.weight", (cfg.intermediate_size, hd))
        self.w_down = w(p + "mlp.down_proj.weight", (hd, cfg.intermediate_size))
        self.mlp_scale = w(p + "mlp_layer_scale.scale", (hd,))

    def __call__(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """(output, the rotated keys and values of the past and this call's positions): the caller keeps what later
        queries can still see."""
        b, t, _ = x.shape
        h = rms_norm(x, self.in_norm, self.eps)
        q = F.linear(h, self.wq, self.bq).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = F.linear(h, self.wk, self.bk).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = F.linear(h, self.wv, self.bv).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        cache = (k, v)  # before any head expansion: the stream stores kv heads only
        if self.n_heads != self.n_kv_heads:
            # Expand kv heads as the reference does whenever it passes a mask (it only uses enable_gqa without one).
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        o = F.linear(o.transpose(1, 2).reshape(b, t, -1), self.wo, self.bo)
        x = x + self.attn_scale * o
        h = rms_norm(x, self.post_norm, self.eps)
        h = F.linear(F.silu(F.linear(h, self.w_gate)) * F.linear(h, self.w_up), self.w_down)
        x = x + self.mlp_scale * h
        return x, cache


class _ConvNeXtBlock:
    """Depthwise causal conv k=7 -> LayerNorm -> Linear x4 -> exact GELU -> Linear -> *gamma, plus the input."""

    def __init__(self, w: NamedWeights, p: str, dim: int) -> None:
        self.dwconv = _CausalConv(
            w(p + "dwconv.conv.weight", (dim, 1, 7)), w(p + "dwconv.conv.bias", (dim,)), groups=dim
        )
        self.norm_w, self.norm_b = w(p + "norm.weight", (dim,)), w(p + "norm.bias", (dim,))
        self.w1, self.b1 = w(p + "pwconv1.weight", (4 * dim, dim)), w(p + "pwconv1.bias", (4 * dim,))
        self.w2, self.b2 = w(p + "pwconv2.weight", (dim, 4 * dim)), w(p + "pwconv2.bias", (dim,))
        self.gamma = w(p + "gamma", (dim,))
        self.dim = dim

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        h = self.dwconv(x, st).transpose(1, 2)
        h = F.layer_norm(h, (self.dim,), self.norm_w, self.norm_b, eps=1e-6)
        h = F.linear(F.gelu(F.linear(h, self.w1, self.b1)), self.w2, self.b2)
        return x + (self.gamma * h).transpose(1, 2)


class _ResidualUnit:
    """SnakeBeta -> causal conv k=7 (dilated) -> SnakeBeta -> conv k=1, plus the input."""

    def __init__(self, w: NamedWeights, p: str, dim: int, dilation: int) -> None:
        self.act1 = SnakeBeta(w(p + "act1.alpha", (dim,)), w(p + "act1.beta", (dim,)))
        self.conv1 = _CausalConv(w(p + "conv1.conv.weight", (dim, dim, 7)), w(p + "conv1.conv.bias", (dim,)), dilation)
        self.act2 = SnakeBeta(w(p + "act2.alpha", (dim,)), w(p + "act2.beta", (dim,)))
        self.conv2 = _CausalConv(w(p + "conv2.conv.weight", (dim, dim, 1)), w(p + "conv2.conv.bias", (dim,)))

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        return x + self.conv2(self.act2(self.conv1(x, st, self.act1)), st)


class _DecoderBlock:
    """SnakeBeta -> causal transposed conv (kernel 2r, stride r; halves channels) -> residual units, dilations 1,3,9."""

    def __init__(self, w: NamedWeights, p: str, in_dim: int, out_dim: int, rate: int) -> None:
        self.act = SnakeBeta(w(p + "block.0.alpha", (in_dim,)), w(p + "block.0.beta", (in_dim,)))
        self.up = _CausalConvTranspose(
            w(p + "block.1.conv.weight", (in_dim, out_dim, 2 * rate)), w(p + "block.1.conv.bias", (out_dim,)), rate
        )
        self.units = [_ResidualUnit(w, p + f"block.{2 + j}.", out_dim, dil) for j, dil in enumerate((1, 3, 9))]

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        x = self.up(x, st, self.act)
        for unit in self.units:
            x = unit(x, st)
        return x


# --------------------------------------------------------------------------------------------------------------------
# The decoder
# --------------------------------------------------------------------------------------------------------------------


class CodecDecoder:
    """Qwen3-TTS-Tokenizer-12Hz decoder (inference only).  Build with `from_tensors`."""

    def __init__(self, cfg: CodecDecoderConfig, w: NamedWeights) -> None:
        self.cfg = cfg
        self.dtype, self.device = w.dtype, w.device
        self.samples_per_frame = cfg.samples_per_frame
        nq, cb_size, cb_dim = cfg.num_quantizers, cfg.codebook_size, cfg.codebook_dim // 2

        # 1. Split RVQ: codebook 0 and codebooks 1..15 each have their own 1x1 output projection.
        self.codebooks: list[Tensor] = []
        for q in range(nq):
            p = f"quantizer.rvq_first.vq.layers.{q}." if q == 0 else f"quantizer.rvq_rest.vq.layers.{q - 1}."
            emb = w(p + "_codebook.embedding_sum", (cb_size, cb_dim))
            usage = w(p + "_codebook.cluster_usage", (cb_size,))
            self.codebooks.append(emb / usage.clamp(min=1e-5)[:, None])
        self.proj_first = w("quantizer.rvq_first.output_proj.weight", (cfg.codebook_dim, cb_dim, 1))
        self.proj_rest = w("quantizer.rvq_rest.output_proj.weight", (cfg.codebook_dim, cb_dim, 1))

        # 2. pre_conv.
        latent = cfg.latent_dim
        self.pre_conv = _CausalConv(
            w("pre_conv.conv.weight", (latent, cfg.codebook_dim, 3)), w("pre_conv.conv.bias", (latent,))
        )

        # 3. pre_transformer.
        hd = cfg.hidden_size
        self.in_proj = w("pre_transformer.input_proj.weight", (hd, latent))
        self.in_proj_b = w("pre_transformer.input_proj.bias", (hd,))
        self.layers = [_TransformerLayer(w, i, cfg) for i in range(cfg.num_hidden_layers)]
        self.final_norm = w("pre_transformer.norm.weight", (hd,))
        self.out_proj = w("pre_transformer.output_proj.weight", (latent, hd))
        self.out_proj_b = w("pre_transformer.output_proj.bias", (latent,))

        # 4. Upsample stages: transposed conv (kernel = stride) + ConvNeXt block.
        self.upsample: list[tuple[_CausalConvTranspose, _ConvNeXtBlock]] = []
        for i, r in enumerate(cfg.upsampling_ratios):
            p = f"upsample.{i}."
            conv = _CausalConvTranspose(w(p + "0.conv.weight", (latent, latent, r)), w(p + "0.conv.bias", (latent,)), r)
            self.upsample.append((conv, _ConvNeXtBlock(w, p + "1.", latent)))

        # 5-7. Vocoder: conv in, four upsampling blocks halving channels, SnakeBeta, conv out to one channel.
        dd = cfg.decoder_dim
        self.conv_in = _CausalConv(w("decoder.0.conv.weight", (dd, latent, 7)), w("decoder.0.conv.bias", (dd,)))
        self.blocks = [
            _DecoderBlock(w, f"decoder.{1 + i}.", dd >> i, dd >> (i + 1), r) for i, r in enumerate(cfg.upsample_rates)
        ]
        n = len(cfg.upsample_rates)
        out_dim = dd >> n
        self.act_out = SnakeBeta(w(f"decoder.{1 + n}.alpha", (out_dim,)), w(f"decoder.{1 + n}.beta", (out_dim,)))
        self.conv_out = _CausalConv(
            w(f"decoder.{2 + n}.conv.weight", (1, out_dim, 7)), w(f"decoder.{2 + n}.conv.bias", (1,))
        )

    @classmethod
    def from_tensors(
        cls,
        cfg: CodecDecoderConfig,
        tensors: dict[str, Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> CodecDecoder:
        """Build from the full state dict of speech_tokenizer/model.safetensors (original key names).

        Raises ModelLoadError naming every missing or misshapen decoder tensor.
        """
        if cfg.decoder_dim % (1 << len(cfg.upsample_rates)):
            raise ModelLoadError(
                f"codec decoder_dim {cfg.decoder_dim} cannot be halved {len(cfg.upsample_rates)} times"
            )
        w = NamedWeights(tensors, dtype, torch.device(device), prefix=_PREFIX, what="speech_tokenizer (codec decoder)")
        with torch.inference_mode():
            decoder = cls(cfg, w)
        w.check()
        return decoder

    def new_stream(self, context: Tensor | None = None) -> CodecStream:
        """A fresh stream. With `context` codes [T,16] it starts after them: their audio is decoded and dropped, so
        the next frames sound as the continuation of that audio. In-context cloning decodes its generated codes
        after the reference clip's codes this way, as the reference does (it decodes both and cuts the clip's part)."""
        stream = CodecStream(self)
        if context is not None and context.shape[0] > 0:
            stream.decode(context)
        return stream

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [T,16] int -> float32 waveform [T*1920] in [-1,1]: one causal pass over all frames (exact, no chunk
        seams).  Activations grow with T; for long audio prefer a stream."""
        return self._run(codes, CodecStream(self))

    # ----------------------------------------------------------------------------------------------------------------

    def _run(self, codes: Tensor, st: CodecStream) -> Tensor:
        if codes.ndim != 2 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(
                f"codec expects codes of shape [frames, {self.cfg.num_quantizers}], got {tuple(codes.shape)}"
            )
        n = codes.shape[0]
        if n == 0:
            return torch.zeros(0, dtype=torch.float32, device=self.device)
        codes = codes.to(device=self.device, dtype=torch.long)

        # 1-2. Dequantize, pre_conv.
        x = self.pre_conv(self._dequantize(codes[None]), st)
        # 3.
        x = self._transformer(x.transpose(1, 2), st).transpose(1, 2)  # [1, latent, n]
        wav = self._upsample_and_vocode(x, st)
        st.frames += n
        return wav[0, 0].float()

    def _dequantize(self, codes: Tensor) -> Tensor:
        """codes [B, n, 16] -> [B, codebook_dim, n]; the sums run in the reference's order so bf16 rounding matches."""
        first = F.embedding(codes[:, :, 0], self.codebooks[0]).transpose(1, 2)
        rest = F.embedding(codes[:, :, 1], self.codebooks[1])
        for q in range(2, len(self.codebooks)):
            rest = rest + F.embedding(codes[:, :, q], self.codebooks[q])
        return F.conv1d(first, self.proj_first) + F.conv1d(rest.transpose(1, 2), self.proj_rest)

    def _upsample_and_vocode(self, x: Tensor, st: ConvState) -> Tensor:
        """Steps 4-7: latents [B, latent, n] -> clamped waveform [B, 1, n*1920] in the model dtype."""
        for conv, block in self.upsample:
            x = block(conv(x, st), st)
        x = self.conv_in(x, st)
        for blk in self.blocks:
            x = blk(x, st)
        return self.conv_out(x, st, self.act_out).clamp(-1.0, 1.0)

    def _activations(self) -> list[SnakeBeta]:
        acts = [self.act_out]
        for blk in self.blocks:
            acts.append(blk.act)
            for unit in blk.units:
                acts += [unit.act1, unit.act2]
        return acts

    def use_fused_ops(self, snake: SnakeOp | None) -> None:
        """Run every SnakeBeta on `snake` (the kernel backend's fused kernel: one pass where torch's ops make ~11,
        and written behind the conv's left context, no concatenation), or on torch's ops again (None). The same
        samples either way: the kernel rounds each op as torch does. Before CodecSlots captures its calls."""
        for act in self._activations():
            act.fused = snake

    def use_gemm_convs(self, min_channels: int, timed: bool = False) -> list[str]:
        """Let every conv of kernel > 1 with at least `min_channels` input channels run as one GEMM (conv_as_gemm):
        always, or with `timed` at each input shape where it is the faster (gemm_is_faster, timed when the shape is
        first met); the others on F.conv1d again; 0: none. The output conv (one channel out) stays a conv: a GEMM of
        one row wastes its tiles. Before CodecSlots captures its calls. Returns the convs' shapes as "in->out k
        dilation", for the log."""
        picked = []
        for conv in self._plain_convs():
            out_ch, in_ch, k = conv.weight.shape
            on = min_channels > 0 and conv.groups == 1 and k > 1 and in_ch >= min_channels and out_ch >= 8
            conv.gemm_weight = conv.weight.permute(0, 2, 1).reshape(out_ch, k * in_ch).contiguous() if on else None
            conv.gemm_for_shape = {} if on and timed else None
            if on:
                picked.append(f"{in_ch}->{out_ch} k{k} d{conv.dilation}")
        return picked

    def gemm_conv_shapes(self) -> tuple[int, int]:
        """(conv input shapes that run as GEMMs, shapes timed in all) of use_gemm_convs(timed=True), for the log."""
        chosen = [choice for conv in self._plain_convs() for choice in (conv.gemm_for_shape or {}).values()]
        return sum(chosen), len(chosen)

    def _plain_convs(self) -> list[_CausalConv]:
        """Every conv of kernel > 1 but the transposed ones (those with a left context), in the order a decode runs
        them."""
        return [conv for conv in self._stateful_convs() if isinstance(conv, _CausalConv)]

    def _stateful_convs(self) -> list[_CausalConv | _CausalConvTranspose]:
        """Every conv that keeps a left context between calls, in the order a decode runs them."""
        convs: list[_CausalConv | _CausalConvTranspose] = [self.pre_conv]
        for conv, block in self.upsample:
            convs += [conv, block.dwconv]
        convs.append(self.conv_in)
        for blk in self.blocks:
            convs.append(blk.up)
            for unit in blk.units:
                convs += [unit.conv1, unit.conv2]
        convs.append(self.conv_out)
        return [conv for conv in convs if conv.keep > 0]

    def _transformer(self, x: Tensor, st: CodecStream) -> Tensor:
        """x [1, n, latent] -> [1, n, latent], attending to this call's frames and the cached window before them."""
        n = x.shape[1]
        window = self.cfg.sliding_window
        p0 = st.frames
        past = 0 if st._kv[0] is None else st._kv[0][0].shape[2]

        pos = torch.arange(p0, p0 + n, device=self.device)
        cos, sin = rope_tables(pos, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)

        # A key at position k is visible to the query at q iff q - window < k <= q.
        kpos = torch.arange(p0 - past, p0 + n, device=self.device)
        mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - window)

        h = F.linear(x, self.in_proj, self.in_proj_b)
        for i, layer in enumerate(self.layers):
            h, (k, v) = layer(h, cos, sin, mask, st._kv[i])
            # Only the last window-1 positions can still be seen by later queries.
            start = max(k.shape[2] - (window - 1), 0)
            st._kv[i] = (k[:, :, start:].clone(), v[:, :, start:].clone())
        h = rms_norm(h, self.final_norm, self.cfg.rms_norm_eps)
        return F.linear(h, self.out_proj, self.out_proj_b)


def int16_samples(wave: torch.Tensor) -> torch.Tensor:
    """Float waveform in [-1, 1] -> int16 samples, on the waveform's device."""
    return (wave.float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)


def samples_to_pcm(samples: torch.Tensor, stream: torch.cuda.Stream | None = None) -> bytes:
    """int16 samples -> s16le bytes; on a GPU the copy waits for `stream` only (the codec's)."""
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        return samples.cpu().numpy().astype("<i2").tobytes()
