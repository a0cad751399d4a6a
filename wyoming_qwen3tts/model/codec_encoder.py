"""The 12 Hz codec's encoder (a Mimi encoder): 24 kHz mono audio -> codes [frames, 16], 1920 samples per frame.

Voice cloning in context feeds the Talker the codes of the reference clip (prompt.py). Read top to bottom:

  SEANet: causal conv k=7 -> per stage (strides 4, 5, 6, 8): residual block (ELU, conv k=3, ELU, conv k=1, plus the
          input), ELU, strided conv doubling the channels -> ELU, conv k=3 to the hidden size        (25 frames/s)
  transformer: 8 pre-LayerNorm layers, causal attention with RoPE, GELU MLP, each branch times a LayerScale
  downsample: causal conv k=4, stride 2, padded by repeating the edge sample                       (12.5 frames/s)
  split residual quantizer: codebook 0 ("semantic") quantizes its own projection of the frame; codebooks 1..15
          ("acoustic") quantize another projection residually, each the nearest entry to what is left.

Causal convs pad k - stride samples (times the dilation) on the left and, on the right, just enough zeros to make
whole output frames, as the reference does. The nearest entry is found with the same cdist + argmin the reference
uses, so float32 codes match it exactly. Runs once per voice, always in float32, over the whole clip at once.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .config import CodecEncoderConfig
from .layers import rope_tables, rotate_half
from .weights import NamedWeights

_PREFIX = "encoder."


# --------------------------------------------------------------------------------------------------------------------
# Layers (plain tensors + functional ops)
# --------------------------------------------------------------------------------------------------------------------


class _CausalConv:
    """Conv1d that sees only the past: (k-1)*dilation + 1 - stride samples of left padding (zeros, or copies of the
    first sample), and zeros on the right up to a whole number of strides."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, stride: int = 1, dilation: int = 1, pad_mode: str = "constant"
    ) -> None:
        self.weight, self.bias, self.stride, self.dilation, self.pad_mode = weight, bias, stride, dilation, pad_mode
        span = (weight.shape[-1] - 1) * dilation + 1 if weight.ndim == 3 else 1  # ndim != 3: a missing tensor
        self.left = span - stride

    def __call__(self, x: Tensor) -> Tensor:
        right = -x.shape[-1] % self.stride
        x = F.pad(x, (self.left, right), mode=self.pad_mode)
        return F.conv1d(x, self.weight, self.bias, stride=self.stride, dilation=self.dilation)


def _conv(w: NamedWeights, name: str, cout: int, cin: int, k: int, stride: int = 1, dilation: int = 1) -> _CausalConv:
    return _CausalConv(w(name + ".conv.weight", (cout, cin, k)), w(name + ".conv.bias", (cout,)), stride, dilation)


class _ResidualBlock:
    """ELU -> causal conv (k=3, dilated) halving the channels -> ELU -> conv k=1 restoring them, plus the input."""

    def __init__(self, w: NamedWeights, p: str, dim: int, dilation: int, cfg: CodecEncoderConfig) -> None:
        hidden = dim // cfg.compress
        self.conv1 = _conv(w, p + "block.1", hidden, dim, cfg.residual_kernel_size, dilation=dilation)
        self.conv2 = _conv(w, p + "block.3", dim, hidden, 1)
        self.shortcut = _conv(w, p + "shortcut", dim, dim, 1) if cfg.use_conv_shortcut else None

    def __call__(self, x: Tensor) -> Tensor:
        h = self.conv2(F.elu(self.conv1(F.elu(x))))
        return (self.shortcut(x) if self.shortcut is not None else x) + h


class _TransformerLayer:
    """LayerNorm -> causal self-attention (RoPE, no q/k norm) -> *LayerScale, plus the input; LayerNorm -> Linear ->
    exact GELU -> Linear -> *LayerScale, plus the input."""

    def __init__(self, w: NamedWeights, i: int, cfg: CodecEncoderConfig) -> None:
        p = f"encoder_transformer.layers.{i}."
        d, h, kvh, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim, self.eps, self.dim = h, kvh, hd, cfg.norm_eps, d
        self.norm1 = (w(p + "input_layernorm.weight", (d,)), w(p + "input_layernorm.bias", (d,)))
        self.norm2 = (w(p + "post_attention_layernorm.weight", (d,)), w(p + "post_attention_layernorm.bias", (d,)))
        shapes = {"q": (h * hd, d), "k": (kvh * hd, d), "v": (kvh * hd, d), "o": (d, h * hd)}
        self.proj = {
            n: (
                w(p + f"self_attn.{n}_proj.weight", shape),
                w(p + f"self_attn.{n}_proj.bias", shape[:1]) if cfg.attention_bias else None,
            )
            for n, shape in shapes.items()
        }
        self.attn_scale = w(p + "self_attn_layer_scale.scale", (d,))
        self.fc1 = w(p + "mlp.fc1.weight", (cfg.intermediate_size, d))
        self.fc2 = w(p + "mlp.fc2.weight", (d, cfg.intermediate_size))
        self.mlp_scale = w(p + "mlp_layer_scale.scale", (d,))

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        h = F.layer_norm(x, (self.dim,), *self.norm1, eps=self.eps)

        def heads(name: str, n: int) -> Tensor:
            return F.linear(h, *self.proj[name]).view(b, t, n, self.head_dim).transpose(1, 2)

        q, k, v = heads("q", self.n_heads), heads("k", self.n_kv_heads), heads("v", self.n_kv_heads)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.n_heads != self.n_kv_heads:
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_scale * F.linear(o.transpose(1, 2).reshape(b, t, -1), *self.proj["o"])
        h = F.layer_norm(x, (self.dim,), *self.norm2, eps=self.eps)
        return x + self.mlp_scale * F.linear(F.gelu(F.linear(h, self.fc1)), self.fc2)


