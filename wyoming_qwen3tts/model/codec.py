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

`CodecSlots` holds that state for many streams, a row per stream in one preallocated tensor, and decodes a group of
equal length for several of them in one call (batch B instead of 1, the same layers and kernels), each row continuing
its own stream as a CodecStream would.

Numerics follow the reference so bf16 matches too: codebooks are embedding_sum / clamp(cluster_usage, 1e-5) done
in the model dtype, RMSNorm statistics in fp32, RoPE tables in fp32 cast to the model dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from .config import CodecDecoderConfig
from .layers import rms_norm, rope_tables, rotate_half
from .weights import NamedWeights

Tensor = torch.Tensor
# What the convs keep their left contexts in: one stream's, or the rows of a batched call.
ConvState: TypeAlias = "CodecStream | _SlotRows"

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

    def __init__(self, decoder: "CodecDecoder") -> None:
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

    def fork(self) -> "CodecStream":
        """An independent stream in this one's state, e.g. after a cloned voice's context: decode the context once,
        fork it for every request. Cheap: decoding replaces state tensors and never writes into them, so the two
        streams can share the ones they hold now."""
        other = CodecStream(self.decoder)
        other.frames = self.frames
        other._tails = dict(self._tails)
        other._kv = list(self._kv)
        return other

    def _left_context(self, layer: object, x: Tensor, keep: int) -> Tensor:
        """Prepend the last `keep` input samples this layer saw (zeros at the start) and remember the new ones."""
        if keep == 0:
            return x
        tail = self._tails.get(layer)
        if tail is None:
            # Zeros are exactly what the reference's left padding feeds the first frame.
            tail = x.new_zeros(x.shape[0], x.shape[1], keep)
        x = torch.cat([tail, x], dim=-1)
        # clone so the stored tail does not keep this call's whole activation alive.
        self._tails[layer] = x[..., x.shape[-1] - keep :].clone()
        return x


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

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        x = st._left_context(self, x, self.keep)
        return F.conv1d(x, self.weight, self.bias, dilation=self.dilation, groups=self.groups)


class _CausalConvTranspose:
    """ConvTranspose1d (kernel k, stride r) keeping only the first n*r outputs, as the reference trims k-r on the
    right.  Output block i then depends on inputs i-(k-1)//r .. i, so that many earlier inputs are the state."""

    def __init__(self, weight: Tensor, bias: Tensor, stride: int) -> None:
        self.weight, self.bias, self.stride = weight, bias, stride
        self.keep = (weight.shape[-1] - 1) // stride if weight.ndim == 3 else 0
        self.channels = weight.shape[0] if weight.ndim == 3 else 0

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        n = x.shape[-1]
        x = st._left_context(self, x, self.keep)
        y = F.conv_transpose1d(x, self.weight, self.bias, stride=self.stride)
        # Drop the blocks that belong to the context inputs (already emitted) and the unfinished right overhang.
        return y[..., self.keep * self.stride : (self.keep + n) * self.stride]


class _SnakeBeta:
    """x + sin^2(x*e^alpha) / (e^beta + 1e-9), per channel; the exps are taken once here, in the model dtype."""

    def __init__(self, alpha: Tensor, beta: Tensor) -> None:
        self.alpha = torch.exp(alpha)[:, None]
        self.inv_beta = (1.0 / (torch.exp(beta) + 1e-9))[:, None]

    def __call__(self, x: Tensor) -> Tensor:
        return x + self.inv_beta * torch.sin(x * self.alpha).pow(2)


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
        self.act1 = _SnakeBeta(w(p + "act1.alpha", (dim,)), w(p + "act1.beta", (dim,)))
        self.conv1 = _CausalConv(w(p + "conv1.conv.weight", (dim, dim, 7)), w(p + "conv1.conv.bias", (dim,)), dilation)
        self.act2 = _SnakeBeta(w(p + "act2.alpha", (dim,)), w(p + "act2.beta", (dim,)))
        self.conv2 = _CausalConv(w(p + "conv2.conv.weight", (dim, dim, 1)), w(p + "conv2.conv.bias", (dim,)))

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), st)), st)


class _DecoderBlock:
    """SnakeBeta -> causal transposed conv (kernel 2r, stride r; halves channels) -> residual units, dilations 1,3,9."""

    def __init__(self, w: NamedWeights, p: str, in_dim: int, out_dim: int, rate: int) -> None:
        self.act = _SnakeBeta(w(p + "block.0.alpha", (in_dim,)), w(p + "block.0.beta", (in_dim,)))
        self.up = _CausalConvTranspose(
            w(p + "block.1.conv.weight", (in_dim, out_dim, 2 * rate)), w(p + "block.1.conv.bias", (out_dim,)), rate
        )
        self.units = [_ResidualUnit(w, p + f"block.{2 + j}.", out_dim, dil) for j, dil in enumerate((1, 3, 9))]

    def __call__(self, x: Tensor, st: ConvState) -> Tensor:
        x = self.up(self.act(x), st)
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
        self.act_out = _SnakeBeta(w(f"decoder.{1 + n}.alpha", (out_dim,)), w(f"decoder.{1 + n}.beta", (out_dim,)))
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
    ) -> "CodecDecoder":
        """Build from the full state dict of speech_tokenizer/model.safetensors (original key names).

        Raises ModelLoadError naming every missing or misshapen decoder tensor.
        """
        if cfg.decoder_dim % (1 << len(cfg.upsample_rates)):
            raise ModelLoadError(
                f"codec decoder_dim {cfg.decoder_dim} cannot be halved {len(cfg.upsample_rates)} times"
            )
        w = NamedWeights(
            tensors, dtype, torch.device(device), prefix=_PREFIX, what="speech_tokenizer (codec decoder)"
        )
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
        return self.conv_out(self.act_out(x), st).clamp(-1.0, 1.0)

    def _stateful_convs(self) -> list["_CausalConv | _CausalConvTranspose"]:
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


# --------------------------------------------------------------------------------------------------------------------
# Many streams at once
# --------------------------------------------------------------------------------------------------------------------