class _ResidualQuantizer:
    """A projection of the frames, then codebooks that each take the nearest entry to what the previous ones left."""

    def __init__(self, w: NamedWeights, p: str, count: int, cfg: CodecEncoderConfig) -> None:
        vq = cfg.vector_quantization_hidden_dimension
        has_proj = vq != cfg.hidden_size
        self.in_proj = w(p + "input_proj.weight", (vq, cfg.hidden_size, 1)) if has_proj else None
        self.codebooks = []
        for i in range(count):
            total = w(p + f"layers.{i}.codebook.embed_sum", (cfg.codebook_size, cfg.codebook_dim))
            usage = w(p + f"layers.{i}.codebook.cluster_usage", (cfg.codebook_size,))
            self.codebooks.append(total / usage.clamp(min=1e-5)[:, None])  # the running mean of each entry

    def __call__(self, frames: Tensor) -> Tensor:
        """frames [1, hidden, T] -> codes [count, T]."""
        residual = F.conv1d(frames, self.in_proj) if self.in_proj is not None else frames
        residual = residual[0].transpose(0, 1)  # [T, dim]
        codes = []
        for book in self.codebooks:
            nearest = torch.cdist(residual[None].float(), book[None].float(), p=2)[0].argmin(dim=-1)
            codes.append(nearest)
            residual = residual - F.embedding(nearest, book)
        return torch.stack(codes)


# --------------------------------------------------------------------------------------------------------------------
# The encoder
# --------------------------------------------------------------------------------------------------------------------


class CodecEncoder:
    """Qwen3-TTS-Tokenizer-12Hz encoder (inference only, float32). Build with `from_tensors`."""

    def __init__(self, cfg: CodecEncoderConfig, w: NamedWeights) -> None:
        self.cfg = cfg
        self.device = w.device
        p = "encoder.layers."
        nf = cfg.num_filters
        self.convs: list[_CausalConv | _ResidualBlock | None] = [
            _conv(w, p + "0", nf, cfg.audio_channels, cfg.kernel_size)
        ]
        # The module list of the checkpoint interleaves ELUs (no weights) with the convs; None stands for an ELU so
        # that indices here are the indices in the tensor names.
        dim = nf
        for ratio in reversed(cfg.upsampling_ratios):
            for j in range(cfg.num_residual_layers):
                self.convs.append(_ResidualBlock(w, f"{p}{len(self.convs)}.", dim, cfg.dilation_growth_rate**j, cfg))
            self.convs.append(None)
            self.convs.append(_conv(w, f"{p}{len(self.convs)}", 2 * dim, dim, 2 * ratio, stride=ratio))
            dim *= 2
        self.convs.append(None)
        self.convs.append(_conv(w, f"{p}{len(self.convs)}", cfg.hidden_size, dim, cfg.last_kernel_size))

        self.layers = [_TransformerLayer(w, i, cfg) for i in range(cfg.num_hidden_layers)]
        d = cfg.hidden_size
        self.downsample = _CausalConv(
            w("downsample.conv.weight", (d, d, cfg.downsample_kernel)),
            None,
            stride=cfg.downsample_stride,
            pad_mode="replicate",
        )
        q = "quantizer."
        n_sem = cfg.num_semantic_quantizers
        self.semantic = _ResidualQuantizer(w, q + "semantic_residual_vector_quantizer.", n_sem, cfg)
        # Only the codebooks kept per frame; later ones never change earlier codes.
        self.acoustic = _ResidualQuantizer(
            w, q + "acoustic_residual_vector_quantizer.", cfg.valid_quantizers - n_sem, cfg
        )

    @classmethod
    def from_tensors(
        cls, cfg: CodecEncoderConfig, tensors: dict[str, Tensor], *, device: str | torch.device = "cpu"
    ) -> CodecEncoder:
        """Build from `encoder.*` tensors of speech_tokenizer/model.safetensors (original key names). Raises
        ModelLoadError naming every missing or misshapen tensor."""
        w = NamedWeights(tensors, torch.float32, torch.device(device), prefix=_PREFIX, what="codec encoder")
        encoder = cls(cfg, w)
        w.check()
        return encoder

    @torch.inference_mode()
    def encode(self, wav: Tensor | np.ndarray) -> Tensor:
        """A mono clip at 24 kHz [n] -> codes [ceil(n / 1920), 16] (int64, on the CPU)."""
        x = torch.as_tensor(np.asarray(wav, dtype=np.float32) if isinstance(wav, np.ndarray) else wav)
        n = x.shape[-1]
        x = x.to(device=self.device, dtype=torch.float32).reshape(1, 1, n)
        for conv in self.convs:
            x = F.elu(x) if conv is None else conv(x)
        h = x.transpose(1, 2)  # [1, T, hidden]
        cos, sin = rope_tables(
            torch.arange(h.shape[1], device=self.device), self.cfg.head_dim, self.cfg.rope_theta, h.dtype
        )
        for layer in self.layers:
            h = layer(h, cos, sin)
        frames = self.downsample(h.transpose(1, 2))  # [1, hidden, T / 2]
        codes = torch.cat([self.semantic(frames), self.acoustic(frames)])  # [16, frames]
        return codes[:, : -(-n // self.cfg.samples_per_frame)].transpose(0, 1).cpu()