class CodecSlots:
    """Many streams through one CodecDecoder: their state in one preallocated tensor, a row (slot) per stream.

    `open` takes a slot (fresh, or in a CodecStream's state: a cloned voice's context), `decode` continues several
    slots by a group of n frames each in one call, `close` gives the slot back.  A row holds, flattened side by side,
    every stateful conv's left context [channels, keep] and every transformer layer's rotated keys and values
    [kv_heads, window-1, head_dim].  The cache always spans window-1 positions, zeros masked out until a stream has
    that many, so rows at different positions stack.  A call gathers its rows once (index_select), the layers read
    and rewrite their parts of that copy as they do a CodecStream's, and one index_copy_ puts them back: two launches
    for the state whatever the batch.  Rows decode as they would alone (row-independent ops), up to the rounding of
    batched kernels.  Not thread-safe: one thread decodes.  A call that raises before its last launch leaves its
    slots as they were.
    """

    def __init__(self, decoder: CodecDecoder, slots: int) -> None:
        self.decoder = decoder
        cfg = decoder.cfg
        self.keep = cfg.sliding_window - 1  # cached positions a layer keeps
        self._kv_shape = (cfg.num_key_value_heads, self.keep, cfg.head_dim)
        self._convs: dict[object, tuple[int, int, int]] = {}  # conv layer -> (offset in a row, channels, keep)
        width = 0
        for conv in decoder._stateful_convs():
            self._convs[conv] = (width, conv.channels, conv.keep)
            width += conv.channels * conv.keep
        kv = cfg.num_key_value_heads * self.keep * cfg.head_dim
        self._kv = [(width + 2 * i * kv, width + (2 * i + 1) * kv) for i in range(len(decoder.layers))]  # K, V offsets
        self._kv_size = kv
        self.width = width + 2 * kv * len(decoder.layers)
        # One row more than the slots: the padding rows of a call write their state there, never read.
        self.state = torch.zeros(slots + 1, self.width, dtype=decoder.dtype, device=decoder.device)
        self.frames = [0] * slots  # per slot: frames decoded == RoPE position of its next frame
        self._free = list(range(slots))
        # Captured calls, by (padded batch, frames): a replay is one launch where an eager call issues ~670 small
        # kernels from Python, contending for the GIL with the scheduler and the request threads.
        self._graphs: dict[tuple[int, int], _CodecGraph] = {}
        self._pool: tuple[int, int] | None = None

    @property
    def capacity(self) -> int:
        return self.state.shape[0] - 1

    @property
    def _spare(self) -> int:
        """The row the padding rows of a call write to."""
        return self.state.shape[0] - 1

    @property
    def graphs(self) -> int:
        """Call shapes captured (capture())."""
        return len(self._graphs)

    def in_use(self) -> int:
        return self.capacity - len(self._free)

    @torch.inference_mode()
    def open(self, start: CodecStream | None = None) -> int:
        """A slot for a new stream, fresh or in `start`'s state; with every slot taken the state grows (doubles)."""
        if not self._free:
            grown = self.capacity
            self.state = torch.cat([self.state[:grown], torch.zeros_like(self.state)])
            self.frames += [0] * grown
            self._free = list(range(grown, 2 * grown))
            self._graphs.clear()  # they read and write the old tensor; calls run eagerly until captured again
        slot = self._free.pop(0)
        row = self.state[slot]
        row.zero_()
        self.frames[slot] = 0
        if start is not None:
            self._load(row, start)
            self.frames[slot] = start.frames
        return slot

    def close(self, slot: int) -> None:
        """Give a slot back (its row is cleared when it is opened again)."""
        self._free.append(slot)

    def _load(self, row: Tensor, start: CodecStream) -> None:
        for conv, (off, channels, keep) in self._convs.items():
            tail = start._tails.get(conv)
            if tail is not None:
                row[off : off + channels * keep].view(channels, keep).copy_(tail[0])
        for (k_off, v_off), past in zip(self._kv, start._kv):
            if past is not None:  # a stream keeps its last min(frames, keep) positions: they end the window
                held = past[0].shape[2]
                row[k_off : k_off + self._kv_size].view(self._kv_shape)[:, self.keep - held :].copy_(past[0][0])
                row[v_off : v_off + self._kv_size].view(self._kv_shape)[:, self.keep - held :].copy_(past[1][0])

    @torch.inference_mode()
    def decode(self, slots: list[int], codes: np.ndarray) -> Tensor:
        """codes [B, n, 16] (host integers) for slots[0..B) -> float32 waveforms [B, n*1920], each continuing its
        slot's stream.  Queued on the current stream; the result is not waited for."""
        dec = self.decoder
        nq = dec.cfg.num_quantizers
        b = len(slots)
        if codes.ndim != 3 or codes.shape[0] != b or codes.shape[2] != nq or len(set(slots)) != b:
            raise ValueError(f"codec slots expect codes [{b}, frames, {nq}] for {b} distinct slots, "
                             f"got {tuple(codes.shape)} for slots {slots}")  # fmt: skip
        n = codes.shape[1]
        if n == 0 or b == 0:
            return torch.zeros(b, 0, dtype=torch.float32, device=dec.device)
        # One host-to-device copy carries the codes, the rows to read and write, and their positions.  The batch is
        # padded to a power of two with copies of row 0 whose state goes to the spare row: a (batch, frames) shape's
        # first call costs ~200 ms more than the next (cuDNN's per-shape setup, allocations; H200, run 29: codec
        # 250-470 ms in a first wave of arrivals, ~40 ms when the same load came again), so calls keep to a few
        # shapes, which warm_up() meets (and captures) before the first request.
        padded = padded_rows(b)
        host = np.empty((padded, n * nq + 3), dtype=np.int64)
        host[:b, :-3] = codes.reshape(b, -1)
        host[:b, -3] = slots  # the rows read
        host[:b, -2] = slots  # the rows written
        host[:b, -1] = [self.frames[s] for s in slots]
        host[b:] = host[0]
        host[b:, -2] = self._spare
        packed = torch.from_numpy(host)
        if dec.device.type == "cuda":
            packed = packed.pin_memory()  # so the copy does not wait for the host, nor the host for the GPU
        graph = self._graphs.get((padded, n))
        if graph is not None:
            graph.packed.copy_(packed, non_blocking=True)
            graph.cuda_graph.replay()
            wav = graph.wav[:b].clone()  # the graph's output is overwritten by its next replay
        else:
            wav = self._run(packed.to(dec.device, non_blocking=True), n)[:b]
        for s in slots:
            self.frames[s] += n
        return wav

    def _run(self, packed: Tensor, n: int) -> Tensor:
        """One call on device inputs (decode's packed rows): every row's waveform, its state written last, so that
        a call which raises changes no slot.  What a captured call replays."""
        dec = self.decoder
        nq = dec.cfg.num_quantizers
        read, write, first = packed[:, -3], packed[:, -2], packed[:, -1]
        rows = _SlotRows(self, self.state.index_select(0, read))
        x = dec.pre_conv(dec._dequantize(packed[:, :-3].unflatten(1, (n, nq))), rows)
        x = self._transformer(x.transpose(1, 2), rows, first).transpose(1, 2)
        wav = dec._upsample_and_vocode(x, rows)[:, 0].float()
        self.state.index_copy_(0, write, rows.data)
        return wav

    @torch.inference_mode()
    def warm_up(self, frames: Iterable[int], most_rows: int, capture: bool = False) -> int:
        """Decode zeros once at every padded batch size up to most_rows and every group length in `frames`, on
        slots opened for it and closed again, so a request's first call at those shapes is not the first there;
        with `capture` (CUDA only) also capture each shape's call, which later calls replay.  Returns the number
        of shapes."""
        shapes = 0
        for rows in sorted({padded_rows(b) for b in range(1, most_rows + 1)}):
            # As few streams as make `rows` (a call pads them to it), so no more slots open than calls can use.
            ids = [self.open() for _ in range(min(rows, most_rows))]
            try:
                for n in sorted(set(frames)):
                    self.decode(ids, np.zeros((len(ids), n, self.decoder.cfg.num_quantizers), dtype=np.int64))
                    if capture:
                        self._capture(rows, n)
                    shapes += 1
            finally:
                for slot in ids:
                    self.close(slot)
        return shapes

    def _capture(self, rows: int, n: int) -> None:
        """Capture the call for `rows` padded rows of n frames (after an eager call at that shape: cuDNN and the
        allocator have met it).  The calls share one memory pool: they run one after another on one stream."""
        dec = self.decoder
        if dec.device.type != "cuda" or (rows, n) in self._graphs:
            return
        packed = torch.zeros((rows, n * dec.cfg.num_quantizers + 3), dtype=torch.int64, device=dec.device)
        packed[:, -3:-1] = self._spare  # any valid row: a capture launches nothing
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the scheduler's and request threads' CUDA calls are theirs, not this capture's.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            wav = self._run(packed, n)
        self._graphs[(rows, n)] = _CodecGraph(graph, packed, wav)

    def _transformer(self, x: Tensor, rows: "_SlotRows", first: Tensor) -> Tensor:
        """x [B, n, latent], row r's frames at positions first[r].. : each row attends to its own cached window."""
        dec, cfg = self.decoder, self.decoder.cfg
        b, n = x.shape[:2]
        pos = first[:, None] + torch.arange(n, device=first.device)  # [B, n]
        cos, sin = rope_tables(pos.flatten(), cfg.head_dim, cfg.rope_theta, dec.dtype)
        cos, sin = cos.view(b, 1, n, -1), sin.view(b, 1, n, -1)
        # Key j of a row is at position first - keep + j; the query at q sees it iff q - window < k <= q, and only
        # if the stream has been there (k >= 0: the zeros before a young stream's start are not keys).
        kpos = (first[:, None] - self.keep + torch.arange(self.keep + n, device=first.device))[:, None, :]
        q = pos[:, :, None]
        mask = ((kpos <= q) & (kpos > q - cfg.sliding_window) & (kpos >= 0))[:, None]  # [B, 1, n, keep + n]
        h = F.linear(x, dec.in_proj, dec.in_proj_b)
        for i, layer in enumerate(dec.layers):
            past = rows.kv(i)
            h, (k, v) = layer(h, cos, sin, mask, past)
            past[0].copy_(k[:, :, n:])
            past[1].copy_(v[:, :, n:])
        h = rms_norm(h, dec.final_norm, cfg.rms_norm_eps)
        return F.linear(h, dec.out_proj, dec.out_proj_b)


@dataclass
class _CodecGraph:
    """One captured CodecSlots call: its input buffer (decode's packed rows), the graph, its output waveforms."""

    cuda_graph: torch.cuda.CUDAGraph
    packed: Tensor
    wav: Tensor


def padded_rows(b: int) -> int:
    """The batch a CodecSlots call of b streams runs at: the next power of two."""
    return 1 << max(b - 1, 0).bit_length()


class _SlotRows:
    """The gathered rows [B, width] of one CodecSlots.decode call: what the layers see in place of a CodecStream."""

    def __init__(self, slots: CodecSlots, data: Tensor) -> None:
        self.slots, self.data = slots, data

    def _left_context(self, layer: object, x: Tensor, keep: int) -> Tensor:
        """CodecStream._left_context for B rows: prepend each row's context, then overwrite it with the new one."""
        if keep == 0:
            return x
        off, channels, _ = self.slots._convs[layer]
        tail = self.data[:, off : off + channels * keep].unflatten(1, (channels, keep))
        x = torch.cat([tail, x], dim=-1)
        tail.copy_(x[..., x.shape[-1] - keep :])
        return x

    def kv(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer i's cached keys and values, views [B, kv_heads, keep, head_dim] into the rows."""
        k_off, v_off = self.slots._kv[i]
        size, shape = self.slots._kv_size, self.slots._kv_shape
        return (self.data[:, k_off : k_off + size].unflatten(1, shape),
                self.data[:, v_off : v_off + size].unflatten(1, shape))  # fmt: skip


def int16_samples(wave: torch.Tensor) -> torch.Tensor:
    """Float waveform in [-1, 1] -> int16 samples, on the waveform's device."""
    return (wave.float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)


def samples_to_pcm(samples: torch.Tensor, stream: torch.cuda.Stream | None = None) -> bytes:
    """int16 samples -> s16le bytes; on a GPU the copy waits for `stream` only (the codec's)."""
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        return samples.cpu().numpy().astype("<i2").tobytes()
